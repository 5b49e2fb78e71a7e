"""The task-success probe during local-engine training (tiny model, tool world): at the scheduled steps,
through the callbacks and the history, without changing a single weight or the run's real-call count."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from envace.data.specs import executor_factory_for
from envace.engines import get_engine
from envace.engines.local import LocalEngineConfig, OptimConfig, RolloutConfig
from envace.evaluation import ActLoopConfig, ValidationSet, get_benchmark
from envace.models import ModelSpec

torch.set_num_threads(1)

BASE = LocalEngineConfig(
    model=ModelSpec(kind="tiny", seed=3),
    steps=3,
    prompts_per_step=1,
    seed=5,
    progress=False,
    rollout=RolloutConfig(samples_per_prompt=2, max_act_tokens=80, max_rehearse_tokens=48, max_stream_tokens=2048),
    optim=OptimConfig(lr=1e-3, micro_batch_streams=8),
)
VAL = {"val/success", "val/score", "val/n", "val/real_calls", "val/crashed", "time/val"}


def _train(world, **overrides):
    env = world["env"]
    adapter = get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=2, max_new_tokens=24), env=env)
    engine = get_engine(
        "local",
        guide=world["guide"],
        executor_factory=executor_factory_for(env.make_executor, world["tasks"]),
        validation_set=ValidationSet(adapter, tuple(env.tasks("val")[:2]), concurrency=2),
    )
    seen = []
    result = engine.train(replace(BASE, **overrides), world["specs"], callbacks=[lambda s, m: seen.append((s, m))])
    return result, seen


@pytest.fixture(scope="module")
def runs(guided_world):
    return {"plain": _train(guided_world, val_every=0)[0], "probed": _train(guided_world, val_every=2)}


def test_validation_runs_at_step_zero_every_k_and_at_the_last_step(runs):
    result, seen = runs["probed"]
    assert [int(m["step"]) for m in result.history if "val/success" in m] == [0, 2, 3]
    assert [step for step, _ in seen] == [0, 1, 2, 3]
    assert VAL <= set(seen[0][1]) and seen[0][1]["val/n"] == 2.0
    assert all(0.0 <= m["val/success"] <= 1.0 for m in result.history if "val/success" in m)
    assert not any("val/success" in m for m in runs["plain"].history)


def test_validation_leaves_training_and_the_real_call_count_unchanged(runs):
    plain, probed = runs["plain"], runs["probed"][0]
    a, b = plain.models["policy"].state_dict(), probed.models["policy"].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for key in ("reward/mean", "real_env/calls_total"):
        assert [m[key] for m in plain.history if m["step"] > 0] == [m[key] for m in probed.history if m["step"] > 0]
