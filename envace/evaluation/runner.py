"""Run a policy over a benchmark's tasks: batched, crash-isolated, with a progress bar.

``run_programs`` is the generic driver (used by evaluation and by the rehearsal sweep): one program per
task, at most ``concurrency`` in flight (their generations are batched per seat), and every program that
raises becomes an ``EpisodeRecord.failed`` with the error — a crash never aborts the benchmark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tqdm.auto import tqdm

from envace.core.env import Task
from envace.evaluation.base import BenchmarkAdapter
from envace.evaluation.metrics import BenchmarkMetrics, compute_metrics
from envace.evaluation.programs import ACTOR, Failed, Program, drive, gather
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchmarkRun:
    benchmark: str
    policy: str
    records: tuple[EpisodeRecord, ...]
    metrics: BenchmarkMetrics

    def predictions(self) -> list[dict[str, Any]]:
        """JSON-able per-task records (one JSONL line each)."""
        return [r.to_json() for r in self.records]


def backend_name(backend: ChatBackend) -> str:
    return str(getattr(backend, "name", type(backend).__name__))


def run_programs(
    adapter: BenchmarkAdapter,
    tasks: Sequence[Task],
    make_program: Callable[[Task], Program[EpisodeRecord]],
    backends: Mapping[str, ChatBackend],
    *,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
    desc: str = "evaluate",
    policy: str = "",
) -> list[EpisodeRecord]:
    """One record per task, in task order; crashed tasks become failed records."""
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency}: must be >= 1")
    bar = tqdm(total=len(tasks), desc=desc, disable=not progress, leave=False)

    def on_done(i: int, result: Any) -> None:
        if isinstance(result, Failed):
            logger.warning("task %s failed: %s", tasks[i].task_id, result.error)
        bar.update(1)

    programs = (_guarded(make_program, task) for task in tasks)
    try:
        results = drive(gather(programs, isolate=True, limit=concurrency, on_done=on_done), backends, max_batch)
    finally:
        bar.close()
    records = []
    for task, result in zip(tasks, results):
        if isinstance(result, Failed):
            result = EpisodeRecord.failed(
                adapter.name, task, result.error, policy=policy, info={"traceback": result.traceback}
            )
        records.append(result)
    return records


def _guarded(make_program: Callable[[Task], Program[EpisodeRecord]], task: Task) -> Program[EpisodeRecord]:
    """Build the task's program lazily, so an error while building it is isolated too."""
    record = yield from make_program(task)
    return record


def evaluate(
    adapter: BenchmarkAdapter,
    policy: ChatBackend,
    tasks: Sequence[Task],
    *,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
) -> BenchmarkRun:
    """Plain evaluation of ``policy`` (no rehearsal) on ``tasks``."""
    name = backend_name(policy)
    records = run_programs(
        adapter,
        tasks,
        lambda t: adapter.episode_program(t),
        {ACTOR: policy},
        concurrency=concurrency,
        max_batch=max_batch,
        progress=progress,
        desc=f"{adapter.name}:{name}",
        policy=name,
    )
    records = [_with_policy(r, name) for r in records]
    return BenchmarkRun(adapter.name, name, tuple(records), compute_metrics(records))


def _with_policy(record: EpisodeRecord, policy: str) -> EpisodeRecord:
    return record if record.policy == policy else replace(record, policy=policy)
