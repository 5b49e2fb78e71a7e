"""Fidelity probe sets: real (call, response) episodes on which REHEARSE is asked for the responses.

``oracle_probe_set(adapter, tasks)`` plays the oracle policy (the tasks' gold calls and answers) on the
adapter's real environment once: every call it makes is executed for real, so the records carry the
true responses. ``measure_fidelity(backend, probe_set.records, probe_set.tasks)`` then scores any
REHEARSE model on them — the training engine does so periodically to track fidelity over training.
A ``ValidationSet`` is the other in-training probe's input: an adapter and tasks the policy plays for real.
Deterministic: the oracle draws nothing and the executors are fresh per episode.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from envace.core.env import Task
from envace.evaluation.base import BenchmarkAdapter
from envace.evaluation.policies import OracleBackend
from envace.evaluation.records import EpisodeRecord
from envace.evaluation.runner import evaluate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeSet:
    """Episodes with real responses (``records``) and their tasks (REHEARSE sees tools and user turns)."""

    records: tuple[EpisodeRecord, ...]
    tasks: tuple[Task, ...]

    @property
    def n_calls(self) -> int:
        """Real calls in the records (what one probe asks REHEARSE about, stand-ins aside)."""
        return sum(
            1
            for r in self.records
            if not r.crashed
            for t in r.turns
            for i in range(min(len(t.tool_calls), len(t.responses)))
            if i not in t.stand_ins
        )


@dataclass(frozen=True)
class ValidationSet:
    """Tasks a policy plays during training on ``adapter``'s real environment (the local engine's task-success
    probe, ``envace.engines.local.validation``)."""

    adapter: BenchmarkAdapter
    tasks: tuple[Task, ...]
    concurrency: int = 8  # episodes in flight (their generations are batched)
    prefix_cache_tokens: int = 32768  # the backend's KV prefix cache across turns (0 = off)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("ValidationSet: no tasks; pass at least one validation task")
        if self.concurrency < 1:
            raise ValueError(f"ValidationSet: concurrency must be >= 1, got {self.concurrency}")


def oracle_probe_set(adapter: BenchmarkAdapter, tasks: Sequence[Task]) -> ProbeSet:
    """The oracle's episodes on ``tasks`` against ``adapter``'s real executor (no model involved): the
    adapter's own oracle (``adapter.oracle``), else one replaying ``task.gold_calls``."""
    if not tasks:
        raise ValueError("oracle_probe_set: no tasks; pass at least one task with gold calls")
    oracle = adapter.oracle(tasks) or OracleBackend(tasks, name="oracle", make_executor=adapter.real_executor)
    records = evaluate(adapter, oracle, tasks, progress=False).records
    failed = [r.task_id for r in records if not r.success]
    if failed:
        logger.warning(
            "oracle_probe_set: the oracle did not succeed on %s (gold data or step budget); their "
            "calls are still real and are probed",
            failed,
        )
    probe_set = ProbeSet(tuple(records), tuple(tasks))
    if probe_set.n_calls == 0:
        raise ValueError(
            f"oracle_probe_set: the oracle made no tool call on tasks {[t.task_id for t in tasks]}; "
            "fidelity needs tasks with gold calls"
        )
    return probe_set
