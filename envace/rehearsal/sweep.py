"""The test-time rehearsal grid (SPEC §4/§5): N × mode × rehearser, on one benchmark's tasks.

``run_rehearsal_sweep`` evaluates every cell with ``evaluate_with_rehearsal``. N=0 (no rehearsal) does
not depend on the mode or the rehearser, so it is run once and reported as a single cell with
``mode="none"`` and ``rehearser="none"`` — the shared baseline of every row of the table. Cells are
returned in a fixed order: the baseline first, then by N, mode, rehearser name (as given).

Every cell's ``RehearsalConfig`` is built before the first cell runs, so a grid holding a refused cell
(``parallel`` with N > 1 at ``act_temperature`` 0) fails at once, not after the cells before it. Each
cell records its scope (``"none"`` for N=0); ``scope_label`` marks task scope as "sees future turns".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from envace.core.rehearsal import RehearsalMode, scope_label
from envace.envs.base import Task
from envace.evaluation.base import BenchmarkAdapter
from envace.evaluation.metrics import BenchmarkMetrics
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend
from envace.rehearsal.committed import evaluate_with_rehearsal
from envace.rehearsal.controller import RehearsalSettings

NONE = "none"


@dataclass(frozen=True)
class CellCosts:
    """Per-task means over a cell."""

    rehearsal_completion_tokens: float
    rehearsal_wall_s: float
    committed_wall_s: float
    real_env_calls: float
    committed_executions: float

    def to_json(self) -> dict[str, float]:
        return dict(vars(self))


@dataclass(frozen=True)
class CellResult:
    n_attempts: int
    mode: str  # "parallel" | "sequential" | "none" (N=0)
    rehearser: str  # key of the rehearsers dict, or "none" (N=0)
    metrics: BenchmarkMetrics
    costs: CellCosts
    records: tuple[EpisodeRecord, ...] = ()
    scope: str = NONE  # "turn" | "task" | "none" (N=0)

    @property
    def key(self) -> str:
        return f"n{self.n_attempts}-{self.mode}-{self.rehearser}"

    @property
    def scope_label(self) -> str:
        """``task (sees future turns)`` for task scope, else the scope itself."""
        return scope_label(self.scope)

    def to_json(self, with_records: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n_attempts": self.n_attempts,
            "mode": self.mode,
            "rehearser": self.rehearser,
            "scope": self.scope,
            "scope_label": self.scope_label,
            "metrics": self.metrics.to_json(),
            "costs": self.costs.to_json(),
        }
        if with_records:
            out["records"] = [r.to_json() for r in self.records]
        return out


def cell_costs(records: Sequence[EpisodeRecord]) -> CellCosts:
    rows = [r.info.get("rehearsal", {}).get("costs", {}) for r in records]
    n = max(1, len(records))

    def mean(key: str, default: float = 0.0) -> float:
        return sum(float(row.get(key, default)) for row in rows) / n

    return CellCosts(
        rehearsal_completion_tokens=mean("rehearsal_completion_tokens"),
        rehearsal_wall_s=mean("rehearsal_wall_s"),
        committed_wall_s=mean("committed_wall_s"),
        real_env_calls=sum(float(r.real_calls) for r in records) / n,
        committed_executions=mean("committed_executions"),
    )


def _cells(n_values: Sequence[int], modes: Sequence[str], rehearsers: Sequence[str]) -> list[tuple[int, str, str]]:
    """The grid; a negative N stays in it, so that building its ``RehearsalConfig`` refuses it."""
    grid: list[tuple[int, str, str]] = [(0, NONE, NONE)] if 0 in n_values else []
    for n in sorted({n for n in n_values if n != 0}):
        grid.extend((n, RehearsalMode(m).value, r) for m in modes for r in rehearsers)
    return grid


def run_rehearsal_sweep(
    adapter: BenchmarkAdapter,
    actor: ChatBackend,
    rehearsers: Mapping[str, ChatBackend],
    n_values: Sequence[int],
    modes: Sequence[str],
    tasks: Sequence[Task],
    settings: RehearsalSettings | None = None,
    *,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
    keep_records: bool = True,
    on_cell: Callable[[CellResult], None] | None = None,
) -> list[CellResult]:
    """Evaluate every (N, mode, rehearser) cell; N=0 once (shared baseline). ``settings``: the base
    rehearsal settings (default ``RehearsalSettings()``); each cell overrides N and the mode.
    ``on_cell`` is called with each finished cell (e.g. to log it as its own run)."""
    settings = settings or RehearsalSettings()
    if any(n != 0 for n in n_values) and (not rehearsers or not modes):
        raise ValueError("run_rehearsal_sweep: N > 0 needs at least one rehearser and one mode")
    grid = [
        (n, mode, name, replace(settings.config, n_attempts=n, mode=settings.config.mode if mode == NONE else mode))
        for n, mode, name in _cells(n_values, modes, list(rehearsers))
    ]  # every cell's config is checked (RehearsalConfig.__post_init__) before the first cell runs
    results = []
    for n, mode, name, config in grid:
        run = evaluate_with_rehearsal(
            adapter,
            actor,
            None if n == 0 else rehearsers[name],
            tasks,
            replace(settings, config=config),
            concurrency=concurrency,
            max_batch=max_batch,
            progress=progress,
            label=f"rehearsal n{n} {mode} {name}",
        )
        scope = NONE if n == 0 else config.scope.value
        records = run.records if keep_records else ()
        results.append(CellResult(n, mode, name, run.metrics, cell_costs(run.records), records, scope))
        if on_cell is not None:
            on_cell(results[-1])
    return results
