"""Evaluate a policy on BFCL-v4 categories and report per category, with bfcl's own aggregates.

``run_bfcl`` = ``envace.evaluation.evaluate`` (batched, crash-isolated, progress bar, bounded
concurrency) plus what BFCL reporting needs: memory prerequisites played first, a status for every
category of the subset (``ran`` / ``not_runnable_offline`` with the reason), per-category accuracy
(crashed tasks count as failures) and ``scoring.bfcl_summary`` over the categories that ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envace.envs.bfcl.adapter import BfclAdapter, category_counts, category_table
from envace.envs.bfcl.categories import CATEGORIES
from envace.envs.bfcl.scoring import bfcl_summary
from envace.evaluation.programs import ACTOR, drive
from envace.evaluation.runner import BenchmarkRun, evaluate
from envace.inference.base import ChatBackend


@dataclass(frozen=True)
class BfclReport:
    run: BenchmarkRun
    categories: dict[str, dict[str, Any]]  # category → status, reason, n, correct, crashed, accuracy
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.run.policy,
            "categories": self.categories,
            "summary": self.summary,
            "metrics": self.run.metrics.to_json(),
        }


def run_bfcl(
    policy: ChatBackend,
    subset: str = "offline",
    *,
    limit: int | None = None,
    seed: int = 0,
    adapter: BfclAdapter | None = None,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
    adapter_kwargs: Mapping[str, Any] | None = None,
) -> BfclReport:
    """Evaluate ``policy`` on the categories of ``subset`` (``limit`` tasks per category)."""
    adapter = adapter or BfclAdapter(**dict(adapter_kwargs or {}))
    tasks = adapter.tasks(subset, limit=limit, seed=seed)
    drive(adapter.prepare_program(tasks), {ACTOR: policy}, max_batch)
    run = evaluate(adapter, policy, tasks, concurrency=concurrency, max_batch=max_batch, progress=progress)
    records = list(run.records)
    return BfclReport(run, category_table(subset, records), bfcl_summary(category_counts(records)))


__all__ = ["CATEGORIES", "BfclReport", "category_counts", "category_table", "run_bfcl"]
