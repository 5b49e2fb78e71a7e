"""Private rehearsal is isolated from the real executor, for every adapter that has one.

For BFCL multi-turn, τ² telecom (solo) and FinMCP-Bench (replay), a RECORDING executor is installed
through the adapter's ``executor_wrapper`` and rehearse-then-commit runs with N = 2 attempts in both
``parallel`` and ``sequential`` modes. The actor is a scripted ``ChatBackend``: while rehearsing (no
"Private rehearsal notes" in its context) it proposes a write-type call at every user turn; in the
committed execution (the memory note is present) it replays gold through the adapter's oracle.

Asserted per adapter and mode:
1. only the committed execution's calls reach the real executor: each task's recorded calls equal its
   committed episode's calls exactly (the rehearsed write is never among them, the count adds nothing);
2. ``rehearse`` alone (no commit) proposes the write in every attempt yet leaves a real executor's state
   as it was — while the same call on a fresh real executor does change state (the check is not vacuous);
3. exactly one committed execution per task: one executor built through the wrapper per task, and the
   cost counters say ``committed_executions == 1`` and ``real_env_calls == real_calls == recorded calls``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from envace.core.critique import Critique, render_critique
from envace.core.env import Task
from envace.core.records import ToolCall
from envace.core.rehearsal import RehearsalConfig
from envace.core.wire import render_rehearsal, render_tool_calls
from envace.envs.bfcl import BfclAdapter, BfclOracle
from envace.envs.finmcp import FinMCPAdapter
from envace.envs.tau2 import Tau2Adapter, Tau2Oracle
from envace.evaluation import ACTOR, REHEARSER, OracleBackend
from envace.evaluation.programs import GenerationLedger, drive
from envace.inference.base import ChatOutput, ChatRequest
from envace.rehearsal import RehearsalSettings, evaluate_with_rehearsal, rehearse

FINMCP = Path(__file__).resolve().parents[1] / "fixtures" / "finmcp"
MODES = ("parallel", "sequential")


# ---- recording executors (installed through each adapter's executor_wrapper) -------------------------
class Recording:
    """Wraps a real executor; logs every call that reaches it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.log = inner, []

    def execute(self, call: ToolCall) -> Any:
        self.log.append(call)
        return self.inner.execute(call)

    def state(self) -> Any:
        return self.inner.state()

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


class RecordingBfcl(Recording):
    def execute_text(self, call: ToolCall) -> str:  # what the BFCL loop uses (exact bfcl text)
        self.log.append(call)
        return self.inner.execute_text(call)


class RecordingTau2(Recording):
    def tool_message(self, call: Any) -> Any:  # what tau2's orchestrator uses (via EnvironmentProxy)
        self.log.append(ToolCall(call.name, dict(call.arguments), call.id))
        return self.inner.tool_message(call)


class RecordingFinMCP(Recording):
    def lookup(self, call: ToolCall, turn: int | None = None) -> tuple[str, Any]:  # the replay responder's path
        self.log.append(call)
        return self.inner.lookup(call, turn)


def recorder(kind: type[Recording], made: list[Recording]) -> Callable[[Any], Recording]:
    def wrap(raw: Any) -> Recording:
        made.append(kind(raw))
        return made[-1]

    return wrap


# ---- scripted seats --------------------------------------------------------------------------------
class RehearsingActor:
    """Rehearsing: a write-type call at each user turn, then "Done."; committed: the oracle's gold."""

    name = "rehearsing-actor"

    def __init__(self, oracle: Any, write: ToolCall) -> None:
        self.oracle, self.write = oracle, write

    def _answer(self, request: ChatRequest) -> str:
        system = str(request.messages[0]["content"])
        if system.startswith("You review a private rehearsal"):
            return render_critique(Critique(f"{self.write.name} was not requested", False, "do not write"))
        if system.startswith("You condense private rehearsals"):
            return f"<memory>Do not call {self.write.name}; follow the user's requests only.</memory>"
        if any("Private rehearsal notes" in str(m.get("content")) for m in request.messages):
            return self.oracle.answer(request)
        return render_tool_calls([self.write]) if request.messages[-1]["role"] == "user" else "Done."

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(self._answer(r), completion_tokens=3) for r in requests]


class ConfirmingRehearser:
    name = "confirming-rehearser"

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(render_rehearsal({"status": "ok", "imagined": True}), completion_tokens=2) for _ in requests]


def settings(mode: str) -> RehearsalSettings:
    return RehearsalSettings(RehearsalConfig(n_attempts=2, mode=mode, act_temperature=0.7, max_steps_per_turn=3))


# ---- the adapters ----------------------------------------------------------------------------------
class Case:
    """One adapter under test: how to build it with a wrapper, its tasks, oracle and rehearsed write."""

    def __init__(
        self,
        name: str,
        build: Callable[[Callable | None], Any],
        kind: type[Recording],
        pick: Callable[[Any], list[Task]],
        oracle: Callable[[list[Task]], Any],
        write: ToolCall,
    ) -> None:
        self.name, self.build, self.kind, self.pick, self.oracle, self.write = name, build, kind, pick, oracle, write
        self._tasks: list[Task] | None = None

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            self._tasks = self.pick(self.build(None))
        return self._tasks


def _bfcl_case() -> Case:
    def pick(adapter: Any) -> list[Task]:
        tasks = [
            t
            for t in adapter.tasks("multi_turn_base", limit=None)
            if "mkdir" in {x["function"]["name"] for x in t.tools}
        ]
        return tasks[:2]

    return Case(
        "bfcl",
        lambda w: BfclAdapter(executor_wrapper=w),
        RecordingBfcl,
        pick,
        BfclOracle,
        ToolCall("mkdir", {"dir_name": "rehearsed_only_dir"}),
    )


def _tau2_case() -> Case:
    return Case(
        "tau2",
        lambda w: Tau2Adapter(executor_wrapper=w),
        RecordingTau2,
        lambda a: a.tasks("telecom", limit=2, seed=0),
        Tau2Oracle,
        ToolCall("toggle_data_saver_mode", {}),
    )


def _finmcp_case() -> Case:
    def build(w: Callable | None) -> Any:
        return FinMCPAdapter(FINMCP / "samples.json", tools_path=FINMCP / "mcp_tools.json", executor_wrapper=w)

    def pick(adapter: Any) -> list[Task]:
        return [t for t in adapter.tasks("test") if any(t.gold_calls)][:2]

    # the write: the first task's first recorded call (replaying it consumes the record: the real state)
    case = Case("finmcp", build, RecordingFinMCP, pick, OracleBackend, ToolCall("_", {}))
    first = next(c for turn in case.tasks()[0].gold_calls for step in turn for c in step)
    case.write = ToolCall(first.name, dict(first.arguments))
    return case


CASES = {"bfcl": _bfcl_case, "tau2": _tau2_case, "finmcp": _finmcp_case}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: Any) -> Case:
    return CASES[request.param]()


def _calls(record: Any) -> list[ToolCall]:
    return [c for turn in record.turns for c in turn.tool_calls]


def _key(call: ToolCall) -> tuple[str, Any]:
    return call.name, call.arguments


# ---- (1) + (3): rehearse, then commit once; only the committed calls reach the real executor -------
@pytest.mark.parametrize("mode", MODES)
def test_only_the_committed_execution_reaches_the_real_executor(case: Case, mode: str) -> None:
    tasks = case.tasks()
    assert len(tasks) == 2
    made: list[Recording] = []
    adapter = case.build(recorder(case.kind, made))
    actor = RehearsingActor(case.oracle(tasks), case.write)
    run = evaluate_with_rehearsal(adapter, actor, ConfirmingRehearser(), tasks, settings(mode), progress=False)
    assert len(made) == len(tasks)  # one real executor per task: the committed execution's
    for task, record, executor in zip(tasks, run.records, made):
        assert record.error is None, record.error
        assert record.task_id == task.task_id
        attempts = record.info["rehearsal"]["outcomes"][0]["attempts"]
        assert len(attempts) == 2
        for attempt in attempts:  # every attempt proposed the write, in imagination
            first = attempt["turns"][0]
            assert first["rehearsed"] and (first["tool_calls"][0]["name"], first["tool_calls"][0]["arguments"]) == _key(
                case.write
            )
        committed = _calls(record)
        assert committed and executor.log == committed  # exactly the committed calls, in order
        gold = [c for turn in task.gold_calls for step in turn for c in step]
        if case.name == "tau2":  # τ² solo: ``done`` ends the simulation in the orchestrator, no tool runs
            gold = [c for c in gold if c.name != "done"]
        assert [_key(c) for c in committed] == [_key(c) for c in gold]  # the oracle's replay, nothing added
        if case.name != "finmcp":  # (FinMCP's "write" is a gold call itself)
            assert _key(case.write) not in [_key(c) for c in executor.log]
        costs = record.info["rehearsal"]["costs"]
        assert costs["committed_executions"] == 1
        assert costs["real_env_calls"] == record.real_calls == len(executor.log)
        assert costs["rehearsal_completion_tokens"] > 0
        assert record.success


# ---- (2): rehearsal alone never changes real state ---------------------------------------------------
def _fresh_state(case: Case, adapter: Any, task: Task) -> Any:
    executor = adapter.real_executor(task)
    try:
        return executor.state()
    finally:
        if hasattr(executor, "close"):
            executor.close()


@pytest.mark.parametrize("mode", MODES)
def test_rehearsed_write_never_changes_real_state(case: Case, mode: str) -> None:
    made: list[Recording] = []
    adapter = case.build(recorder(case.kind, made))
    task = case.tasks()[0]
    real = adapter.real_executor(task)  # a live real executor, held across the rehearsal
    made.clear()
    before = real.state()
    outcome = drive(
        rehearse(adapter.rehearsal_context(task), settings(mode), GenerationLedger()),
        {ACTOR: RehearsingActor(case.oracle(case.tasks()), case.write), REHEARSER: ConfirmingRehearser()},
    )
    try:
        assert len(outcome.attempts) == 2
        for attempt in outcome.attempts:
            assert attempt.turns[0].rehearsed and _key(attempt.turns[0].tool_calls[0]) == _key(case.write)
        assert made == [] and real.log == []  # no executor was built, none was called
        assert real.state() == before == _fresh_state(case, adapter, task)
        if case.name == "finmcp":  # the rehearsed call's record is still unconsumed
            assert real.lookup(case.write)[0] == "replayed"
        else:  # not vacuous: the same call really changes state on a real executor
            real.execute(case.write)
            assert real.state() != before
    finally:
        real.close()
