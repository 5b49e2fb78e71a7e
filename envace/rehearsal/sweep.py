"""The test-time rehearsal grid (docs/method.md §12, §14): N × mode × rehearser, on one benchmark's tasks.

``run_rehearsal_sweep`` evaluates every cell with ``evaluate_with_rehearsal``. N=0 (no rehearsal) does
not depend on the mode or the rehearser, so it is run once and reported as a single cell with
``mode="none"`` and ``rehearser="none"`` — the shared baseline of every row of the table. Cells are
returned in a fixed order: the baseline first, then by N, mode, rehearser name (as given).

At N=1 the two modes are one program (a single attempt with no earlier attempts to read), so N=1 runs
once, in the first mode given; the other modes' N=1 cells are copies of it marked ``same_as`` (its key),
with the same outcomes and costs. ``max_n_by_mode`` leaves out the cells of a mode above its cap (e.g.
``{"sequential": 2}``; on one core, with generation reuse, sequential N=4 cost ~1.4x parallel N=4).

With ``reuse_generations`` (the default) the cells share one ``GenerationReuse``: a request some earlier
cell already asked for is answered with that cell's output (same seeds, so attempt k of N=4 is attempt k
of N=2; see ``envace.rehearsal.reuse``). Costs book every generation at what it cost when generated;
``rehearsal_reused_calls`` says how many of a cell's rehearsal generations came from an earlier cell.

Every cell's ``RehearsalConfig`` is built before the first cell runs, so a grid holding a refused cell
(``parallel`` with N > 1 at ``act_temperature`` 0) fails at once, not after the cells before it. Each
cell records its scope (``"none"`` for N=0); ``scope_label`` marks task scope as "sees future turns".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from envace.core.env import Task
from envace.core.rehearsal import RehearsalMode, scope_label
from envace.evaluation.base import BenchmarkAdapter
from envace.evaluation.metrics import BenchmarkMetrics
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend
from envace.rehearsal.committed import evaluate_with_rehearsal
from envace.rehearsal.controller import RehearsalSettings
from envace.rehearsal.oracle import OracleRehearser
from envace.rehearsal.reuse import GenerationReuse

NONE = "none"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CellCosts:
    """Per-task means over a cell."""

    rehearsal_completion_tokens: float
    rehearsal_wall_s: float
    committed_wall_s: float
    real_env_calls: float
    committed_executions: float
    rehearsal_sandbox_calls: float = 0.0  # calls the oracle rehearser ran on sandboxed copies (not real calls)
    rehearsal_generation_s: float = 0.0  # backend seconds booked to rehearsal generations (reused: original)
    rehearsal_reused_calls: float = 0.0  # rehearsal generations answered from an earlier cell of the sweep

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
    same_as: str | None = None  # the key of the cell that was run for this one (N=1 in a second mode)

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
        if self.same_as is not None:
            out["same_as"] = self.same_as
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
        rehearsal_sandbox_calls=mean("rehearsal_sandbox_calls"),
        rehearsal_generation_s=mean("rehearsal_generation_s"),
        rehearsal_reused_calls=mean("rehearsal_reused_calls"),
    )


def is_oracle(rehearser: Any) -> bool:
    """True for the oracle rehearser's marker (a sandboxed environment answers, ``envace.rehearsal.oracle``)."""
    return isinstance(rehearser, OracleRehearser)


def _cells(
    n_attempts_grid: Sequence[int],
    modes: Sequence[str],
    rehearsers: Sequence[str],
    max_n_by_mode: Mapping[str, int] | None = None,
) -> list[tuple[int, str, str, str | None]]:
    """The grid as (N, mode, rehearser, mode whose run it copies or None). A negative N stays in it, so
    that building its ``RehearsalConfig`` refuses it."""
    caps = {RehearsalMode(m).value: int(n) for m, n in (max_n_by_mode or {}).items()}
    for mode, cap in caps.items():
        if cap < 1:
            raise ValueError(f"rehearsal sweep: max_n_by_mode[{mode!r}] = {cap}; a cap must be >= 1 (or drop the mode)")
    swept = [RehearsalMode(m).value for m in modes]
    if idle := sorted(set(caps) - set(swept)):
        logger.warning(
            "rehearsal sweep: max_n_by_mode caps %s, which the sweep does not run (modes: %s); the cap has no effect",
            ", ".join(idle),
            ", ".join(swept) or "none",
        )
    grid: list[tuple[int, str, str, str | None]] = [(0, NONE, NONE, None)] if 0 in n_attempts_grid else []
    for n in sorted({n for n in n_attempts_grid if n != 0}):
        kept = [mode for mode in swept if n <= caps.get(mode, n)]
        for i, mode in enumerate(kept):
            source = kept[0] if n == 1 and i > 0 else None
            grid.extend((n, mode, r, source) for r in rehearsers)
    return grid


def run_rehearsal_sweep(
    adapter: BenchmarkAdapter,
    actor: ChatBackend,
    rehearsers: Mapping[str, ChatBackend | OracleRehearser],
    n_attempts_grid: Sequence[int],
    modes: Sequence[str],
    tasks: Sequence[Task],
    settings: RehearsalSettings | None = None,
    *,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
    keep_records: bool = True,
    on_cell: Callable[[CellResult], None] | None = None,
    max_n_by_mode: Mapping[str, int] | None = None,
    reuse_generations: bool = True,
) -> list[CellResult]:
    """Evaluate every (N, mode, rehearser) cell; N=0 once (shared baseline), N=1 once (its other modes
    are copies marked ``same_as``). ``settings``: the base rehearsal settings (default
    ``RehearsalSettings()``); each cell overrides N and the mode. ``max_n_by_mode``: per-mode caps on N.
    ``on_cell`` is called with each finished cell (e.g. to log it as its own run). ``reuse_generations``:
    answer a request an earlier cell already generated from that cell's output (False: every cell
    generates all of its requests itself)."""
    settings = settings or RehearsalSettings()
    if any(n != 0 for n in n_attempts_grid) and (not rehearsers or not modes):
        raise ValueError("run_rehearsal_sweep: N > 0 needs at least one rehearser and one mode")
    base = settings.config
    grid = [
        (n, mode, name, source, replace(base, n_attempts=n, mode=base.mode if mode == NONE else mode))
        for n, mode, name, source in _cells(n_attempts_grid, modes, list(rehearsers), max_n_by_mode)
    ]  # every cell's config is checked (RehearsalConfig.__post_init__) before the first cell runs
    reuse = GenerationReuse() if reuse_generations else None
    if reuse is not None:
        actor = reuse.wrap(actor)
        rehearsers = {name: b if is_oracle(b) else reuse.wrap(b) for name, b in rehearsers.items()}
    results: list[CellResult] = []
    for n, mode, name, source, config in grid:
        if source is not None:
            ran = next(c for c in results if (c.n_attempts, c.mode, c.rehearser) == (n, source, name))
            results.append(replace(ran, mode=mode, same_as=ran.key))
            if on_cell is not None:
                on_cell(results[-1])
            continue
        rehearser = None if n == 0 else rehearsers[name]
        run = evaluate_with_rehearsal(
            adapter,
            actor,
            None if is_oracle(rehearser) else rehearser,
            tasks,
            replace(settings, config=config, sandbox=is_oracle(rehearser)),
            concurrency=concurrency,
            max_batch=max_batch,
            progress=progress,
            label=f"rehearsal n{n} {mode} {name}",
        )
        if reuse is not None:
            logger.info("rehearsal sweep after n%d %s %s: %s so far", n, mode, name, reuse.summary())
        scope = NONE if n == 0 else config.scope.value
        records = run.records if keep_records else ()
        results.append(CellResult(n, mode, name, run.metrics, cell_costs(run.records), records, scope))
        if on_cell is not None:
            on_cell(results[-1])
    return results
