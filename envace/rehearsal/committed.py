"""Rehearse privately, then commit once: the test-time procedure of docs/method.md §12 for one task or a benchmark.

``rehearsed_episode(adapter, task, settings)`` runs the adapter's *one* real episode with a turn hook.
The hook is a closure over the task's ``RehearsalContext`` (instructions, tools, user turns) and the
rehearsal settings only; what it sees of the running episode is a ``TurnView`` (conversation so far and
real (call, response) pairs of earlier turns). The real executor is created inside the adapter's
episode program and never leaves it, so rehearsal cannot reach real state (tests prove it with a
recording executor). With ``n_attempts == 0`` no hook is installed: the episode *is* plain evaluation.

* scope ``turn`` (default): before every user turn, rehearse that turn from the real conversation so far.
* scope ``task``: before user turn 0, rehearse the whole dialogue and inject the memory there; its
  rehearsal reads user turns the committed execution has not reached ("sees future turns").

Costs per task land in ``record.info["rehearsal"]``: completion tokens generated in rehearsal (ACT,
REHEARSE, critique and summary generations), rehearsal and committed wall time, the backend seconds
booked to rehearsal generations and how many of them a sweep reused from an earlier cell
(``envace.rehearsal.reuse``), real-environment calls, calls an oracle rehearser ran on its sandboxes
(``rehearsal_sandbox_calls``, ``envace.rehearsal.oracle``) and the number of committed executions — counted,
not assumed: the real executions the adapter's episode opened on the task's ledger
(``GenerationLedger.real_executions``; one per real executor built), so an episode that committed twice
would report 2.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from envace.core.env import Task
from envace.core.rehearsal import RehearsalContext, RehearsalScope
from envace.core.rehearsal_prompts import memory_message
from envace.evaluation.base import BenchmarkAdapter
from envace.evaluation.episode import TurnHook, TurnView
from envace.evaluation.metrics import compute_metrics
from envace.evaluation.programs import ACTOR, REHEARSER, GenerationLedger, Program, no_generation
from envace.evaluation.records import EpisodeRecord
from envace.evaluation.runner import BenchmarkRun, backend_name, run_programs
from envace.inference.base import ChatBackend
from envace.rehearsal.controller import RehearsalOutcome, RehearsalSettings, context_for_turn, rehearse
from envace.rehearsal.oracle import SandboxCounter, sandbox_responders
from envace.rehearsal.reuse import ReuseAwareLedger

REHEARSAL_PURPOSES = ("rehearsal_act", "rehearse", "critique", "summary")


def _memory_hook(
    base_context: RehearsalContext,
    settings: RehearsalSettings,
    ledger: GenerationLedger,
    outcomes: list[RehearsalOutcome],
) -> TurnHook:
    whole_task = settings.config.scope is RehearsalScope.task

    def hook(view: TurnView) -> Program[tuple[dict[str, Any], ...]]:
        if whole_task and view.turn_index != base_context.first_turn_index:
            return (yield from no_generation(()))
        outcome = yield from rehearse(context_for_turn(base_context, view, whole_task), settings, ledger)
        outcomes.append(outcome)
        note = memory_message(settings.prompts, outcome.memory)
        return () if note is None else (note,)

    return hook


def rehearsal_costs(
    record: EpisodeRecord, outcomes: Sequence[RehearsalOutcome], ledger: ReuseAwareLedger
) -> dict[str, Any]:
    """Per-task costs; ``committed_executions`` is the ledger's count of real executions opened."""
    rehearsal_wall = sum(o.wall_s for o in outcomes)
    return {
        "rehearsal_completion_tokens": record.completion_tokens(REHEARSAL_PURPOSES),
        "committed_completion_tokens": record.completion_tokens(("act",)),
        "rehearsal_wall_s": rehearsal_wall,
        # backend seconds of the rehearsal generations, a reused one at what it cost when generated
        "rehearsal_generation_s": ledger.seconds(REHEARSAL_PURPOSES),
        "rehearsal_reused_calls": ledger.reused_calls(REHEARSAL_PURPOSES),
        "committed_wall_s": max(0.0, record.wall_s - rehearsal_wall),
        "real_env_calls": record.real_calls,
        "committed_executions": ledger.real_executions,
    }


def rehearsed_episode(adapter: BenchmarkAdapter, task: Task, settings: RehearsalSettings) -> Program[EpisodeRecord]:
    """Private rehearsal + exactly one committed execution of ``task`` (seats ACTOR and REHEARSER)."""
    ledger = ReuseAwareLedger()
    outcomes: list[RehearsalOutcome] = []
    sandbox = SandboxCounter()
    if settings.sandbox and settings.config.n_attempts > 0:
        settings = replace(settings, responders=sandbox_responders(adapter, task, sandbox))
    hook = None
    if settings.config.n_attempts > 0:
        hook = _memory_hook(adapter.rehearsal_context(task), settings, ledger, outcomes)
    start = time.perf_counter()
    record = yield from adapter.episode_program(task, ledger=ledger, turn_hook=hook)
    record = replace(record, wall_s=time.perf_counter() - start, costs=ledger.to_json())
    cfg = settings.config
    info = {
        "n_attempts": cfg.n_attempts,
        "mode": cfg.mode.value if cfg.n_attempts else "none",
        "scope": cfg.scope.value,
        "prompts_version": settings.prompts.version,
        "outcomes": [o.to_json() for o in outcomes],
        "costs": {**rehearsal_costs(record, outcomes, ledger), "rehearsal_sandbox_calls": sandbox.calls},
    }
    return replace(record, info={**record.info, "rehearsal": info})


def evaluate_with_rehearsal(
    adapter: BenchmarkAdapter,
    actor: ChatBackend,
    rehearser: ChatBackend | None,
    tasks: Sequence[Task],
    settings: RehearsalSettings,
    *,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
    label: str = "",
) -> BenchmarkRun:
    """Rehearse-then-commit on every task (``rehearser`` may be None when ``n_attempts == 0`` or when a
    sandboxed environment answers the attempts, ``settings.sandbox``)."""
    if rehearser is None and settings.config.n_attempts > 0 and not settings.sandbox:
        raise ValueError("evaluate_with_rehearsal: n_attempts > 0 needs a rehearser backend (or settings.sandbox)")
    backends = {ACTOR: actor} if rehearser is None else {ACTOR: actor, REHEARSER: rehearser}
    name = backend_name(actor)
    records = run_programs(
        adapter,
        tasks,
        lambda t: rehearsed_episode(adapter, t, settings),
        backends,
        concurrency=concurrency,
        max_batch=max_batch,
        progress=progress,
        desc=label or f"{adapter.name}:rehearsal",
        policy=name,
    )
    records = [r if r.policy == name else replace(r, policy=name) for r in records]
    return BenchmarkRun(adapter.name, name, tuple(records), compute_metrics(records))
