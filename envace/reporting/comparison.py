"""Cross-run tables of the report: the **ablation** (training variant × benchmark) and the **scale**
(model × benchmark) tables — success % of the trained policy per benchmark, the two Overall columns
(paper benchmarks that ran / all that ran; ``envace.reporting.tables``), the run's final training reward
(``final/reward/mean``) and the paper's reference column (``envace.reporting.reference``).

Rows: among the runs collected in ``experiments.json`` (``python -m envace.reporting.experiments collect``)
that share the current run's profile and model (ablation) or profile and variant (scale), the latest
per (variant, seed) (per (model, seed)); plus the current run from its own metrics, which replaces any
collected run of its own variant/model and seed — so a table is never empty and always describes the
workspace. A row with several seeds shows the mean over them with a bootstrap-over-seeds interval
(n = seeds); a one-seed row the run's Wilson interval over its tasks (n = episodes; ``n=?`` for a
collected run whose counts experiments.json lacks). Only measured numbers: a benchmark a run did not
evaluate stays empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from envace.reporting.experiments import SCHEMA_VERSION
from envace.reporting.intervals import bootstrap_over_seeds
from envace.reporting.reference import REFERENCE_COLUMN, ablation_reference, scale_reference
from envace.reporting.tables import PAPER_BENCHMARKS, Score, overall_columns, overall_score, rate_score

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
    n: Mapping[str, int] = field(default_factory=dict)  # episodes per benchmark, where recorded
    curves: Mapping[str, Sequence[Any]] | None = field(default=None, compare=False)
    real_env_calls: float | None = None  # real environment calls of the whole run (SFT warm-up included)


def collected_runs(doc: Mapping[str, Any] | None) -> list[RunResult]:
    """The runs of an experiments.json document, without its workspace snapshot (the current run's
    metrics stand for the workspace)."""
    if not doc:
        return []
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"experiments.json has schema_version {doc.get('schema_version')!r}, this code reads "
            f"{SCHEMA_VERSION}: regenerate it with `python -m envace.reporting.experiments collect`"
        )
    runs = []
    for entry in doc.get("experiments", []):
        if entry.get("kind") == "workspace":
            continue
        success = {bench: rates.get("policy") for bench, rates in (entry.get("success_rate") or {}).items()}
        runs.append(
            RunResult(
                run=entry["name"],
                params=entry.get("params") or {},
                success=success,
                final_reward=(entry.get("train") or {}).get("final_reward"),
                real_env_calls=(entry.get("train") or {}).get("real_env_calls"),
                timestamp=entry.get("timestamp") or "",
                curves=entry.get("curves"),
                n=entry.get("n_tasks") or {},
            )
        )
    return runs


def latest_per(runs: Sequence[RunResult], current: RunResult, *, vary: str, same: Sequence[str]) -> list[RunResult]:
    """The latest run per (value of ``vary``, seed) among ``runs`` equal to ``current`` on every ``same``
    key; ``current`` replaces the run of its own value and seed."""
    chosen: dict[Any, RunResult] = {}
    for run in sorted(runs, key=lambda r: (r.timestamp, r.run)):
        if run.params.get(vary) is not None and all(run.params.get(k) == current.params.get(k) for k in same):
            chosen[run.params[vary], run.params.get("seed")] = run
    chosen[current.params.get(vary), current.params.get("seed")] = current
    return list(chosen.values())


def _by_value(runs: Sequence[RunResult], vary: str) -> list[list[RunResult]]:
    """``runs`` grouped by their ``vary`` value, first-seen order (one group = one table row)."""
    groups: dict[Any, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.params.get(vary), []).append(run)
    return list(groups.values())


def _seed_score(values: Sequence[float | None]) -> Score:
    measured = [v for v in values if v is not None]
    if not measured:
        return Score(None, 0)
    return Score(sum(measured) / len(measured), len(measured), bootstrap_over_seeds(measured), unit="seeds")


def row_scores(group: Sequence[RunResult], benchmarks: Sequence[str]) -> dict[str, Any]:
    """One row's cells: per benchmark and the two Overall columns, over the group's seeds."""
    if len(group) == 1:
        run = group[0]
        scores = {b: rate_score(run.success.get(b), run.n.get(b)) for b in benchmarks}
        cells = {k: v for b, s in scores.items() for k, v in s.columns(b).items()}
        return {**cells, **overall_columns(scores)}
    per_seed = [{b: rate_score(r.success.get(b), r.n.get(b)) for b in benchmarks} for r in group]
    cells = {k: v for b in benchmarks for k, v in _seed_score([s[b].value for s in per_seed]).columns(b).items()}
    for name, subset in (("Overall", PAPER_BENCHMARKS), ("Overall (all)", None)):
        cells.update(_seed_score([overall_score(s, subset).value for s in per_seed]).columns(name))
    return cells


def comparison_table(
    runs: Sequence[RunResult],
    *,
    vary: str,
    label: str,
    benchmarks: Sequence[str],
    reference: Callable[[RunResult], str | None] = lambda run: None,
) -> pd.DataFrame:
    """Columns: ``label`` (the varied param), run(s), seeds, success % per benchmark and the two Overall
    columns (each with /n, /ci_low, /ci_high; ``envace.reporting.tables``), final_reward (mean over
    seeds), the paper's reference column."""
    rows = []
    for group in _by_value(runs, vary):
        rewards = [r.final_reward for r in group if r.final_reward is not None]
        rows.append(
            {
                label: group[0].params.get(vary),
                "run": ", ".join(r.run for r in group),
                "seeds": ", ".join(str(r.params.get("seed")) for r in group),
                **row_scores(group, benchmarks),
                "final_reward": sum(rewards) / len(rewards) if rewards else None,
                REFERENCE_COLUMN: reference(group[0]),
            }
        )
    return pd.DataFrame(rows)


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
    table = comparison_table(
        chosen,
        vary="algo.name",
        label="variant",
        benchmarks=benchmarks,
        reference=lambda r: ablation_reference(str(r.params.get("algo.name"))),
    )
    return table, chosen


def scale_table(runs: Sequence[RunResult], current: RunResult, benchmarks: Sequence[str]):
    """(table, runs in row order): one row per model, same profile and variant as ``current``, by size."""
    chosen = latest_per(runs, current, vary="model.name", same=("profile", "algo.name"))
    chosen.sort(key=lambda r: (model_size(str(r.params.get("model.name"))), str(r.params.get("model.name"))))
    table = comparison_table(
        chosen,
        vary="model.name",
        label="model",
        benchmarks=benchmarks,
        reference=lambda r: scale_reference(str(r.params.get("model.name")), str(r.params.get("algo.name"))),
    )
    return table, chosen
