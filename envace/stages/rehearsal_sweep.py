"""Stage ``rehearsal_sweep``: test-time private rehearsal over N × mode × rehearser.

The trained policy acts; before its one committed execution on each task it runs N private
rehearsal attempts (``parallel`` or ``sequential``) whose tool responses come from a rehearser — the
trained model's REHEARSE role (``trained``), the baseline model's (``base``, the "SFT-start rehearser",
the paper's control: per ``eval.baseline`` the SFT warm-up's weights RL started from, or the untrained
model), or a sandboxed copy of the real environment (``oracle``, the upper bound). N=0 (no
rehearsal) is the shared baseline, run once. Rehearsal never reaches the real environment; only the
committed execution does (envace.rehearsal enforces and tests it).

Each cell is a nested MLflow run under the stage's run (params: benchmark, N, mode, rehearser, scope;
metrics: success and costs — rehearsal tokens, wall time, real-environment calls, committed executions).

``rehearsal.scope`` is ``turn`` by default (rehearse user turn t from what is known at turn t); every row
records its scope, and ``task`` scope rows carry the label "task (sees future turns)": their rehearsal
read user turns the committed execution had not reached. Every cell's ``RehearsalConfig`` is built
(``envace.config.load.rehearsal_config``) when the config loads, so a refused cell — a parallel cell with N > 1
at ``rehearsal.act_temperature`` 0 — fails there, before any cell runs.

Outputs in ``paths.rehearsal/<benchmark>``: ``cells.json`` (metrics and costs per cell) and one
``<cell>.records.jsonl`` per cell; metrics (the grid over ``rehearsal.benchmarks``, with the gain over
each benchmark's N=0) in ``paths.metrics/rehearsal_sweep.json``. ``cells`` is keyed by a stable cell name,
``<benchmark>/<mode>/n<N>/<rehearser>`` (``envace.reporting.sweep_layout``), so that DVC sees every cell's
numbers (``cells.toolworld/parallel/n2/trained.success_rate``); the cells' strings (mode, rehearser, scope)
are in ``rehearsal_sweep.details.json`` at the same keys, and ``envace.stages.report.load_metrics`` turns
the merged dict back into the list of rows the tables read (``sweep_layout.cells_list``). ``precision`` (details
file): what the models ran at (``eval.precision``, ``auto`` reusing the training run's:
``envace.stages.common.eval_precision``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from envace.config.load import rehearsal_config, to_plain
from envace.config.schema import Config
from envace.inference.preflight import preflight
from envace.rehearsal import RehearsalSettings, run_rehearsal_sweep
from envace.rehearsal.oracle import ORACLE_REHEARSER
from envace.reporting.sweep_layout import keyed_cells
from envace.stages.common import backends_precision, base_backend, trained_backend
from envace.stages.runner import NULL_TRACKER, Tracker, configure_torch, stage_main
from envace.stages.suites import eval_suite, make_adapter, suite_tasks
from envace.tracking.traces import trace_episodes
from envace.utils.io import atomic_dir, write_json, write_jsonl

logger = logging.getLogger(__name__)

# rehearser name -> what answers imagined tool calls (envace.config.enums.Rehearser)
# `base`: the SFT-start rehearser, the baseline model's REHEARSE role (eval.baseline: the SFT warm-up's weights,
# or the untrained model without one); `oracle`: a sandboxed copy of the real environment
REHEARSERS = {
    "trained": lambda cfg: trained_backend(cfg, "rehearse"),
    "base": lambda cfg: base_backend(cfg, "rehearse"),
    "oracle": lambda cfg: ORACLE_REHEARSER,
}


def rehearsal_settings(cfg: Config) -> RehearsalSettings:
    """The grid's base settings (N=0; each cell sets its own N and mode) from the typed ``rehearsal`` section."""
    return RehearsalSettings(
        config=rehearsal_config(cfg.rehearsal, cfg.seed), context_tokens=cfg.rollout.rehearse_context_tokens
    )


def cost_metrics(cell: Any) -> dict[str, float]:
    return {f"cost/{k}": v for k, v in cell.costs.to_json().items()}


def grid_rows(cells: list[Any], benchmark: str) -> list[dict[str, Any]]:
    """One flat row per cell, with the success gain over the benchmark's N=0 baseline."""
    baseline = next((c.metrics.success_rate for c in cells if c.n_attempts == 0), None)
    rows = []
    for cell in cells:
        row = {
            "benchmark": benchmark,
            "cell": cell.key,
            "n_attempts": cell.n_attempts,
            "mode": cell.mode,
            "rehearser": cell.rehearser,
            "scope": cell.scope,
            "scope_label": cell.scope_label,
            "success_rate": cell.metrics.success_rate,
            "mean_score": cell.metrics.mean_score,
            **cost_metrics(cell),
        }
        if getattr(cell, "same_as", None):
            row["same_as"] = cell.same_as  # N=1 in a second mode: the same program, run once
        if baseline is not None:
            row["gain_vs_none"] = cell.metrics.success_rate - baseline
        rows.append(row)
    return rows


def log_cell(tracker: Tracker, benchmark: str, cell: Any, cfg: Config | None = None) -> None:
    """One nested MLflow run per cell: its setting as params, its score and costs as metrics."""
    with tracker.nested(f"{benchmark}/{cell.key}", {"envace.cell": cell.key, "envace.benchmark": benchmark}) as run:
        run.log_params(
            {
                "benchmark": benchmark,
                "n_attempts": cell.n_attempts,
                "mode": cell.mode,
                "rehearser": cell.rehearser,
                "scope": cell.scope,
            }
        )
        run.log_metrics({**cell.metrics.flat(), **cost_metrics(cell)})
    if getattr(cell, "same_as", None):
        return  # a copy of a cell run (and traced) just before: its episodes are already on the run
    # a few episodes per cell as traces on the stage's run (tracking.max_traces per stage run in all)
    trace_episodes(
        cfg,
        tracker,
        cell.records,
        share=10,
        stage="rehearsal_sweep",
        benchmark=benchmark,
        cell=cell.key,
        n_attempts=cell.n_attempts,
        mode=cell.mode,
    )


def run(cfg: Config, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    preflight(cfg, "rehearsal_sweep")  # the benchmarks' user-simulator/judge endpoints answer, before models load
    configure_torch(cfg)
    r = cfg.rehearsal
    rehearsers = {name: REHEARSERS[name](cfg) for name in to_plain(r.rehearsers)}
    actor = trained_backend(cfg, "act")
    out = Path(cfg.paths.rehearsal)
    rows: list[dict[str, Any]] = []
    n_tasks: dict[str, int] = {}
    with atomic_dir(out) as tmp:
        for benchmark in to_plain(r.benchmarks):
            (tmp / benchmark).mkdir(parents=True, exist_ok=True)
            suite = eval_suite(cfg, benchmark, "rehearsal")
            adapter = make_adapter(cfg, suite)
            tasks = suite_tasks(
                cfg,
                suite,
                adapter,
                who="rehearsal_sweep",
                fix=f"set eval.suites.{benchmark}.split or rehearsal.split",
            )
            cells = run_rehearsal_sweep(
                adapter,
                actor,
                rehearsers,
                list(r.n_attempts_grid),
                to_plain(r.modes),
                tasks,
                rehearsal_settings(cfg),
                concurrency=r.concurrency,
                max_n_by_mode=to_plain(r.max_n_by_mode),
                on_cell=lambda cell, b=benchmark: log_cell(tracker, b, cell, cfg),
            )
            rows += grid_rows(cells, benchmark)
            n_tasks[benchmark] = len(tasks)
            write_json(tmp / benchmark / "cells.json", [c.to_json() for c in cells])
            for cell in cells:
                write_jsonl(tmp / benchmark / f"{cell.key}.records.jsonl", (rec.to_json() for rec in cell.records))
            logger.info("rehearsal_sweep: %d cells on %d %s tasks", len(cells), len(tasks), benchmark)
    tracker.log_artifact(out, "rehearsal")
    return {
        "benchmarks": list(n_tasks),
        "n_tasks": n_tasks,
        "precision": backends_precision(actor, *rehearsers.values()),
        "cells": keyed_cells(rows),
    }


main = stage_main("rehearsal_sweep", run)

if __name__ == "__main__":
    raise SystemExit(main())
