"""The three policy kinds behind one interface: the oracle served over an OpenAI-compatible endpoint
(the ``openai`` policy), failing endpoints, and the local HF backend registry entry."""

from __future__ import annotations

import pytest

from envace.core.records import Termination
from envace.evaluation import OracleBackend, build_policy, evaluate, get_benchmark
from envace.evaluation.episode import ActLoopConfig
from envace.inference.openai_server import ChatCompletionServer, FaultPlan


@pytest.fixture(scope="module")
def adapter():
    return get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=6))


@pytest.fixture(scope="module")
def tasks(adapter):
    return adapter.tasks("test", limit=6, seed=11)


def test_openai_policy_over_a_local_endpoint_replays_gold(adapter, tasks):
    oracle = OracleBackend(tasks, make_executor=adapter.real_executor)
    with ChatCompletionServer(oracle, "oracle", faults=FaultPlan(fail_count=1, fail_status=503)) as server:
        policy = build_policy("openai", base_url=server.base_url, model="oracle", backoff_s=0.01, concurrency=3)
        run = evaluate(adapter, policy, tasks, concurrency=3, progress=False)
    assert run.policy == "openai:oracle" and all(r.policy == "openai:oracle" for r in run.records)
    assert run.metrics.success_rate == 1.0  # the injected 503 was retried by the client
    assert sum(r.real_calls for r in run.records) == sum(
        len(step) for t in tasks for turn in t.gold_calls for step in turn
    )


def test_a_dead_endpoint_fails_every_task_without_aborting(adapter, tasks):
    oracle = OracleBackend(tasks, make_executor=adapter.real_executor)
    with ChatCompletionServer(oracle, "oracle", faults=FaultPlan(fail_count=10_000, fail_status=400)) as server:
        policy = build_policy("openai", base_url=server.base_url, model="oracle", max_retries=0)
        run = evaluate(adapter, policy, tasks[:3], concurrency=3, progress=False)
    assert [r.termination for r in run.records] == [Termination.ERROR] * 3
    assert all("HTTP 400" in r.error for r in run.records) and run.metrics.error_rate == 1.0
