"""Local engine on the tiny model and the tool world: every variant trains the right roles; exact resume.

A random tiny model never emits a parseable tool call, so rollouts are steered toward the gold outputs
with a finite logit bonus (``gold_guide(strength=...)``, stronger for ACT so that REHEARSE runs, weaker
for REHEARSE so that its outputs differ): outputs are mostly well-formed, with random deviations that
make rewards differ. (Runs are deterministic; the strengths were chosen so that both roles get spread.) The
reward adds a deterministic per-trajectory term so that both roles' baselines see spread, and one sample per
step is a judge failure (excluded and counted).
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import replace

import pytest
import torch

from envace.core.records import TrajectoryStatus
from envace.core.reward import RewardOutcome
from envace.data.specs import executor_factory_for
from envace.engines import get_engine
from envace.engines.local import (
    LocalEngineConfig,
    OptimConfig,
    RolloutConfig,
)
from envace.engines.local.checkpoint import load_latest
from envace.envs.toolworld.reward import toolworld_verifiable_reward
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime import precision as precision_probe

torch.set_num_threads(1)

TINY = ModelSpec(kind="tiny", seed=3)
BASE = LocalEngineConfig(
    model=TINY,
    steps=2,
    prompts_per_step=2,
    seed=5,
    progress=False,
    rollout=RolloutConfig(samples_per_prompt=3, max_act_tokens=80, max_rehearse_tokens=72, max_stream_tokens=2048),
    optim=OptimConfig(lr=1e-3, track_role_grad_norms=True, micro_batch_streams=8),
)


def varied_reward(spec, traj):
    """Verifiable reward plus a per-trajectory term; sample 2 of each prompt is a judge failure."""
    if traj.sample_index == 2:
        return RewardOutcome(0.0, TrajectoryStatus.JUDGE_FAILED, {"why": "test"})
    text = "".join(seg.text for _, seg in traj.outputs())
    jitter = (zlib.crc32(text.encode()) % 11) / 10
    return RewardOutcome(0.5 * toolworld_verifiable_reward(spec, traj).reward + 0.5 * jitter, TrajectoryStatus.OK, {})


@pytest.fixture(scope="module")
def world(guided_world):
    initial, _ = load_model_and_tokenizer(TINY)
    return {**guided_world, "initial": initial.state_dict()}


def _train(world, variant, **overrides):
    engine = get_engine(
        "local",
        reward_fn=varied_reward,
        guide=world["guide"],
        executor_factory=executor_factory_for(world["env"].make_executor, world["tasks"]),
    )
    history = []
    result = engine.train(
        replace(BASE, variant=variant, **overrides), world["specs"], callbacks=[lambda step, m: history.append(m)]
    )
    return result, history


def _changed(model, initial) -> bool:
    return any(not torch.equal(p, initial[name]) for name, p in model.state_dict().items())


def _total(history, key) -> float:
    return sum(m.get(key, 0.0) for m in history)


@pytest.fixture(scope="module")
def runs(world):
    return {v: _train(world, v) for v in ("envace", "grpo", "per_role", "frozen_act", "frozen_rehearse")}


def test_envace_trains_both_roles(world, runs):
    result, history = runs["envace"]
    assert result.steps_done == 2 and len(history) == 2
    assert _changed(result.models["policy"], world["initial"])
    assert _total(history, "grad_norm/act") > 0 and _total(history, "grad_norm/rehearse") > 0
    assert _total(history, "tokens_in_loss/act") > 0 and _total(history, "tokens_in_loss/rehearse") > 0
    assert _total(history, "judge_failures") == 2 * 2  # one per prompt per step, excluded and counted
    for key in (
        "reward/mean",
        "reward/std",
        "adv/act/abs_mean",
        "parse_fail/act",
        "parse_fail/rehearse",
        "tokens/act",
        "tokens/rehearse",
        "kl",
        "loss",
        "pg_loss",
        "clipfrac",
        "grad_norm",
        "tokens_per_s",
    ):
        assert key in history[-1], key


@pytest.mark.parametrize("variant", ["grpo", "frozen_rehearse"])
def test_act_only_variants(world, runs, variant):
    result, history = runs[variant]
    assert _changed(result.models["policy"], world["initial"])
    assert _total(history, "grad_norm/act") > 0
    assert not any(
        k.endswith("/rehearse") and k.startswith(("grad_norm", "tokens_in_loss", "loss/")) for m in history for k in m
    )


def test_grpo_uses_real_executor(runs):
    _, history = runs["grpo"]
    assert _total(history, "tokens/rehearse") == 0 and _total(history, "outputs/rehearse") == 0


def test_real_environment_calls_and_judge_failures_are_running_totals(world, runs):
    """Sample efficiency: grpo counts every call its rollouts ran on the real executor, per step and as a
    running total; envace makes none (no SFT warm-up in these runs, so the totals start at 0)."""
    _, grpo = runs["grpo"]
    per_step = [m["real_env/calls"] for m in grpo]
    assert sum(per_step) > 0 and all(c == int(c) for c in per_step)
    assert [m["real_env/calls_total"] for m in grpo] == list(itertools.accumulate(per_step))
    assert [m["judge_failures_total"] for m in grpo] == list(itertools.accumulate(m["judge_failures"] for m in grpo))
    _, envace = runs["envace"]
    assert [m["real_env/calls"] for m in envace] == [0.0, 0.0] and envace[-1]["real_env/calls_total"] == 0.0
    assert envace[-1]["judge_failures_total"] == 2 * 2


def test_sft_warm_up_counts_the_real_responses_it_trains_on(world):
    """The SFT warm-up's gold responses are real-environment calls too: the running total starts there."""
    specs = world["specs"]
    gold = sum(len(step.calls) for spec in specs for turn in spec.gold for step in turn if step.responses is not None)
    assert gold > 0
    _, history = _train(world, "envace", steps=1, sft=replace(BASE.sft, epochs=1))
    rl = [m for m in history if "step" in m]
    assert rl[-1]["real_env/calls_total"] == gold  # envace adds no real call after the warm-up


def test_frozen_act_trains_rehearse_only(world, runs):
    result, history = runs["frozen_act"]
    assert _changed(result.models["policy"], world["initial"])
    assert _total(history, "grad_norm/rehearse") > 0
    assert not any(k in m for m in history for k in ("grad_norm/act", "tokens_in_loss/act", "loss/act"))


def test_per_role_trains_two_models_on_their_roles(world, runs):
    result, history = runs["per_role"]
    act, reh = result.models["act"], result.models["rehearse"]
    assert _changed(act, world["initial"]) and _changed(reh, world["initial"])
    assert _total(history, "act/grad_norm/act") > 0 and _total(history, "rehearse/grad_norm/rehearse") > 0
    assert not any(k in m for m in history for k in ("act/grad_norm/rehearse", "rehearse/grad_norm/act"))
    assert any(not torch.equal(a, b) for a, b in zip(act.parameters(), reh.parameters()))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_kill_and_resume_gives_identical_weights(world, tmp_path, precision):
    """Bit-exact in fp32; in bf16 too: autocast is deterministic on CPU and master weights, optimiser
    state and RNG are checkpointed in float32 (a resumed bf16 run equals an uninterrupted bf16 run,
    not an fp32 one)."""
    small = {
        "steps": 4,
        "prompts_per_step": 1,
        "checkpoint_every": 2,
        "precision": precision,
        "optim": replace(BASE.optim, track_role_grad_norms=False),
    }
    full, _ = _train(world, "envace", output_dir=str(tmp_path / "full"), **small)
    killed, _ = _train(world, "envace", output_dir=str(tmp_path / "resumed"), stop_after_steps=2, **small)
    assert killed.steps_done == 2
    resumed, history = _train(world, "envace", output_dir=str(tmp_path / "resumed"), **small)
    assert resumed.steps_done == 4 and [m["step"] for m in history] == [3.0, 4.0]
    a, b = full.models["policy"].state_dict(), resumed.models["policy"].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _changed(full.models["policy"], world["initial"])
    assert (tmp_path / "full" / "final" / "policy" / "config.json").is_file()


def _probe_answers(monkeypatch, *speedups):
    """A bf16 CPU whose model probe answers ``speedups`` in turn (then the last one again); returns
    the list the probe appends a call to."""
    calls = []

    def probe(model, threads):
        calls.append(threads)
        return speedups[min(len(calls), len(speedups)) - 1]

    monkeypatch.setattr(precision_probe, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(precision_probe, "model_bf16_speedup", probe)
    return calls


RESUMABLE = {
    "steps": 2,
    "prompts_per_step": 1,
    "checkpoint_every": 1,
    "precision": "auto",
    "optim": replace(BASE.optim, track_role_grad_norms=False),
}


def test_resume_reuses_the_first_process_precision(world, tmp_path, monkeypatch):
    """``auto`` is decided once per run: the first process probes (bf16 pays: 2x) and records bf16 in
    its checkpoint; the resumed process, whose probe would now say fp32 (1x), reuses bf16 unprobed."""
    calls = _probe_answers(monkeypatch, 2.0, 1.0)
    _, first = _train(world, "envace", output_dir=str(tmp_path), stop_after_steps=1, **RESUMABLE)
    _, resumed = _train(world, "envace", output_dir=str(tmp_path), **RESUMABLE)
    assert [m["step"] for m in first + resumed] == [1.0, 2.0]
    assert [m["engine/bf16"] for m in first + resumed] == [1.0, 1.0]
    assert len(calls) == 1  # the resumed process did not probe
    record = load_latest(tmp_path / "checkpoints").state["precision"]
    assert record["precision"] == "bf16" and record["requested"] == "auto" and record["bf16_supported"] is True
    assert record["cpu_model"] == precision_probe.cpu_model()


def test_resume_refuses_an_explicit_other_precision(world, tmp_path, monkeypatch):
    """A run decided bf16; resuming it with engine.precision=fp32 is refused, naming both and the fix."""
    _probe_answers(monkeypatch, 2.0)
    _train(world, "envace", output_dir=str(tmp_path), stop_after_steps=1, **RESUMABLE)
    with pytest.raises(ValueError, match=r"engine.precision=fp32 but .* trained at bf16.*engine.precision=bf16"):
        _train(world, "envace", output_dir=str(tmp_path), **{**RESUMABLE, "precision": "fp32"})
