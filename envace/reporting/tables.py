"""The report's single-run tables, from the stage metrics files (``metrics/<stage>.json``).

Success % is the fraction of tasks (episodes) a model passed, per benchmark. ``Overall`` follows the
paper: the mean over BFCL-v4, τ²-Bench and VitaBench, over those of them that ran (the report names
them); ``Overall (all)`` is the mean over every benchmark that ran, the tool world included. The
benchmarks' own aggregates (BFCL's section formulas, τ² pass^k, FinMCP's tool F1) are in the
``benchmarks`` table.

Every scored column ``c`` comes with ``c/n`` (episodes behind it), ``c/ci_low`` and ``c/ci_high`` (its 95%
interval, ``envace.reporting.intervals``; same unit as ``c``), and in the main table ``c/overflows``
(episodes that ended in a context overflow) and ``c/status`` ("not runnable offline", "not run", or
empty). The CSVs keep these columns; ``render_markdown`` folds them into one cell:
``12.5 [2.2, 47.1] (n=8)``, ``— (n=0)`` where nothing was measured. A measure with n = 0 is empty (NaN),
never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from envace.core.rehearsal import scope_label
from envace.reporting.intervals import bootstrap_overall, successes, wilson
from envace.reporting.reference import REFERENCE_COLUMN, main_reference, testtime_reference
from envace.reporting.sweep_layout import REHEARSER_LABELS

PAPER_BENCHMARKS = ("bfcl", "tau2", "vitabench")  # the paper's Overall = their mean
CONTENDERS = ("policy", "base")
NOT_RUNNABLE = "not runnable offline"
NOT_RUN = "not run"
DASH = "—"
SUFFIXES = ("/n", "/ci_low", "/ci_high", "/overflows", "/status", "/unit")


@dataclass(frozen=True)
class Score:
    """One table cell: ``value`` and its interval ``ci`` in the table's unit, over ``n`` episodes (or
    ``n`` seeds: ``unit``); ``overflows`` of them were context overflows; ``status`` when not scored."""

    value: float | None
    n: int | None
    ci: tuple[float, float] | None = None
    overflows: int = 0
    status: str = ""
    unit: str = ""

    def columns(self, name: str, *, flags: bool = False) -> dict[str, Any]:
        lo, hi = self.ci if self.ci else (None, None)
        out = {
            name: self.value if self.n != 0 else None,
            f"{name}/n": self.n,
            f"{name}/ci_low": lo,
            f"{name}/ci_high": hi,
        }
        if self.unit:
            out[f"{name}/unit"] = self.unit
        return {**out, f"{name}/overflows": self.overflows, f"{name}/status": self.status} if flags else out


def rate_score(rate: float | None, n: int | None, *, scale: float = 100.0, **kwargs: Any) -> Score:
    """A binary success rate over ``n`` episodes with its Wilson interval, times ``scale``."""
    if rate is None or n == 0:
        return Score(None, n or 0, **kwargs)
    if n is None:  # a rate whose count was not recorded (older collected runs): no interval
        return Score(scale * rate, None, **kwargs)
    ci = wilson(successes(rate, n), n)
    return Score(scale * rate, n, (scale * ci[0], scale * ci[1]) if ci else None, **kwargs)


def not_runnable(result: Mapping[str, Any]) -> bool:
    """A contender whose benchmark needs what is absent offline (VitaBench without its endpoints)."""
    return str((result.get("status_info") or {}).get("status", "")).startswith("needs ")


def contender_score(m: Mapping[str, Any], bench: str, contender: str) -> Score:
    """``contender``'s success % on ``bench`` from ``evaluate_<bench>.json``."""
    doc = m.get(f"evaluate_{bench}") or {}
    result = doc.get(contender)
    if not result:
        return Score(None, 0, status=NOT_RUN)
    recorded = result.get("n_tasks", doc.get("n_tasks"))
    n = None if recorded is None else int(recorded)  # None: a file without counts (value shown, "n=?")
    overflows = int(result.get("context_overflows") or 0)
    if not_runnable(result):
        return Score(None, n, overflows=overflows, status=NOT_RUNNABLE)
    parts = len(doc.get("not_runnable") or {})
    status = f"{parts} part(s) {NOT_RUNNABLE}" if parts else ""
    return rate_score(result.get("success_rate"), n, overflows=overflows, status=status)


def overall_score(scores: Mapping[str, Score], benchmarks: Sequence[str] | None = None) -> Score:
    """Mean over ``benchmarks`` (all if None) that were scored, with the stratified task bootstrap when
    every one of them has its counts (n known, one run)."""
    ran = [s for b, s in scores.items() if s.value is not None and (benchmarks is None or b in benchmarks)]
    if not ran:
        return Score(None, 0)
    counted = all(s.n and not s.unit for s in ran)
    ci = bootstrap_overall([(successes(s.value / 100, s.n), s.n) for s in ran]) if counted else None
    return Score(
        sum(s.value for s in ran) / len(ran),
        sum(s.n for s in ran) if counted else None,
        (100 * ci[0], 100 * ci[1]) if ci else None,
    )


def overall_columns(scores: Mapping[str, Score]) -> dict[str, Any]:
    """``Overall`` (paper benchmarks that ran) and ``Overall (all)`` (every benchmark that ran)."""
    return {
        **overall_score(scores, PAPER_BENCHMARKS).columns("Overall"),
        **overall_score(scores).columns("Overall (all)"),
    }


def overall_note(main: pd.DataFrame, benchmarks: Sequence[str]) -> str:
    """Which benchmarks the two Overall columns of ``main`` cover, and how the intervals are computed."""
    ran = [b for b in benchmarks if b in main.columns and main[b].notna().any()]
    paper = [b for b in ran if b in PAPER_BENCHMARKS]
    return (
        f"Overall = mean over the paper's benchmarks that ran here: {', '.join(paper) or 'none'} "
        f"(the paper: BFCL-v4, τ², VitaBench); Overall (all) = mean over {', '.join(ran) or 'none'}. " + INTERVAL_NOTE
    )


INTERVAL_NOTE = (
    "Cells: success % [95% interval] (n = episodes). Single-benchmark intervals are Wilson score "
    "intervals from (successes, n) — a task's success is binary, so the counts are all the per-task "
    "information; the Overall intervals are a seeded percentile bootstrap over tasks, resampled within "
    "each benchmark (2000 resamples; a point when every task had the same outcome). `overflow` = "
    "episodes that ended in a context overflow (the prompt exceeded the model's context window), "
    "of n. `—` = nothing measured (n = 0)."
)


def main_table(
    benchmarks: Sequence[str], labels: Mapping[str, str], m: Mapping[str, Any], variant: str = ""
) -> pd.DataFrame:
    """Method × benchmark success % (with n, interval, overflows, status), the two Overall columns and
    the paper's reference column. ``labels``: contender → row name; ``variant``: the policy's algo."""
    rows = []
    for key, label in labels.items():
        scores = {bench: contender_score(m, bench, key) for bench in benchmarks}
        cells = {k: v for bench, s in scores.items() for k, v in s.columns(bench, flags=True).items()}
        rows.append(
            {
                "method": label,
                "contender": key,
                **cells,
                **overall_columns(scores),
                REFERENCE_COLUMN: main_reference(key, variant),
            }
        )
    return pd.DataFrame(rows)


def _evaluations(m: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(benchmark, contender, its metrics) for every evaluate_* file."""
    return [
        (result["benchmark"], label, result[label])
        for name, result in m.items()
        if name.startswith("evaluate_")
        for label in CONTENDERS
        if result.get(label)
    ]


def benchmark_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """Each benchmark's own aggregates, one row per (benchmark, model, measure); rates over n episodes
    carry a Wilson interval, section formulas and F1s (no per-task values in the metrics) do not."""
    rows: list[dict[str, Any]] = []

    def add(bench: str, label: str, measure: str, value: Any, n: Any = None, binary: bool = False) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ci = wilson(successes(value, n), n) if binary and n else None
            rows.append(
                {
                    "benchmark": bench,
                    "model": label,
                    "measure": measure,
                    "value": value,
                    "n": n,
                    "ci_low": ci[0] if ci else None,
                    "ci_high": ci[1] if ci else None,
                }
            )

    for bench, label, r in _evaluations(m):
        for name, row in (r.get("categories") or {}).items():  # BFCL per category
            if row.get("status") == "ran":
                add(bench, label, f"category:{name}", row.get("accuracy"), row.get("n"), binary=True)
        for name, value in (r.get("aggregates") or {}).items():  # BFCL section formulas
            add(bench, label, f"bfcl:{name}", value)
        for key, row in (r.get("domains") or {}).items():  # τ² per domain, pass^k
            for measure in ("avg_reward", *sorted(k for k in row if k.startswith("pass^"))):
                add(bench, label, f"{key}:{measure}", row.get(measure), row.get("n_tasks"))
        overall = (r.get("finmcp") or {}).get("overall") or {}
        for measure, value in overall.items():  # FinMCP tool P/R/F1 (macro/micro), exact match
            for sub, v in value.items() if isinstance(value, dict) else [("", value)]:
                add(bench, label, f"finmcp:{measure}" + (f"/{sub}" if sub else ""), v)
        add(bench, label, "context_overflows", r.get("context_overflows"), r.get("n_tasks"))
    return pd.DataFrame(rows, columns=["benchmark", "model", "measure", "value", "n", "ci_low", "ci_high"])


def domain_table(m: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for bench, label, r in _evaluations(m):
        groups = {
            **{f"domain:{d}": g for d, g in r.get("per_domain", {}).items()},
            "held-out (transfer)": r.get("transfer"),
            "in-domain": r.get("in_domain"),
        }
        rows += [
            {
                "benchmark": bench,
                "model": label,
                "group": g,
                **rate_score(v["success_rate"], v["n"]).columns("success_%"),
                "mean_score": v["mean_score"],
            }
            for g, v in groups.items()
            if v
        ]
    return pd.DataFrame(rows)


FIDELITY_RATES = ("exact_match", "error_agreement", "parse_failure_rate")  # binary per pair: Wilson


def fidelity_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """REHEARSE vs the real responses, on the calls each model made (``calls=own``) and on the oracle's
    calls (``calls=gold``, the same for every model). Measures with n = 0 are empty, not 0; the binary
    ones carry a Wilson interval, ``field_f1`` (a mean of per-pair F1s, not in the metrics) none."""
    rows = []
    for bench, label, r in _evaluations(m):
        for calls, key in (("own", "fidelity"), ("gold", "fidelity_gold")):
            stats = r.get(key)
            if not stats:
                continue
            n = int(stats.get("n") or 0)
            row: dict[str, Any] = {"benchmark": bench, "model": label, "calls": calls, "n": n}
            for measure in FIDELITY_RATES:  # n: the row's
                row.update(
                    {
                        k: v
                        for k, v in rate_score(stats.get(measure), n, scale=1.0).columns(measure).items()
                        if k != f"{measure}/n"
                    }
                )
            row["field_f1"] = stats.get("field_f1") if n else None
            rows.append(row)
    return pd.DataFrame(rows)


def _sweep_rows(sweep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rehearsal sweep's cells, whether listed or keyed by cell name."""
    cells = sweep.get("cells") or []
    if isinstance(cells, Mapping):
        return [{"cell": name, **cell} for name, cell in cells.items()]
    return list(cells)


TESTTIME_COLS = [
    "benchmark",
    "n_attempts",
    "mode",
    "rehearser",
    "scope",
    "success_rate",
    "success_rate/n",
    "success_rate/ci_low",
    "success_rate/ci_high",
    "gain_vs_none",
    "cost/rehearsal_completion_tokens",
    "cost/rehearsal_wall_s",
    "cost/real_env_calls",
    "cost/rehearsal_sandbox_calls",
    "cost/committed_executions",
    REFERENCE_COLUMN,
]


def testtime_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """One row per rehearsal_sweep cell: success rate (0-1) with n (tasks of its benchmark) and its Wilson
    interval, costs, and the paper's N=2 row where one matches. ``scope`` shows the label of the cell's
    scope: task-scope rows read "task (sees future turns)" (their rehearsal read user turns the committed
    run had not reached)."""
    sweep = m.get("rehearsal_sweep", {})
    frame = pd.DataFrame(_sweep_rows(sweep))
    if frame.empty:
        return frame
    if "scope" in frame.columns:
        frame["scope"] = frame["scope"].map(lambda v: scope_label(v) if isinstance(v, str) else v)
    n_tasks = sweep.get("n_tasks") or {}
    scores = [
        rate_score(row.get("success_rate"), row.get("n", n_tasks.get(row.get("benchmark"))), scale=1.0)
        for row in frame.to_dict("records")
    ]
    for key in ("success_rate/n", "success_rate/ci_low", "success_rate/ci_high"):
        frame[key] = [s.columns("success_rate")[key] for s in scores]
    frame[REFERENCE_COLUMN] = [
        testtime_reference(int(r["n_attempts"]), str(r["mode"]), str(r["rehearser"])) for r in frame.to_dict("records")
    ]
    frame["rehearser"] = frame["rehearser"].map(lambda v: REHEARSER_LABELS.get(v, v))
    return frame[[c for c in TESTTIME_COLS if c in frame.columns]]


SUMMARY_KEYS = ("variant", "steps_done", "n_train_rows", "source", "n_raw", "n_train", "n_val", "n_rejected")
SUMMARY_HINTS = ("reward", "loss", "parse_fail", "time/step", "kl", "mean")


def summary_table(metrics: Mapping[str, Any]) -> pd.DataFrame:
    """Two columns (metric, value): the named keys plus rewards, losses, parse failures, means."""
    rows = [
        {"metric": k, "value": v}
        for k, v in metrics.items()
        if (k in SUMMARY_KEYS or any(h in k for h in SUMMARY_HINTS)) and isinstance(v, (int, float, str))
    ]
    return pd.DataFrame(rows)


def stable_metrics(main: pd.DataFrame) -> dict[str, float | None]:
    """The main table as metrics whose keys do not change with the model or variant (the display labels
    go to the run's tags, ``report.label.<contender>``): ``overall/<contender>`` and ``overall_all/…``
    with ``/ci_low``, ``/ci_high``; ``success/<contender>/<benchmark>`` with ``/n``, ``/overflows``."""
    out: dict[str, float | None] = {}
    benchmarks = [c.removesuffix("/overflows") for c in main.columns if c.endswith("/overflows")]
    for row in main.to_dict("records"):
        for bench in benchmarks:  # success/<contender>/<benchmark> (%), its n and context overflows
            for suffix in ("", "/n", "/overflows"):
                value = row.get(bench + suffix)
                out[f"success/{row['contender']}/{bench}{suffix}"] = None if pd.isna(value) else float(value)
        for column, key in (("Overall", "overall"), ("Overall (all)", "overall_all")):
            for suffix in ("", "/ci_low", "/ci_high"):
                value = row.get(column + suffix)
                out[f"{key}/{row['contender']}{suffix}"] = None if pd.isna(value) else float(value)
    return out


# ---- markdown ---------------------------------------------------------------------------------------
def _number(value: Any, decimals: int | None = None) -> str:
    if decimals is not None:
        return f"{value:.{decimals}f}"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def format_cell(row: Mapping[str, Any], name: str, decimals: int = 1) -> str:
    """``12.5 [2.2, 47.1] (n=8)``, with ``; 3/8 overflow`` or a status; ``—`` where n = 0."""
    value, n, status = row.get(name), row.get(f"{name}/n", row.get("n")), row.get(f"{name}/status") or ""
    unit = row.get(f"{name}/unit") if isinstance(row.get(f"{name}/unit"), str) else ""
    count = "?" if n is None or pd.isna(n) else int(n)
    flags = [f"n={count}{' ' + unit if unit else ''}"]
    overflows = row.get(f"{name}/overflows")
    if overflows and not pd.isna(overflows):
        flags.append(f"{int(overflows)}/{count} overflow")
    if status == NOT_RUNNABLE:
        return f"{NOT_RUNNABLE} ({'; '.join(flags)})"
    if status and status != NOT_RUN:
        flags.append(status)
    if value is None or pd.isna(value):
        return f"{DASH} ({'; '.join(flags)})" if count else DASH
    lo, hi = row.get(f"{name}/ci_low"), row.get(f"{name}/ci_high")
    interval = "" if lo is None or pd.isna(lo) else f" [{_number(lo, decimals)}, {_number(hi, decimals)}]"
    return f"{_number(value, decimals)}{interval} ({'; '.join(flags)})"


def render_markdown(frame: pd.DataFrame, decimals: int = 1) -> str:
    """The frame as a markdown table, each scored column's n / interval / flags folded into its cell
    (``decimals`` places: 1 for percentages, 3 for fractions), ``—`` for empty values."""
    if frame.empty:
        return "_no data_"
    scored = [c for c in frame.columns if f"{c}/ci_low" in frame.columns]
    hidden = {f"{c}{s}" for c in scored for s in SUFFIXES}
    records = frame.to_dict("records")
    out = pd.DataFrame(
        {
            c: [format_cell(r, c, decimals) if c in scored else _plain(r[c]) for r in records]
            for c in frame.columns
            if c not in hidden
        }
    )
    return out.to_markdown(index=False)


def _plain(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return DASH
    if isinstance(value, float):
        return _number(value)
    return str(value)
