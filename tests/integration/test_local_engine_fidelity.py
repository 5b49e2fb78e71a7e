"""Fidelity probes during local-engine training (tiny model, tool world): at the scheduled steps, in
[0, 1], without changing a single weight, and continuing at the right steps after a kill and resume."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from envace.data.specs import executor_factory_for
from envace.engines import get_engine
from envace.engines.local import LocalEngineConfig, OptimConfig, RolloutConfig
from envace.evaluation import ActLoopConfig, get_benchmark, oracle_probe_set
from envace.models import ModelSpec

torch.set_num_threads(1)

TINY = ModelSpec(kind="tiny", seed=3)
BASE = LocalEngineConfig(
    model=TINY,
    steps=4,
    prompts_per_step=1,
    seed=5,
    progress=False,
    rollout=RolloutConfig(samples_per_prompt=2, max_act_tokens=80, max_rehearse_tokens=48, max_stream_tokens=2048),
    optim=OptimConfig(lr=1e-3, micro_batch_streams=8),
)
FIDELITY = ("fidelity/exact_match", "fidelity/field_f1", "fidelity/error_agreement", "fidelity/parse_failure_rate")


@pytest.fixture(scope="module")
def world(guided_world):
    env = guided_world["env"]
    adapter = get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=6), env=env)
    return {**guided_world, "probe_set": oracle_probe_set(adapter, env.tasks("val")[:1])}


def _train(world, **overrides):
    engine = get_engine(
        "local",
        guide=world["guide"],
        fidelity_probe_set=world["probe_set"],
        executor_factory=executor_factory_for(world["env"].make_executor, world["tasks"]),
    )
    seen = []
    result = engine.train(
        replace(BASE, **overrides), world["specs"], callbacks=[lambda step, m: seen.append((step, m))]
    )
    return result, seen


def _probed(history):
    return [int(m["step"]) for m in history if "fidelity/exact_match" in m]


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("fidelity")
    plain, _ = _train(world, fidelity_every=0)
    probed, seen = _train(world, fidelity_every=3, output_dir=str(root / "full"))
    _train(world, fidelity_every=3, output_dir=str(root / "resumed"), stop_after_steps=2, checkpoint_every=1)
    resumed, resumed_seen = _train(world, fidelity_every=3, output_dir=str(root / "resumed"), checkpoint_every=1)
    return {"plain": plain, "probed": (probed, seen), "resumed": (resumed, resumed_seen)}


def test_probes_run_at_step_zero_every_k_and_at_the_last_step(world, runs):
    result, seen = runs["probed"]
    assert _probed(result.history) == [0, 3, 4]
    assert [step for step, _ in seen] == [0, 1, 2, 3, 4]  # the step-0 probe reaches the callbacks as step 0
    before = seen[0][1]
    totals = {"real_env/sft_calls", "real_env/calls_total", "judge_failures_total"}  # the running totals start at 0
    assert set(before) == {"step", *FIDELITY, "fidelity/n_calls", "time/fidelity", *totals} and before["step"] == 0.0
    for m in result.history:
        if "fidelity/exact_match" in m:
            assert all(0.0 <= m[k] <= 1.0 for k in FIDELITY)
            assert m["fidelity/n_calls"] == world["probe_set"].n_calls > 0
    assert not any("fidelity/exact_match" in m for m in runs["plain"].history)


def test_probing_leaves_training_bit_identical(runs):
    a, b = runs["plain"].models["policy"].state_dict(), runs["probed"][0].models["policy"].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rewards = [[m["reward/mean"] for m in r.history if m["step"] > 0] for r in (runs["plain"], runs["probed"][0])]
    assert rewards[0] == rewards[1]


def test_resume_keeps_the_whole_history_and_probes_at_the_same_steps(runs):
    full, _ = runs["probed"]
    resumed, seen = runs["resumed"]
    assert [step for step, _ in seen] == [3, 4]  # only the new steps reach the callbacks
    assert [m["step"] for m in resumed.history] == [m["step"] for m in full.history] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _probed(resumed.history) == [0, 3, 4]
    for a, b in zip(full.history, resumed.history):
        assert {k: a.get(k) for k in (*FIDELITY, "reward/mean")} == {k: b.get(k) for k in (*FIDELITY, "reward/mean")}
    x, y = full.models["policy"].state_dict(), resumed.models["policy"].state_dict()
    assert all(torch.equal(x[k], y[k]) for k in x)
