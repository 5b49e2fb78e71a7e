"""Sampling seeds of one local-engine step: an example that appears twice in a step (a step across an epoch
boundary, ``n_data % prompts_per_step != 0``) gets two different groups; seeds stay a function of (seed, step).

The engine runs for real on the tiny random model and one tool-world task, so every step holds that task
twice; a reward function that records what it scores (around the real verifiable reward) shows the samples.
"""

from __future__ import annotations

import pytest
import torch

from envace.core.prompts import ChatFormatter
from envace.core.records import Role
from envace.data.specs import episode_spec_from_task
from envace.engines import get_engine
from envace.engines.local import (
    LocalEngineConfig,
    OptimConfig,
    RolloutConfig,
    step_examples,
)
from envace.engines.local.sft import gold_guide
from envace.envs.toolworld import ToolWorldEnv
from envace.envs.toolworld.reward import toolworld_verifiable_reward
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)

TINY = ModelSpec(kind="tiny", seed=3)
CFG = LocalEngineConfig(
    model=TINY,
    steps=1,
    prompts_per_step=2,
    seed=5,
    progress=False,
    rollout=RolloutConfig(
        samples_per_prompt=1, max_steps_per_turn=1, max_act_tokens=80, max_rehearse_tokens=48, max_stream_tokens=2048
    ),
    optim=OptimConfig(lr=1e-3),
)


def test_step_names_tell_repeated_examples_apart_and_replay_on_resume() -> None:
    from envace.engines.local.engine import step_names

    indices = step_examples(1, 3, 2, seed=0)  # positions 2, 3: the last of epoch 0 and the first of epoch 1
    names = step_names([4, 4, 1])
    assert names == ["4@0", "4@1", "1@2"] and len(set(names)) == 3
    assert step_names(indices) == step_names(step_examples(1, 3, 2, seed=0))  # a resumed run: the same names


@pytest.fixture(scope="module")
def one_task():
    env = ToolWorldEnv()
    task = next(t for t in env.tasks("train") if len(t.user_turns) == 1 and len(t.gold_calls[0]) == 1)
    return env, task


def _scored(env, task, **engine_kwargs) -> list[tuple]:
    """ACT tokens of every trajectory one engine step scores (the data: ``task`` alone, twice a step)."""
    seen: list[tuple] = []

    def recording_reward(spec, traj):
        seen.append(tuple(tok for role, seg in traj.outputs() if role is Role.ACT for tok in seg.token_ids))
        return toolworld_verifiable_reward(spec, traj)

    spec = episode_spec_from_task(task, env.make_executor(task))
    get_engine("local", reward_fn=recording_reward, **engine_kwargs).train(CFG, [spec])
    return seen


def test_same_example_twice_in_one_step_samples_different_groups(one_task) -> None:
    env, task = one_task
    assert step_examples(0, 1, 2, seed=CFG.seed) == [0, 0]
    first, second = _scored(env, task)
    assert first and second and first != second  # keyed by the example alone, both groups were identical
    assert _scored(env, task) == [first, second]  # and still a function of (seed, step)


def test_a_guide_is_still_looked_up_by_data_index(one_task) -> None:
    env, task = one_task
    spec = episode_spec_from_task(task, env.make_executor(task))
    _, tokenizer = load_model_and_tokenizer(TINY)
    fmt = ChatFormatter(tokenizer)
    forced = gold_guide({0: spec}, fmt)  # keyed by data index, forcing gold outputs
    first, second = _scored(env, task, guide=forced)
    assert first == second and first  # both groups replay the gold outputs of example 0
    assert "<tool_call>" in fmt.decode(list(first))
