"""BFCL-v4 through bfcl-eval: categories and statuses, the oracle on small subsets, the cross-check
against ``bfcl evaluate``, the real executor (isolation, recording, safety), crash isolation.

Everything runs offline on bfcl-eval's bundled data; the full sets are in tests/slow/test_bfcl_full.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from envace.core.records import ToolCall
from envace.core.wire import render_tool_calls
from envace.envs.bfcl import (
    BfclAdapter,
    BfclConfig,
    BfclOracle,
    category_status,
    resolve_categories,
    run_bfcl,
)
from envace.envs.bfcl.convert import decode_response, parse_execution_string
from envace.envs.bfcl.executor import BfclExecutor, is_safe_call
from envace.envs.bfcl.oracle import PerturbedOracle
from envace.envs.bfcl.results import bfcl_evaluate, write_result_files
from envace.envs.bfcl.scoring import bfcl_summary
from envace.evaluation import evaluate, get_benchmark
from envace.evaluation.episode import TurnView
from envace.inference.base import ChatOutput, ChatRequest

OFFLINE = resolve_categories("offline")


@pytest.fixture(scope="module")
def oracle_report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two tasks of every offline category, played by the oracle (shared by several tests)."""
    adapter = BfclAdapter(work_dir=tmp_path_factory.mktemp("bfcl"))
    tasks = adapter.tasks("all", limit=2, seed=0)
    return run_bfcl(BfclOracle(tasks), "all", limit=2, seed=0, adapter=adapter, progress=False)


def test_subsets_resolve_to_categories_and_unknown_names_list_the_valid_ones() -> None:
    assert resolve_categories("memory") == ["memory_kv", "memory_vector", "memory_rec_sum"]
    assert resolve_categories("simple_python,multi_turn_base") == ["simple_python", "multi_turn_base"]
    assert "web_search_base" not in OFFLINE and "memory_vector" not in OFFLINE and "memory_kv" in OFFLINE
    with pytest.raises(KeyError, match="live_simple"):
        resolve_categories("live_simpel")


def test_network_categories_are_reported_not_runnable_with_a_reason(oracle_report: Any) -> None:
    status = category_status("all")
    for name in ("web_search_base", "web_search_no_snippet", "memory_vector"):
        assert status[name]["status"] == "not_runnable_offline"
        row = oracle_report.categories[name]
        assert row["status"] == "not_runnable_offline" and "network" in row["reason"]
    assert "SerpAPI" in status["web_search_base"]["reason"]
    assert "all-MiniLM-L6-v2" in status["memory_vector"]["reason"]


def test_oracle_scores_100_percent_on_every_offline_category(oracle_report: Any) -> None:
    ran = {k: v for k, v in oracle_report.categories.items() if v["status"] == "ran"}
    assert sorted(ran) == sorted(OFFLINE)
    assert all(v["n"] == 2 and v["accuracy"] == 1.0 for v in ran.values()), ran
    assert oracle_report.summary["overall"] == pytest.approx(1.0)
    assert oracle_report.summary["covers_all"] is False  # web search / vector memory did not run
    assert oracle_report.run.metrics.error_rate == 0.0


def test_multi_turn_records_keep_real_calls_responses_and_state(oracle_report: Any) -> None:
    record = next(r for r in oracle_report.run.records if r.domain == "multi_turn_base")
    assert record.real_calls == sum(len(t.tool_calls) for t in record.turns) > 0
    assert all(len(t.responses) == len(t.tool_calls) and not t.rehearsed for t in record.turns)
    assert record.final_state and record.info["bfcl_verdict"]["valid"]
    memory = next(r for r in oracle_report.run.records if r.domain == "memory_kv")
    assert Path(memory.info["memory_snapshot"]).is_dir()


def test_summary_uses_bfcl_section_formulas() -> None:
    summary = bfcl_summary(
        {
            "simple_python": (1, 2),
            "simple_java": (1, 1),
            "multiple": (0, 4),
            "live_simple": (1, 1),
            "live_multiple": (0, 3),
        }
    )
    assert summary["non_live_simple"] == pytest.approx(0.75)  # unweighted over python, java
    assert summary["non_live"] == pytest.approx(0.375)  # unweighted over simple, multiple
    assert summary["live"] == pytest.approx(0.25)  # weighted by task counts
    assert summary["overall"] == pytest.approx((0.375 + 0.25) / 2)  # 10/10 weights of the sections that ran
    assert summary["multi_turn"] is None


# ---- cross-check against bfcl's own evaluator ------------------------------------------------------
def test_scores_equal_bfcl_evaluate_on_the_same_result_files(tmp_path: Path) -> None:
    adapter = BfclAdapter(work_dir=tmp_path / "work")
    tasks = adapter.tasks("offline", limit=3, seed=1)
    report = run_bfcl(PerturbedOracle(BfclOracle(tasks)), "offline", limit=3, seed=1, adapter=adapter, progress=False)
    ours = {k: v for k, v in report.categories.items() if v["status"] == "ran"}
    assert 0.2 < report.run.metrics.success_rate < 0.8  # a real mix of right and wrong outputs
    write_result_files(report.run.records, tmp_path / "result")
    reference = bfcl_evaluate(tmp_path / "result", tmp_path / "score", list(ours))
    theirs = reference["categories"]
    assert sorted(theirs) == sorted(ours)
    for name, row in ours.items():
        assert (theirs[name]["correct_count"], theirs[name]["total_count"]) == (row["correct"], row["n"]), name
        failed = {r.task_id for r in report.run.records if r.domain == name and not r.success}
        assert set(theirs[name]["failed_ids"]) == failed, name
    for section in ("non_live", "live", "multi_turn"):
        assert reference["sections"][section] == pytest.approx(report.summary[section], abs=5e-5), section


# ---- real executor ------------------------------------------------------------------------------
def _multi_turn_task(adapter: BfclAdapter) -> Any:
    return adapter.tasks("multi_turn_base", limit=1, seed=3)[0]


def test_real_executors_are_isolated_and_match_the_gold_replay() -> None:
    adapter = BfclAdapter()
    task = _multi_turn_task(adapter)
    first, second = adapter.real_executor(task), adapter.real_executor(task)
    before = second.state()
    for call in task.gold_calls[0][0]:
        first.execute(call)
    assert second.state() == before != first.state()
    assert adapter.real_executor(adapter.tasks("simple_python", limit=1)[0]) is None
    first.close(), second.close()


class Recording:
    """A recording wrapper around any executor (what isolation tests need)."""

    def __init__(self, inner: Any, log: list[tuple[str, ToolCall]]) -> None:
        self.inner, self.log = inner, log

    def execute(self, call: ToolCall) -> Any:
        self.log.append(("execute", call))
        return self.inner.execute(call)

    def state(self) -> dict[str, Any]:
        return self.inner.state()


def test_every_real_call_goes_through_the_executor_wrapper() -> None:
    log: list[tuple[str, ToolCall]] = []
    adapter = BfclAdapter(executor_wrapper=lambda ex: Recording(ex, log))
    task = _multi_turn_task(adapter)
    record = evaluate(adapter, BfclOracle([task]), [task], progress=False).records[0]
    assert record.success and record.real_calls == len(log) > 0
    assert [c.name for _, c in log] == [c.name for t in record.turns for c in t.tool_calls]


def test_unsafe_call_names_never_reach_eval() -> None:
    bad = ToolCall("__import__('os').system", {"x": 1})
    assert (
        not is_safe_call(bad) and not is_safe_call(ToolCall("ls", {"a) or (1": 1})) and is_safe_call(ToolCall("ls", {}))
    )
    executor = BfclExecutor("multi_turn_base_0", "multi_turn_base", {}, ["MathAPI"])
    assert "invalid function or argument name" in executor.execute_text(bad)
    assert executor.execute(ToolCall("mean", {"numbers": [1, 3]})) == {"result": 2.0}
    assert executor.execute(ToolCall("nope", {}))["error"].startswith("name 'nope'")
    executor.close()


def test_gold_call_strings_and_responses_convert() -> None:
    call = parse_execution_string("sort('report.txt')", ["GorillaFileSystem"])
    assert call == ToolCall("sort", {"file_name": "report.txt"})
    assert parse_execution_string("cd(folder='a')", ["GorillaFileSystem"]).arguments == {"folder": "a"}
    assert decode_response('{"a": 1}') == {"a": 1}
    assert decode_response("Error during execution: boom") == {"error": "boom"}
    assert decode_response("plain") == "plain"


# ---- crash isolation, seeds, hooks, registry --------------------------------------------------------
class CrashOn:
    """The oracle, except that it raises on requests of one task."""

    name = "crashy"

    def __init__(self, tasks: Sequence[Any], victim: str) -> None:
        self.oracle = BfclOracle(tasks)
        self.victim = victim
        self.seeds: list[int] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.seeds.extend(r.seed for r in requests)
        if any(self.victim in str(r.messages) for r in requests):
            raise RuntimeError("backend exploded")
        return self.oracle.generate(requests)


def test_a_crashing_task_is_a_failure_with_its_error_and_the_run_goes_on() -> None:
    adapter = BfclAdapter()
    tasks = adapter.tasks("simple_python,multi_turn_base", limit=2, seed=0)
    victim = tasks[-1]
    run = evaluate(adapter, CrashOn(tasks, victim.user_turns[0]), tasks, concurrency=4, progress=False)
    by_id = {r.task_id: r for r in run.records}
    assert by_id[victim.task_id].crashed and "backend exploded" in by_id[victim.task_id].error
    assert all(r.success for r in run.records if r.task_id != victim.task_id)
    assert run.metrics.error_rate == pytest.approx(1 / len(tasks))


def test_seeds_are_deterministic_and_differ_per_trial() -> None:
    from envace.envs.bfcl import with_trial

    adapter = BfclAdapter()
    task = adapter.tasks("simple_python", limit=1, seed=5)[0]
    runs = []
    for trial in (0, 0, 1):
        backend = CrashOn([task], victim="\x00never")
        evaluate(adapter, backend, [with_trial(task, trial)], progress=False)
        runs.append(backend.seeds)
    assert runs[0] == runs[1] != runs[2]


def test_turn_hook_messages_reach_the_policy_before_each_turn() -> None:
    adapter = BfclAdapter(BfclConfig(system_prefix="ROLE PROMPT"))
    task = _multi_turn_task(adapter)
    seen: list[ChatRequest] = []

    class Spy(BfclOracle):
        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            seen.extend(requests)
            return super().generate(requests)

    def hook(view: TurnView) -> Any:
        return ({"role": "user", "content": f"NOTE {view.turn_index}"},)
        yield []  # pragma: no cover - a generator program

    record = adapter.run_episode(Spy([task]), task, turn_hook=hook)
    last = [m["content"] for m in seen[-1].messages]
    assert last[0].startswith("ROLE PROMPT") and [c for c in last if str(c).startswith("NOTE")] == [
        f"NOTE {k}" for k in range(len(task.user_turns))
    ]
    assert record.act_generations == len(seen)


def test_registered_under_bfcl() -> None:
    assert isinstance(get_benchmark("bfcl"), BfclAdapter)


class MemoryWriter:
    """Stores each prerequisite user message in core memory, then answers from what it sees."""

    name = "memory-writer"

    def __init__(self) -> None:
        self.question_systems: list[str] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        outputs = []
        for request in requests:
            last, system = request.messages[-1], request.messages[0]["content"]
            if "For your final answer" in system:  # a question (bfcl's agentic answer format)
                self.question_systems.append(system)
                outputs.append(ChatOutput("I do not know"))
            elif last["role"] == "user":  # a prerequisite turn: remember it
                key = f"fact_{sum(1 for m in request.messages if m['role'] == 'user')}"
                outputs.append(
                    ChatOutput(
                        render_tool_calls([ToolCall("core_memory_add", {"key": key, "value": last["content"][:40]})])
                    )
                )
            else:
                outputs.append(ChatOutput(""))
        return outputs


def test_memory_questions_see_what_the_prerequisite_conversations_stored(tmp_path: Path) -> None:
    adapter = BfclAdapter(work_dir=tmp_path)
    task = next(t for t in adapter.tasks("memory_kv", limit=None) if "What is my first name" in t.user_turns[0])
    policy = MemoryWriter()
    record = evaluate(adapter, policy, [task], progress=False).records[0]
    assert not record.success and record.info["bfcl_verdict"]["error_type"] == "agentic:answer_not_found"
    assert '"fact_1": "Hey there! Thanks for getting back to me' in policy.question_systems[-1]
    assert any((Path(record.info["memory_snapshot"]) / "agentic").rglob("customer_final.json"))


class ReplayRehearser:
    """REHEARSE backend that answers each call with the real response recorded for it (a perfect world
    model) or, for calls it was not given, with a made-up object."""

    name = "replay-rehearser"

    def __init__(self, records: Sequence[Any]) -> None:
        from envace.core.prompts import compact_json

        self.known: dict[tuple[str, str], Any] = {}
        for record in records:
            for turn in record.turns:
                for call, response in zip(turn.tool_calls, turn.responses, strict=True):
                    self.known.setdefault((call.name, compact_json(call.arguments)), response)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        from envace.core.wire import as_result_object, render_rehearsal

        outs = []
        for request in requests:
            lines = dict(line.split(": ", 1) for line in request.messages[-1]["content"].splitlines() if ": " in line)
            real = self.known.get((lines["Call"], lines["Arguments"]), {"made_up": True})
            outs.append(ChatOutput(render_rehearsal(as_result_object(real)), completion_tokens=1))
        return outs


def test_world_model_fidelity_runs_on_bfcl_multi_turn_backends(oracle_report: Any) -> None:
    """Fidelity on BFCL's executable multi-turn classes: a rehearser that knows every real response
    scores 1.0, a made-up one does not; per tool = BFCL's functions."""
    from envace.evaluation import measure_fidelity

    records = [r for r in oracle_report.run.records if r.domain == "multi_turn_base"]
    tasks = BfclAdapter().tasks("multi_turn_base", limit=2, seed=0)
    n_calls = sum(len(t.tool_calls) for r in records for t in r.turns)
    assert n_calls > 0
    perfect = measure_fidelity(ReplayRehearser(records), records, tasks, progress=False)
    assert perfect.overall.n == n_calls and perfect.overall.exact_match == 1.0 and perfect.overall.field_f1 == 1.0
    assert set(perfect.per_tool) == {c.name for r in records for t in r.turns for c in t.tool_calls}
    blind = measure_fidelity(ReplayRehearser([]), records, tasks, progress=False)
    assert blind.overall.n == n_calls and blind.overall.exact_match < 1.0
