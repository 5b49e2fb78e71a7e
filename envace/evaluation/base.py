"""The benchmark-adapter interface, and its implementation for any executable ``Environment``.

A ``BenchmarkAdapter`` turns a benchmark into: tasks (``tasks(subset, limit, seed)``), one episode of a
policy on a task (``run_episode(policy, task)`` — or ``episode_program`` for batched drivers), a score,
and optionally a fresh *real executor* (fidelity studies). Its ``rehearsal_context(task)`` is the only
view of a task that private rehearsal receives: instructions, tools and user turns — no executor, no
gold calls, no states.

``EnvironmentAdapter`` implements the interface for every environment of ``envace.core.env`` (the
embedded tool world; later BFCL multi-turn / τ² if they expose the same protocol): the ACT loop with the
REAL executor, user turns replayed in order, scored by the environment's own scorer. ``episode_program``
creates the executor inside the program, so nothing outside the committed episode ever holds it.

Subsets are sampled deterministically: with ``limit``, the tasks with the smallest
``crc32(seed, task_id)`` are kept, in the environment's order.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from envace.core.env import Environment, EpisodeResult, Executor, Task
from envace.core.rehearsal import RehearsalContext
from envace.core.seeds import derive_seed
from envace.evaluation.episode import ActLoopConfig, Dialogue, ExecutorResponder, TurnHook, run_act_loop, trial_of
from envace.evaluation.policies import OracleBackend
from envace.evaluation.programs import ACTOR, GenerationLedger, Program, drive
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend

T = TypeVar("T")


def _task_id(task: Any) -> str:
    return task.task_id


def sample_tasks(
    tasks: Sequence[T],
    limit: int | None,
    seed: int,
    where: Callable[[T], bool] | None = None,
    task_id: Callable[[T], str] = _task_id,
) -> list[T]:
    """Deterministic subset of at most ``limit`` tasks (original order kept). ``where``: only tasks it
    accepts — asked lazily, in sampling order, so a costly test runs on as few tasks as needed.

    The order is seeded by each item's id: ``task_id(item)`` (default: its ``task_id`` attribute), so a
    benchmark can sample its raw entries before turning only the chosen ones into ``Task``s.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit={limit}: must be >= 0 or None (all tasks)")
    if where is None and (limit is None or limit >= len(tasks)):
        return list(tasks)
    keep: set[int] = set()
    for i in sorted(range(len(tasks)), key=lambda i: (derive_seed(seed, task_id(tasks[i])), i)):
        if limit is not None and len(keep) >= limit:
            break
        if where is None or where(tasks[i]):
            keep.add(i)
    return [t for i, t in enumerate(tasks) if i in keep]


def with_trials(tasks: Sequence[Task], trials: int) -> list[Task]:
    """Every task once per trial, trial-major (like tau2); ``task.meta['trial']`` seeds each trial's sampling."""
    if trials < 1:
        raise ValueError(f"trials={trials}: must be >= 1")
    return [replace(t, meta={**t.meta, "trial": k}) for k in range(trials) for t in tasks]


class BenchmarkAdapter(ABC):
    """One benchmark, seen by evaluation and rehearsal. Subclasses set ``name``."""

    name: str = "benchmark"
    success_threshold: float = 1.0  # a task succeeds when score >= this

    @abstractmethod
    def tasks(self, subset: str = "test", limit: int | None = None, seed: int = 0) -> list[Task]: ...

    @abstractmethod
    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        """One real episode as a generation program (seat ``ACTOR``); see ``programs``."""

    @abstractmethod
    def score(self, task: Task, record: EpisodeRecord) -> float:
        """Re-score a record (the episode program already stores its score)."""

    def real_executor(self, task: Task) -> Executor | None:
        """A fresh real executor for ``task`` (fidelity studies); None when the benchmark has none."""
        return None

    def oracle(self, tasks: Sequence[Task]) -> ChatBackend | None:
        """A policy that replays ``tasks``' ground truth (None when the benchmark has none)."""
        return None

    def summarize(self, subset: str, records: Sequence[EpisodeRecord]) -> dict[str, Any]:
        """The benchmark's own tables over ``records`` of ``subset`` (BFCL: per category and its
        aggregates; τ²: per domain with pass^k); ``{}`` when the generic metrics say it all."""
        return {}

    def rehearsal_context(self, task: Task) -> RehearsalContext:
        """The only view of ``task`` that private rehearsal gets."""
        return RehearsalContext(
            task.task_id, task.system_prompt, tuple(task.tools), tuple(task.user_turns), trial=trial_of(task)
        )

    def run_episode(
        self, policy: ChatBackend, task: Task, *, turn_hook: TurnHook | None = None, max_batch: int | None = None
    ) -> EpisodeRecord:
        """Run one episode of ``policy`` on ``task`` (raises on crashes; ``evaluate`` isolates them)."""
        return drive(self.episode_program(task, turn_hook=turn_hook), {ACTOR: policy}, max_batch)


class EnvironmentAdapter(BenchmarkAdapter):
    """Adapter for an executable ``core.env.Environment``: real executor, environment scorer."""

    def __init__(self, env: Environment, config: ActLoopConfig | None = None, name: str | None = None) -> None:
        self.env = env
        self.config = config or ActLoopConfig()
        self.name = name or getattr(env, "name", type(env).__name__)

    def tasks(self, subset: str = "test", limit: int | None = None, seed: int = 0) -> list[Task]:
        return sample_tasks(list(self.env.tasks(subset)), limit, seed)

    def real_executor(self, task: Task) -> Executor:
        return self.env.make_executor(task)

    def oracle(self, tasks: Sequence[Task]) -> ChatBackend:
        return OracleBackend(tasks, name="oracle", make_executor=self.real_executor)

    def score(self, task: Task, record: EpisodeRecord) -> float:
        calls = tuple(
            tuple(c for t in record.turns if t.user_turn == u for c in t.tool_calls)
            for u in range(len(task.user_turns))
        )
        result = EpisodeResult(record.final_answers, calls, record.final_state)
        return float(self.env.score(task, result))

    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        start = time.perf_counter()
        ledger = ledger if ledger is not None else GenerationLedger()
        responder = ExecutorResponder(self.env.make_executor(task))
        ledger.count_real_execution()
        loop = yield from run_act_loop(Dialogue.of_task(task), responder, self.config, ledger, turn_hook=turn_hook)
        record = EpisodeRecord.unscored(
            self.name,
            task,
            final_answers=loop.final_answers,
            turns=loop.turns,
            termination=loop.termination,
            act_generations=loop.act_generations,
            parse_failures=loop.parse_failures,
            parse_error_codes=loop.parse_error_codes,
            real_calls=responder.calls_made,
            final_state=responder.state(),
            costs=ledger.to_json(),
            wall_s=time.perf_counter() - start,
        )
        return _scored(self, task, record)


def _scored(adapter: BenchmarkAdapter, task: Task, record: EpisodeRecord) -> EpisodeRecord:
    score = adapter.score(task, record)
    return replace(record, score=score, success=score >= adapter.success_threshold - 1e-9)
