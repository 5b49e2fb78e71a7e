"""SFT warm-up: gold trajectories of both roles replay to full reward; the loss is on targets and falls."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, ChatFormatter
from envace.core.records import Role
from envace.data.specs import episode_spec_from_task
from envace.engines import get_engine
from envace.engines.local import LocalEngineConfig, RolloutConfig, SFTConfig
from envace.engines.local.sft import flawed, gold_trajectories, plant_answer_flaw, sft_rows
from envace.envs.toolworld import ToolWorldEnv
from envace.envs.toolworld.reward import toolworld_verifiable_reward
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


def test_gold_replay_a_few_specs_at_a_time_builds_the_same_rows(specs):
    """Replaying the specs in parts (which bounds the KV caches) gives the streams and training rows of one
    batch over all of them, in the same order."""
    model, tokenizer = load_model_and_tokenizer(TINY)
    fmt = ChatFormatter(tokenizer)
    got = {n: gold_trajectories(specs, model, fmt, ROLLOUT, DEFAULT_ROLE_PROMPTS, replay_specs=n) for n in (1, 4, 6)}
    streams = {n: [[s.flat()["input_ids"] for s in t.streams] for t in trajs] for n, trajs in got.items()}
    assert len(streams[6]) == len(specs)
    assert streams[1] == streams[6] and streams[4] == streams[6]
    rows = {n: sft_rows(trajs, [Role.ACT, Role.REHEARSE]) for n, trajs in got.items()}

    def fields(row):
        return [row.input_ids.tolist(), row.positions.tolist(), row.targets.tolist(), row.roles.tolist()]

    for n in (1, 4):
        assert [fields(r) for r in rows[n]] == [fields(r) for r in rows[6]]


def test_gold_replay_in_one_forward_builds_the_same_streams(specs):
    """The replaying guide (each forced output fed in one forward) yields token-for-token the streams of
    token-by-token teacher forcing, with far fewer forwards."""
    from envace.engines.local.rollout import RolloutRunner
    from envace.engines.local.rollout_records import ResponseSource
    from envace.engines.local.sft import gold_guide

    model, tokenizer = load_model_and_tokenizer(TINY)
    fmt = ChatFormatter(tokenizer)
    forced = replace(
        ROLLOUT,
        samples_per_prompt=1,
        max_act_tokens=512,
        max_rehearse_tokens=512,
        max_steps_per_turn=6,
        max_stream_tokens=1 << 30,
    )
    batches = {}
    for replay in (False, True):
        runner = RolloutRunner(
            fmt, forced, DEFAULT_ROLE_PROMPTS, guide=gold_guide(dict(enumerate(specs)), fmt, replay=replay)
        )
        batches[replay] = runner.run(specs, model, ResponseSource(model=model))
    streams = {k: [[s.flat()["input_ids"] for s in t.streams] for t in b.trajectories] for k, b in batches.items()}
    assert streams[True] == streams[False]
    assert batches[True].forwards * 5 < batches[False].forwards


def test_sft_warmup_then_rl_in_one_call(specs):
    seen: list[dict] = []
    cfg = LocalEngineConfig(
        model=TINY,
        steps=1,
        prompts_per_step=2,
        progress=False,
        rollout=ROLLOUT,
        sft=SFTConfig(epochs=4, lr=3e-3, batch_streams=4),
    )
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


class Interrupted(Exception):
    pass


def test_an_interrupted_sft_warmup_resumes_after_its_last_epoch_with_identical_weights(specs, tmp_path):
    """per_role warms up two models in turn: interrupted after the second model's first epoch (its
    checkpoint written), a re-run skips the first model's epochs and continues the second's."""
    cfg = LocalEngineConfig(
        model=TINY,
        variant="per_role",
        steps=1,
        prompts_per_step=2,
        progress=False,
        rollout=ROLLOUT,
        sft=SFTConfig(epochs=2, lr=3e-3, batch_streams=4),
        checkpoint_every=1,
    )
    full = get_engine("local").train(replace(cfg, output_dir=str(tmp_path / "full")), specs[:3])

    def stop_after_first_rehearse_epoch(step, metrics):
        if metrics.get("sft/epoch/rehearse") == 0.0:
            raise Interrupted

    resumed_dir = str(tmp_path / "resumed")
    with pytest.raises(Interrupted):
        get_engine("local").train(
            replace(cfg, output_dir=resumed_dir), specs[:3], callbacks=[stop_after_first_rehearse_epoch]
        )
    seen: list[dict] = []
    resumed = get_engine("local").train(
        replace(cfg, output_dir=resumed_dir), specs[:3], callbacks=[lambda step, m: seen.append(m)]
    )
    assert [m["sft/epoch/rehearse"] for m in seen if "sft/epoch/rehearse" in m] == [1.0]  # only what was left
    assert not any("sft/epoch/act" in m for m in seen)
    assert [h.get("sft/epoch/act", h.get("sft/epoch/rehearse")) for h in resumed.history[:4]] == [0.0, 1.0, 0.0, 1.0]
    for name in ("act", "rehearse"):
        a, b = full.models[name].state_dict(), resumed.models[name].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert not (tmp_path / "resumed" / "checkpoints" / "sft").exists()  # the GRPO checkpoint superseded it
    assert set(full.baseline) == set(resumed.baseline) == {"act", "rehearse"}  # each model's warmed-up weights


def _one_epoch_then_one_step(**overrides) -> LocalEngineConfig:
    """One SFT epoch on the tiny model, then one GRPO step over 2 prompts."""
    return LocalEngineConfig(
        model=TINY,
        steps=1,
        prompts_per_step=2,
        progress=False,
        rollout=ROLLOUT,
        sft=SFTConfig(epochs=1, lr=3e-3, batch_streams=4),
        **overrides,
    )


def test_the_warmed_up_weights_are_exported_as_the_runs_baseline(specs, tmp_path):
    """With an output_dir, the weights right after the SFT warm-up are saved as HF directories
    (``TrainResult.baseline``: what evaluation compares the trained model with); without a warm-up
    there is no baseline."""
    cfg = _one_epoch_then_one_step(precision="fp32", output_dir=str(tmp_path / "run"))
    result = get_engine("local").train(cfg, specs[:2])
    assert set(result.baseline) == {"policy"}
    exported, _ = load_model_and_tokenizer(ModelSpec(kind="path", path=result.baseline["policy"]))
    warmed = get_engine("local").train(replace(cfg, steps=0, output_dir=None), specs[:2]).models["policy"]
    a, b = exported.state_dict(), warmed.state_dict()
    assert all(torch.equal(a[k], b[k].to(a[k].dtype)) for k in a)
    no_sft = replace(cfg, sft=replace(cfg.sft, epochs=0), output_dir=str(tmp_path / "plain"))
    assert get_engine("local").train(no_sft, specs[:2]).baseline == {}


def test_the_warmup_frees_the_replays_bf16_copy_without_changing_the_run(specs, monkeypatch):
    """After the gold replay the bf16 decoding copy's weights are released (its ~270 MB for SmolLM2 would
    otherwise sit under every SFT epoch's peak); the next rollout casts them again, so a warm-up plus
    an RL step ends on exactly the weights of a run that keeps the copy."""
    import envace.engines.local.sft as sft_module
    from envace.runtime import precision

    cfg = _one_epoch_then_one_step(precision="bf16")
    released: list[int] = []
    real = sft_module.release_inference_copy

    def spy(model):
        real(model)
        released.append(sum(p.numel() for p in precision._SHADOWS[model][1].parameters()))

    monkeypatch.setattr(sft_module, "release_inference_copy", spy)
    freed = get_engine("local").train(cfg, specs[:2]).models["policy"].state_dict()
    assert released == [0]  # called once, after the replay, and the copy held no weights afterwards
    monkeypatch.setattr(sft_module, "release_inference_copy", lambda model: None)
    kept = get_engine("local").train(cfg, specs[:2]).models["policy"].state_dict()
    assert freed.keys() == kept.keys() and all(torch.equal(freed[k], kept[k]) for k in freed)


def test_planted_flaw_replaces_the_replies_of_the_chosen_tasks_only(specs):
    """The planted demonstrator flaw (issue 46's positive control) changes the gold replies of a rate's share
    of its domains' tasks, chosen by task id (the same every call), and nothing else; the flawed gold
    trajectory still replays to a final reply but fails the unchanged task's reward where values are due."""
    domain = specs[0].domain
    cfg = SFTConfig(flaw_domains=(domain,), flaw_rate=1.0, flaw_answer="Done.")
    out, hits = plant_answer_flaw(specs, cfg)
    assert hits == sum(s.domain == domain for s in specs) >= 1
    for before, after in zip(specs, out):
        if before.domain == domain:
            assert after.gold_answers == ("Done.",) * len(before.user_turns)
            assert (after.gold, after.answer_values, after.user_turns) == (
                before.gold,
                before.answer_values,
                before.user_turns,
            )
        else:
            assert after == before
    half = SFTConfig(flaw_domains=tuple({s.domain for s in specs}), flaw_rate=0.5)
    picked = [a.gold_answers != b.gold_answers for a, b in zip(plant_answer_flaw(specs, half)[0], specs)]
    assert picked == [a.gold_answers != b.gold_answers for a, b in zip(plant_answer_flaw(specs, half)[0], specs)]
    assert picked == [flawed(s.task_id, 0.5) for s in specs]
    assert plant_answer_flaw(specs, SFTConfig()) == (list(specs), 0)

    model, tokenizer = load_model_and_tokenizer(TINY)
    fmt = ChatFormatter(tokenizer)
    hit = [a for a, b in zip(out, specs) if a is not b]
    trajs = gold_trajectories(hit, model, fmt, ROLLOUT, DEFAULT_ROLE_PROMPTS)
    assert len(trajs) == len(hit)
    due = [s for s in hit if any(s.answer_values)]
    assert due, "the test's tasks should have values to report"
    for spec, traj in zip(hit, trajs):
        if spec in due:
            assert toolworld_verifiable_reward(spec, traj).reward < 1.0


def test_a_planted_flaw_must_name_a_domain_the_tasks_have(specs):
    with pytest.raises(ValueError, match="no flaw_domains"):
        SFTConfig(flaw_rate=0.5)
    with pytest.raises(ValueError, match=r"flaw_rate=1.5"):
        SFTConfig(flaw_domains=("shop",), flaw_rate=1.5)
    with pytest.raises(ValueError, match="which no SFT task has"):
        plant_answer_flaw(specs, SFTConfig(flaw_domains=("atlantis",), flaw_rate=0.5))
