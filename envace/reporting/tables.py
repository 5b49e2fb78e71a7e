"""The report's single-run tables, from the stage metrics files (``metrics/<stage>.json``).

Success % is the fraction of tasks (episodes) a model passed, per benchmark. ``Overall`` follows the
paper: the mean over BFCL-v4, τ²-Bench and VitaBench, over those of them that ran (the report names
them); ``Overall (all)`` is the mean over every benchmark that ran, the tool world included. The
benchmarks' own aggregates (BFCL's section formulas, τ² pass^k, FinMCP's tool F1) are in the
``benchmarks`` table.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from envace.core.rehearsal import scope_label

PAPER_BENCHMARKS = ("bfcl", "tau2", "vitabench")  # the paper's Overall = their mean
CONTENDERS = ("policy", "base")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def overall_columns(scores: Mapping[str, float | None]) -> dict[str, float | None]:
    """``Overall`` (paper benchmarks that ran) and ``Overall (all)`` (every benchmark that ran)."""
    ran = {b: v for b, v in scores.items() if v is not None}
    return {"Overall": _mean([v for b, v in ran.items() if b in PAPER_BENCHMARKS]),
            "Overall (all)": _mean(list(ran.values()))}


def overall_note(main: pd.DataFrame, benchmarks: Sequence[str]) -> str:
    """Which benchmarks the two Overall columns of ``main`` cover."""
    ran = [b for b in benchmarks if b in main.columns and main[b].notna().any()]
    paper = [b for b in ran if b in PAPER_BENCHMARKS]
    return (f"Overall = mean over the paper's benchmarks that ran here: {', '.join(paper) or 'none'} "
            f"(the paper: BFCL-v4, τ², VitaBench); Overall (all) = mean over {', '.join(ran) or 'none'}.")


def main_table(benchmarks: Sequence[str], labels: Mapping[str, str], m: Mapping[str, Any]) -> pd.DataFrame:
    """Method × benchmark success %, plus the two Overall columns. ``labels``: contender → row name."""
    rows = []
    for key, label in labels.items():
        scores = {}
        for bench in benchmarks:
            result = m.get(f"evaluate_{bench}", {}).get(key)
            scores[bench] = None if result is None else 100 * result["success_rate"]
        rows.append({"method": label, **scores, **overall_columns(scores)})
    return pd.DataFrame(rows, columns=["method", *benchmarks, "Overall", "Overall (all)"])


def _evaluations(m: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(benchmark, contender, its metrics) for every evaluate_* file."""
    return [(result["benchmark"], label, result[label]) for name, result in m.items()
            if name.startswith("evaluate_") for label in CONTENDERS if result.get(label)]


def benchmark_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """Each benchmark's own aggregates, one row per (benchmark, model, measure)."""
    rows: list[dict[str, Any]] = []

    def add(bench: str, label: str, measure: str, value: Any, n: Any = None) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append({"benchmark": bench, "model": label, "measure": measure, "value": value, "n": n})

    for bench, label, r in _evaluations(m):
        for name, row in (r.get("categories") or {}).items():  # BFCL per category
            if row.get("status") == "ran":
                add(bench, label, f"category:{name}", row.get("accuracy"), row.get("n"))
        for name, value in (r.get("aggregates") or {}).items():  # BFCL section formulas
            add(bench, label, f"bfcl:{name}", value)
        for key, row in (r.get("domains") or {}).items():  # τ² per domain, pass^k
            for measure in ("avg_reward", *sorted(k for k in row if k.startswith("pass^"))):
                add(bench, label, f"{key}:{measure}", row.get(measure), row.get("n_tasks"))
        overall = ((r.get("finmcp") or {}).get("overall") or {})
        for measure, value in overall.items():  # FinMCP tool P/R/F1 (macro/micro), exact match
            for sub, v in (value.items() if isinstance(value, dict) else [("", value)]):
                add(bench, label, f"finmcp:{measure}" + (f"/{sub}" if sub else ""), v)
        add(bench, label, "context_overflows", r.get("context_overflows"))
    return pd.DataFrame(rows, columns=["benchmark", "model", "measure", "value", "n"])


def domain_table(m: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for bench, label, r in _evaluations(m):
        groups = {**{f"domain:{d}": g for d, g in r.get("per_domain", {}).items()},
                  "held-out (transfer)": r.get("transfer"), "in-domain": r.get("in_domain")}
        rows += [{"benchmark": bench, "model": label, "group": g, "n": v["n"],
                  "success_%": 100 * v["success_rate"], "mean_score": v["mean_score"]}
                 for g, v in groups.items() if v]
    return pd.DataFrame(rows)


def fidelity_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """REHEARSE vs the real responses, on the calls each model made (``calls=own``) and on the oracle's
    calls (``calls=gold``, the same for every model)."""
    return pd.DataFrame([{"benchmark": bench, "model": label, "calls": calls, **r[key]}
                         for bench, label, r in _evaluations(m)
                         for calls, key in (("own", "fidelity"), ("gold", "fidelity_gold")) if r.get(key)])


def testtime_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """One row per rehearsal_sweep cell. ``scope`` shows the label of the cell's scope: task-scope rows read
    "task (sees future turns)" (their rehearsal read user turns the committed run had not reached)."""
    cells = m.get("rehearsal_sweep", {}).get("cells", [])
    cols = ["benchmark", "n_attempts", "mode", "rehearser", "scope", "success_rate", "gain_vs_none",
            "cost/rehearsal_completion_tokens", "cost/rehearsal_wall_s", "cost/real_env_calls",
            "cost/committed_executions"]
    frame = pd.DataFrame(cells)
    if frame.empty:
        return frame
    if "scope" in frame.columns:
        frame["scope"] = frame["scope"].map(lambda v: scope_label(v) if isinstance(v, str) else v)
    return frame[[c for c in cols if c in frame.columns]]


SUMMARY_KEYS = ("variant", "steps_done", "n_train_rows", "source", "n_raw", "n_train", "n_val", "n_rejected")
SUMMARY_HINTS = ("reward", "loss", "parse_fail", "time/step", "kl", "mean")


def summary_table(metrics: Mapping[str, Any]) -> pd.DataFrame:
    """Two columns (metric, value): the named keys plus rewards, losses, parse failures, means."""
    rows = [{"metric": k, "value": v} for k, v in metrics.items()
            if (k in SUMMARY_KEYS or any(h in k for h in SUMMARY_HINTS)) and isinstance(v, (int, float, str))]
    return pd.DataFrame(rows)
