"""Cross-run tables of the report: the **ablation** (training variant × benchmark) and the **scale**
(model × benchmark) tables — success % of the trained policy per benchmark, the two Overall columns
(paper benchmarks that ran / all that ran; ``envace.reporting.tables``), and the run's final training reward (``final/reward/mean``).

Rows: among the runs collected in ``experiments.json`` (``python -m envace.experiments collect``)
that share the current run's profile and model (ablation) or profile and variant (scale), the latest
per variant (per model); plus the current run from its own metrics, which replaces any collected run
of its own variant/model — so a table is never empty and always describes the workspace. Only
measured numbers: a benchmark a run did not evaluate stays empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from envace.experiments import SCHEMA_VERSION
from envace.reporting.tables import overall_columns

ALGO_ORDER = ("grpo", "per_role", "frozen_act", "frozen_rehearse", "envace")  # the paper's ablation rows
CURRENT_RUN = "workspace"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([mb])\b", re.IGNORECASE)


@dataclass(frozen=True)
class RunResult:
    """One pipeline run as a table row: identifying params, policy success per benchmark (0-1)."""

    run: str
    params: Mapping[str, Any]
    success: Mapping[str, float | None]
    final_reward: float | None = None
    timestamp: str = ""
    curves: Mapping[str, Sequence[Any]] | None = field(default=None, compare=False)


def collected_runs(doc: Mapping[str, Any] | None) -> list[RunResult]:
    """The runs of an experiments.json document, without its workspace snapshot (the current run's
    metrics stand for the workspace)."""
    if not doc:
        return []
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"experiments.json has schema_version {doc.get('schema_version')!r}, this code reads "
                         f"{SCHEMA_VERSION}: regenerate it with `python -m envace.experiments collect`")
    runs = []
    for entry in doc.get("experiments", []):
        if entry.get("kind") == "workspace":
            continue
        success = {bench: rates.get("policy") for bench, rates in (entry.get("success_rate") or {}).items()}
        runs.append(RunResult(run=entry["name"], params=entry.get("params") or {}, success=success,
                              final_reward=(entry.get("train") or {}).get("final_reward"),
                              timestamp=entry.get("timestamp") or "", curves=entry.get("curves")))
    return runs


def latest_per(runs: Sequence[RunResult], current: RunResult, *, vary: str, same: Sequence[str]) -> list[RunResult]:
    """The latest run per value of ``vary`` among ``runs`` equal to ``current`` on every ``same`` key;
    ``current`` replaces the run of its own value."""
    chosen: dict[Any, RunResult] = {}
    for run in sorted(runs, key=lambda r: (r.timestamp, r.run)):
        if run.params.get(vary) is not None and all(run.params.get(k) == current.params.get(k) for k in same):
            chosen[run.params[vary]] = run
    chosen[current.params.get(vary)] = current
    return list(chosen.values())


def comparison_table(runs: Sequence[RunResult], *, vary: str, label: str, benchmarks: Sequence[str]) -> pd.DataFrame:
    """Columns: ``label`` (the varied param), run, success % per benchmark, the two Overall columns
    (``envace.reporting.tables.overall_columns``), final_reward."""
    rows = []
    for run in runs:
        scores = {b: None if run.success.get(b) is None else 100 * run.success[b] for b in benchmarks}
        rows.append({label: run.params.get(vary), "run": run.run, **scores, **overall_columns(scores),
                     "final_reward": run.final_reward})
    return pd.DataFrame(rows, columns=[label, "run", *benchmarks, "Overall", "Overall (all)", "final_reward"])


def _algo_rank(run: RunResult) -> tuple[int, str]:
    name = str(run.params.get("algo.name"))
    return (ALGO_ORDER.index(name) if name in ALGO_ORDER else len(ALGO_ORDER), name)


def model_size(name: str) -> float:
    """Parameters a model name states (``qwen3-1.7b`` → 1.7e9, ``smollm2-135m`` → 1.35e8); 0 if none."""
    found = _SIZE.findall(name or "")
    if not found:
        return 0.0
    number, unit = found[-1]
    return float(number) * (1e9 if unit.lower() == "b" else 1e6)


def ablation_table(runs: Sequence[RunResult], current: RunResult, benchmarks: Sequence[str]):
    """(table, runs in row order): one row per training variant, same profile and model as ``current``."""
    chosen = sorted(latest_per(runs, current, vary="algo.name", same=("profile", "model.name")), key=_algo_rank)
    return comparison_table(chosen, vary="algo.name", label="variant", benchmarks=benchmarks), chosen


def scale_table(runs: Sequence[RunResult], current: RunResult, benchmarks: Sequence[str]):
    """(table, runs in row order): one row per model, same profile and variant as ``current``, by size."""
    chosen = latest_per(runs, current, vary="model.name", same=("profile", "algo.name"))
    chosen.sort(key=lambda r: (model_size(str(r.params.get("model.name"))), str(r.params.get("model.name"))))
    return comparison_table(chosen, vary="model.name", label="model", benchmarks=benchmarks), chosen
