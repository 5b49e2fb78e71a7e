"""The tool-world benchmark adapter: oracle = 100%, metrics per domain / transfer, crash isolation."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from envace.core.records import Termination
from envace.envs.toolworld.evaluation import ToolWorldAdapter
from envace.evaluation import EpisodeRecord, OracleBackend, build_policy, evaluate, get_benchmark
from envace.evaluation.episode import ActLoopConfig
from envace.inference.base import ChatOutput, ChatRequest


@pytest.fixture(scope="module")
def adapter() -> ToolWorldAdapter:
    return get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=6))


@pytest.fixture(scope="module")
def test_tasks(adapter):
    return adapter.tasks("test")


def test_oracle_scores_100_percent_on_the_test_split(adapter, test_tasks):
    oracle = build_policy("oracle", tasks=test_tasks, make_executor=adapter.real_executor)
    run = evaluate(adapter, oracle, test_tasks, concurrency=16, progress=False)
    assert len(run.records) == len(test_tasks) > 0
    failures = [(r.task_id, r.termination, r.error) for r in run.records if not r.success]
    assert failures == [] and run.metrics.success_rate == 1.0 and run.metrics.mean_score == 1.0
    assert run.metrics.parse_failure_rate == 0.0 and run.metrics.error_rate == 0.0
    assert run.metrics.transfer is not None and run.metrics.transfer.n > 0  # the held-out domain
    assert run.metrics.transfer.n == sum(t.meta.get("held_out") == "domain" for t in test_tasks)
    assert set(run.metrics.per_domain) == {t.domain for t in test_tasks}
    assert set(run.metrics.held_out) == {"domain", "composition"}
    lines = [json.dumps(p) for p in run.predictions()]
    assert EpisodeRecord.from_json(json.loads(lines[0])) == run.records[0]


def test_subsets_are_deterministic(adapter):
    a = adapter.tasks("val", limit=7, seed=1)
    assert [t.task_id for t in a] == [t.task_id for t in adapter.tasks("val", limit=7, seed=1)]
    assert len(a) == 7 and all(t.split == "val" for t in a)
    with pytest.raises(ValueError, match="valid splits"):
        adapter.tasks("dev")


class ExplodingOracle:
    """The oracle, except that it raises on one task's requests."""

    def __init__(self, tasks, adapter, bad_task) -> None:
        self.inner = OracleBackend(tasks, make_executor=adapter.real_executor)
        self.bad = bad_task.user_turns[0]
        self.name = "exploding-oracle"

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        if any(m.get("content") == self.bad for r in requests for m in r.messages):
            raise ConnectionError("endpoint dropped the connection")
        return self.inner.generate(requests)


def test_a_crashing_task_never_aborts_the_benchmark(adapter, test_tasks):
    tasks = test_tasks[:6]
    bad = tasks[2]
    bad_ids = {t.task_id for t in tasks if t.user_turns[0] == bad.user_turns[0]}
    run = evaluate(adapter, ExplodingOracle(tasks, adapter, bad), tasks, concurrency=3, progress=False)
    for rec in run.records:
        if rec.task_id in bad_ids:
            assert rec.termination is Termination.ERROR and "ConnectionError" in rec.error and not rec.success
        else:
            assert rec.success and rec.error is None
    assert run.metrics.error_rate == pytest.approx(len(bad_ids) / 6)
