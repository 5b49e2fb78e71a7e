"""SFT warm-up: gold trajectories of both roles replay to full reward; the loss is on targets and falls."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, ChatFormatter
from envace.core.records import Role
from envace.engines import (
    episode_spec_from_task,
    get_engine,
    toolworld_verifiable_reward,
)
from envace.engines.local import LocalEngineConfig, RolloutConfig, SFTConfig
from envace.engines.local.sft import gold_trajectories, sft_rows
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)

TINY = ModelSpec(kind="tiny", seed=1)
ROLLOUT = RolloutConfig(samples_per_prompt=2, max_act_tokens=24, max_rehearse_tokens=24, max_stream_tokens=2048)


@pytest.fixture(scope="module")
def specs():
    env = ToolWorldEnv()
    tasks = env.tasks("train")[:6]
    return [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]


def test_gold_trajectories_score_one_and_rows_cover_targets_only(specs):
    model, tokenizer = load_model_and_tokenizer(TINY)
    fmt = ChatFormatter(tokenizer)
    trajs = gold_trajectories(specs, model, fmt, ROLLOUT, DEFAULT_ROLE_PROMPTS)
    assert len(trajs) == len(specs)
    for spec, traj in zip(specs, trajs):
        assert toolworld_verifiable_reward(spec, traj).reward == pytest.approx(1.0)
    rows = sft_rows(trajs, [Role.ACT, Role.REHEARSE])
    n_target = sum(len(seg.token_ids) for t in trajs for _, seg in t.outputs())
    assert sum(r.n_tokens for r in rows) == n_target
    assert {int(x) for r in rows for x in r.roles} == {int(Role.ACT), int(Role.REHEARSE)}
    assert len(sft_rows(trajs, [Role.ACT])) == len(trajs)  # one ACT stream each, REHEARSE rows dropped


def test_sft_warmup_then_rl_in_one_call(specs):
    seen: list[dict] = []
    cfg = LocalEngineConfig(model=TINY, steps=1, prompts_per_step=2, progress=False, rollout=ROLLOUT,
                            sft=SFTConfig(epochs=4, lr=3e-3, batch_streams=4))
    result = get_engine("local").train(cfg, specs, callbacks=[lambda step, m: seen.append(m)])
    sft = [m for m in seen if "sft/loss" in m]
    assert len(sft) == 4 and sft[-1]["sft/loss"] < 0.8 * sft[0]["sft/loss"]
    assert sft[0]["sft/loss/act"] > 0 and sft[0]["sft/loss/rehearse"] > 0
    assert result.steps_done == 1 and "reward/mean" in result.history[-1]
    per_role = replace(cfg, variant="per_role", sft=replace(cfg.sft, epochs=1), steps=0)
    seen.clear()
    get_engine("local").train(per_role, specs[:2], callbacks=[lambda step, m: seen.append(m)])
    keys = {k for m in seen for k in m}
    assert "sft/loss/act/act" in keys and "sft/loss/rehearse/rehearse" in keys  # each model on its role
    assert "sft/loss/rehearse/act" not in keys
