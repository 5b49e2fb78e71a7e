"""The training-time task-success probe: schedule, which model plays, and that it measures exactly what the
evaluation measures (the same adapter, tasks and greedy episodes) while leaving training state alone."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from envace.core.prompts import ChatFormatter
from envace.engines.local import LocalEngine, LocalEngineConfig
from envace.engines.local.probing import ScheduledProbe
from envace.engines.local.validation import ValidationProbe, make_validation
from envace.envs.toolworld import ToolWorldEnv
from envace.evaluation import ActLoopConfig, ValidationSet, evaluate, get_benchmark
from envace.inference.local import LocalHFBackend
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)


@pytest.mark.parametrize(("models", "played"), [({"act": "A", "rehearse": "R"}, "A"), ({"policy": "P"}, "P")])
def test_the_probe_plays_the_act_model_at_step_zero_every_k_and_the_last_step(models, played):
    calls = []
    probe = SimpleNamespace(measure=lambda model, tok, fmt: calls.append(model) or {"val/n": 1.0})
    scheduled = ScheduledProbe(probe, 3, "act")  # as the engine schedules val_every=3
    assert [s for s in range(8) if scheduled.at(s, 7, models, "tok", "fmt")] == [0, 3, 6, 7]
    assert calls == [played] * 4
    assert ScheduledProbe(None, 3, "act").at(0, 7, models, "tok", "fmt") == {}


def test_val_every_without_a_validation_set_is_an_actionable_error():
    with pytest.raises(ValueError, match="validation_set"):
        make_validation(LocalEngineConfig(val_every=2), LocalEngine().validation_set, "fp32")
    assert make_validation(LocalEngineConfig(val_every=0), None, "fp32") is None


@pytest.fixture(scope="module")
def world():
    env = ToolWorldEnv()
    adapter = get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=2, max_new_tokens=24), env=env)
    return adapter, tuple(env.tasks("val")[:3])


def test_a_validation_set_needs_tasks_and_a_positive_concurrency(world):
    adapter, tasks = world
    with pytest.raises(ValueError, match="no tasks"):
        ValidationSet(adapter, ())
    with pytest.raises(ValueError, match="concurrency"):
        ValidationSet(adapter, tasks, concurrency=0)


def test_the_probe_measures_what_evaluate_measures_and_leaves_training_state_alone(world):
    adapter, tasks = world
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny", seed=3))
    model.train()
    formatter = ChatFormatter(tokenizer)
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    metrics = ValidationProbe(ValidationSet(adapter, tasks, concurrency=2)).measure(model, tokenizer, formatter)

    assert model.training and all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    # the evaluation's own path on an independent copy of the weights plays the same episodes
    twin = copy.deepcopy(model).eval()
    with torch.no_grad():
        backend = LocalHFBackend(twin, tokenizer, batch_size=2, formatter=formatter)
        run = evaluate(adapter, backend, tasks, concurrency=2)
    assert metrics["val/n"] == len(tasks) == run.metrics.n_tasks
    assert metrics["val/success"] == run.metrics.success_rate
    assert metrics["val/score"] == run.metrics.mean_score
    assert metrics["val/real_calls"] == sum(r.real_calls for r in run.records)
    assert metrics["val/crashed"] == 0.0 and metrics["time/val"] > 0
