"""The test-time figures: success of the rehearsal sweep's cells against attempts N and against what
rehearsal cost, with an interval per cell, and the points ``dvc plots`` reads.

Sweep cells come from ``metrics/rehearsal_sweep.json`` (``sweep_cells``). The plots show a 95% bootstrap
interval over tasks when a cell carries its per-task scores (``scores``), else a 95% Wilson interval from
the success count (rate × n tasks); the legend says which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from envace.reporting import intervals
from envace.reporting.figures import draw, new_figure
from envace.reporting.sweep_layout import CELL_NAME, REHEARSER_LABELS

COST_AXES = {
    "cost/rehearsal_completion_tokens": "rehearsal completion tokens (mean per task)",
    "cost/rehearsal_wall_s": "rehearsal wall time (s, mean per task)",
}


# ---- inputs ---------------------------------------------------------------------------------------


def _cell_rows(cells: Any) -> list[dict[str, Any]]:
    """Flat cell rows from a list of cells or from cells keyed by name (``<benchmark>/<mode>/n<N>/<rehearser>``,
    ``envace.reporting.sweep_layout.cell_name``); a cell's own fields win over what its name says."""
    if isinstance(cells, list):
        return [dict(c) for c in cells]
    rows = []
    for name, cell in (cells or {}).items():
        parsed = CELL_NAME.match(str(name))
        rows.append({**(parsed.groupdict() if parsed else {}), **cell})
    return rows


def sweep_cells(sweep: Mapping[str, Any] | None) -> pd.DataFrame:
    """The rehearsal sweep's cells as one row each, with ``n`` (tasks per cell) where known."""
    frame = pd.DataFrame(_cell_rows((sweep or {}).get("cells")))
    if frame.empty or "success_rate" not in frame:
        return pd.DataFrame()
    frame = frame.assign(n_attempts=frame["n_attempts"].astype(int))
    if "benchmark" not in frame:
        frame["benchmark"] = ""
    n_tasks = (sweep or {}).get("n_tasks") or {}
    if "n" not in frame and isinstance(n_tasks, Mapping):
        frame["n"] = frame["benchmark"].map(n_tasks)
    return frame


# ---- intervals ------------------------------------------------------------------------------------


def wilson_interval(successes: float, n: float) -> tuple[float, float]:
    """Wilson score interval for a binomial rate (``intervals.wilson``); (nan, nan) when n is 0 or unknown."""
    if not n or not math.isfinite(n):
        return math.nan, math.nan
    return intervals.wilson(int(round(successes)), int(n)) or (math.nan, math.nan)


def bootstrap_interval(scores: Sequence[float]) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over tasks (``intervals.bootstrap_over_seeds``)."""
    if len(scores) == 0:
        return math.nan, math.nan
    if len(scores) == 1:
        return float(scores[0]), float(scores[0])
    return intervals.bootstrap_over_seeds(list(scores)) or (math.nan, math.nan)


def cell_intervals(cells: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``cells`` with ``low``/``high`` columns, and the name of the interval used."""
    if "scores" in cells and cells["scores"].map(lambda s: isinstance(s, list) and len(s) > 0).all():
        bounds = [bootstrap_interval(s) for s in cells["scores"]]
        method = "95% bootstrap over tasks"
    else:
        n = cells["n"] if "n" in cells else pd.Series(math.nan, index=cells.index)
        bounds = [
            wilson_interval(round(r * k), k) if pd.notna(k) else (math.nan, math.nan)
            for r, k in zip(cells["success_rate"], n)
        ]
        method = "95% Wilson (binomial, n tasks)"
    low, high = zip(*bounds) if bounds else ((), ())
    return cells.assign(low=list(low), high=list(high)), method


# ---- figures --------------------------------------------------------------------------------------


SERIES_STYLE = {"parallel": ("o", "-", "none"), "sequential": ("s", "--", None)}  # marker, line, face
REHEARSER_COLORS = {"trained": "tab:blue", "base": "tab:orange", "oracle": "tab:green"}
INTERVAL_NOTE = "bars: {method}"


def _series(cells: pd.DataFrame):
    """(index, label, rows with N > 0, matplotlib style) per rehearsing (mode, rehearser) series. Parallel
    markers are hollow and larger, so a sequential point at the same place stays visible inside them."""
    for i, ((mode, who), rows) in enumerate(cells[cells.n_attempts > 0].groupby(["mode", "rehearser"])):
        marker, line, face = SERIES_STYLE.get(mode, ("^", ":", None))
        color = REHEARSER_COLORS.get(who, f"C{i + 2}")
        style = {
            "color": color,
            "marker": marker,
            "linestyle": line,
            "markersize": 8 if face else 5,
            "markerfacecolor": face or color,
            "markeredgewidth": 1.5,
        }
        yield i, f"{mode}, {REHEARSER_LABELS.get(who, who)} rehearser", rows.sort_values("n_attempts"), style


def _errorbar(ax, x, rows: pd.DataFrame, **style) -> None:
    y = rows["success_rate"].to_numpy(float)
    err = np.vstack([y - rows["low"].to_numpy(float), rows["high"].to_numpy(float) - y])
    ax.errorbar(x, y, yerr=None if np.isnan(err).all() else err, capsize=3, elinewidth=1, **style)


def _baseline(ax, base: pd.DataFrame, x) -> None:
    if len(base):
        _errorbar(ax, x, base, color="black", marker="D", markersize=5, linestyle="none", label="no rehearsal (N=0)")


def _legend_below(fig, ax, method: str) -> None:
    """One legend for the figure, under its axes, titled with the interval the bars show."""
    handles, labels = ax.get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(
        handles,
        labels,
        title=INTERVAL_NOTE.format(method=method),
        loc="upper center",
        ncol=3,
        bbox_to_anchor=(0.5, 0.0),
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )


def _success_axes(ax, xlabel: str) -> None:
    ax.set(xlabel=xlabel, ylabel="success rate (fraction of tasks)", ylim=(-0.05, 1.08))
    ax.grid(alpha=0.3)


def _tasks_note(rows: pd.DataFrame) -> str:
    n = rows["n"].dropna().unique() if "n" in rows else []
    return f" (n = {int(n[0])} task{'s' if int(n[0]) != 1 else ''})" if len(n) == 1 else ""


def testtime_figure(cells: pd.DataFrame) -> Figure | str:
    """Success vs private rehearsal attempts N per (mode, rehearser), one panel per benchmark; series are
    shifted a little along x so that equal values stay visible; N=0 is the shared baseline."""
    if cells.empty or "success_rate" not in cells:
        return "no rehearsal_sweep cells"
    cells, method = cell_intervals(cells)
    benches = sorted(cells["benchmark"].unique())
    fig, axes = new_figure(
        "Test-time rehearsal: success vs attempts N", 1, len(benches), size=(5.6 * len(benches), 3.8)
    )
    for ax, bench in zip(axes, benches):
        rows = cells[cells.benchmark == bench]
        base = rows[rows.n_attempts == 0]
        series = list(_series(rows))
        for i, label, part, style in series:
            shift = 0.07 * (i - (len(series) - 1) / 2)
            if len(base):  # a faint link from the shared baseline to the series' first N
                ax.plot(
                    [0, part.n_attempts.iloc[0] + shift],
                    [base.success_rate.iloc[0], part.success_rate.iloc[0]],
                    color=style["color"],
                    linestyle=style["linestyle"],
                    alpha=0.4,
                    linewidth=1,
                )
            _errorbar(ax, part.n_attempts + shift, part, label=label, **style)
        _baseline(ax, base, base.n_attempts)
        ax.set_title(f"{bench or 'sweep'}{_tasks_note(rows)}", fontsize=10)
        _success_axes(ax, "private rehearsal attempts N")
        ax.set_xticks(sorted(rows.n_attempts.unique()))
    _legend_below(fig, axes[0], method)
    return fig


def _label_points(ax, xs, ys, ns) -> None:
    """One "N=..." label per distinct point (points within 2% of the x span share it); neighbours at the
    same height alternate above and further above, so their labels do not overlap."""
    points = sorted(zip(map(float, xs), map(float, ys), map(int, ns)))
    tolerance = 0.02 * (max(x for x, _, _ in points) - min(x for x, _, _ in points) or 1.0) if points else 0
    groups: list[list[Any]] = []  # [x, y, {N}]
    for x, y, n in points:
        same = next((g for g in groups if g[1] == y and abs(g[0] - x) <= tolerance), None)
        if same:
            same[2].add(n)
        else:
            groups.append([x, y, {n}])
    for rank, (x, y, values) in enumerate(sorted(groups, key=lambda g: (g[1], g[0]))):
        lift = 6 + 9 * (rank % 2)
        ax.annotate(
            "N=" + ",".join(map(str, sorted(values))),
            (x, y),
            textcoords="offset points",
            xytext=(4, -lift - 6 if y > 0.5 else lift),
            fontsize=7,
            color="0.25",
        )


def testtime_cost_figure(cells: pd.DataFrame) -> Figure | str:
    """Success vs what rehearsal cost (completion tokens, wall seconds), one point per cell, each series'
    points joined in order of N; labels name N."""
    costs = [c for c in COST_AXES if not cells.empty and c in cells and cells[c].notna().any()]
    if cells.empty or "success_rate" not in cells or not costs:
        return "no rehearsal_sweep cells with cost/rehearsal_* fields"
    cells, method = cell_intervals(cells)
    several = cells["benchmark"].nunique() > 1
    fig, axes = new_figure(
        "Test-time rehearsal: success vs rehearsal cost", 1, len(costs), size=(5.2 * len(costs), 3.8)
    )
    for ax, cost in zip(axes, costs):
        for _, label, part, style in _series(cells):
            for bench, rows in part.groupby("benchmark"):
                _errorbar(ax, rows[cost], rows, label=f"{bench}: {label}" if several else label, **style)
        rehearsed = cells[cells.n_attempts > 0]
        _label_points(ax, rehearsed[cost], rehearsed.success_rate, rehearsed.n_attempts)
        _baseline(ax, cells[cells.n_attempts == 0], cells[cells.n_attempts == 0][cost])
        _success_axes(ax, COST_AXES[cost])
        ax.set_xlim(left=-0.04 * float(cells[cost].max() or 1))
        ax.margins(x=0.1)
    axes[0].set_title("each point: one cell" + _tasks_note(cells), fontsize=10)
    _legend_below(fig, axes[0], method)
    return fig


# ---- saving ---------------------------------------------------------------------------------------


def plot_testtime(cells: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: testtime_figure(cells), path)


def plot_testtime_cost(cells: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: testtime_cost_figure(cells), path)


TESTTIME_POINTS = "testtime_points.csv"  # the test-time figure's points, for `dvc plots show`


def write_testtime_points(cells: pd.DataFrame, path: Path) -> None:
    """One row per sweep cell: what ``testtime.png`` draws, with its interval (``dvc.yaml`` plots it)."""
    cells, method = cell_intervals(cells)
    frame = cells.assign(series=cells["mode"] + "/" + cells["rehearser"], interval=method)
    cols = ["benchmark", "series", "n_attempts", "success_rate", "low", "high", "n", *COST_AXES, "interval"]
    frame[[c for c in cols if c in frame]].to_csv(path, index=False)
