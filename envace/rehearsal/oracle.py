"""The oracle rehearser: a sandboxed copy of the real environment answers the rehearsal attempts' calls.

It is the upper bound on what private rehearsal can give: the attempts see exactly the responses a real
execution would return, so what is left is what the actor makes of them (the paper's trained and base
rehearsers are compared with it). The sandbox is never the committed execution's executor: each attempt
gets a fresh one from the adapter (``BenchmarkAdapter.real_executor``: the task's initial state), on which
the real calls of the conversation so far (the context's answered events: turn-scope rehearsal starts
from them) are replayed first, so that its state is the real state at the start of the rehearsed turn.
Every call a sandbox executes — replays included — is counted in ``SandboxCounter`` and reported as
``rehearsal_sandbox_calls``, apart from the committed execution's real calls (``real_env_calls``) and its
one committed execution (``committed_executions``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace.core.env import Executor, Task
from envace.core.records import ToolCall
from envace.core.rehearsal import RehearsalContext
from envace.core.rehearse_context import Answered, Event
from envace.evaluation.base import BenchmarkAdapter
from envace.evaluation.episode import ResponseBatch
from envace.evaluation.programs import Program

ORACLE = "oracle"


class OracleRehearser:
    """Marker in a sweep's rehearsers mapping: answer with a sandboxed real environment, not a model."""

    name = ORACLE

    def __repr__(self) -> str:
        return "OracleRehearser()"


ORACLE_REHEARSER = OracleRehearser()


@dataclass
class SandboxCounter:
    """Calls executed on rehearsal sandboxes (replays of the real conversation included)."""

    calls: int = 0
    seconds: float = 0.0


class SandboxResponder:
    """Answers an attempt's calls on its own sandbox executor (the ACT loop's responder protocol)."""

    rehearsed = True  # private: nothing it does reaches the committed execution

    def __init__(self, executor: Executor, replay: tuple[Event, ...], counter: SandboxCounter) -> None:
        self._executor = executor
        self._counter = counter
        for event in replay:
            if isinstance(event, Answered):
                self._execute(event.call)

    def _execute(self, call: ToolCall) -> Any:
        start = time.perf_counter()
        self._counter.calls += 1
        response = self._executor.execute(call)
        self._counter.seconds += time.perf_counter() - start
        return response

    def respond(
        self, calls: tuple[ToolCall, ...], user_turn: int, user_text: str, history: tuple[Event, ...] = ()
    ) -> Program[ResponseBatch]:
        return ResponseBatch(tuple(self._execute(call) for call in calls))
        yield []  # pragma: no cover - makes this method a generator


ResponderFactory = Callable[[RehearsalContext], Any]


def sandbox_responders(adapter: BenchmarkAdapter, task: Task, counter: SandboxCounter) -> ResponderFactory:
    """A factory of one fresh sandbox responder per attempt of ``task`` (see the module docstring)."""
    first = adapter.real_executor(task)  # also the check that the benchmark has one; the first attempt's
    if first is None:
        raise ValueError(
            f"rehearser 'oracle' needs an executable copy of the environment; benchmark {adapter.name!r} has none "
            "(drop 'oracle' from rehearsal.rehearsers for it)"
        )
    unused = [first]

    def make(context: RehearsalContext) -> SandboxResponder:
        executor = unused.pop() if unused else adapter.real_executor(task)
        return SandboxResponder(executor, tuple(context.events), counter)

    return make
