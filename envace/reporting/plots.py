"""The pipeline's PNG figures, all drawn here with matplotlib (Agg, no pyplot state).

Each ``*_figure`` builder takes plain frames and returns a titled ``Figure`` with labelled axes, or a
string saying why there is nothing to draw (no such data in these metrics). ``plot_*`` wraps a builder:
it saves the figure to ``path`` and returns None, or returns the reason. ``save_plots`` draws the
report's figures and lists what it did not draw, so the report names those instead of failing.
Conventions: legends sit outside the axes (right of them, or below a grid), saved with
``bbox_inches="tight"``; step and N axes have integer ticks; count axes use integer locators.

Inputs. Curves are DataFrames with a ``step`` column and the per-step keys of ``metrics/train.json``'s
``curves`` / ``plots/train_steps.csv`` (``reward/{mean,std}``, ``adv/<role>/{mean,std,abs_mean}``,
``loss``, ``kl``, ``grad_norm``, ``clipfrac``, ``parse_fail/<role>``, ``tokens_per_s``, ``fidelity/*``;
a per-role model adds ``<role>/<key>``), NaN where a step was not measured. Sweep cells come from
``metrics/rehearsal_sweep.json`` (``sweep_cells``). Data statistics are ``stats.json``'s
``{name: {"histogram": [[value, count], ...]}}``.

Intervals. The test-time plots show a 95% bootstrap interval over tasks when a cell carries its
per-task scores (``scores``), else a 95% Wilson interval from the success count (rate × n tasks);
the legend says which. The reward band is ± the per-step ``reward/std`` (spread over that step's
trajectories), not an interval over seeds: one run has one seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from envace.reporting import intervals

ROLES = ("act", "rehearse")
ROLE_COLORS = {"act": "tab:blue", "rehearse": "tab:orange"}
SHARED_COLOR = "0.3"  # a key measured once for both roles (one model)
FIDELITY_KEYS = ("fidelity/exact_match", "fidelity/field_f1", "fidelity/error_agreement")
STEP_LABEL = "GRPO step"
SMOOTH_STEPS = 3
# (panel title, y label, key): the training-diagnostics grid; each draws `key` and its per-role variants
ROLE_PANELS = (("loss", "loss (per token)", "loss"), ("KL to reference", "KL (nats per token)", "kl"),
               ("gradient norm (pre-clip)", "L2 norm", "grad_norm"),
               ("clip fraction", "fraction of tokens", "clipfrac"),
               ("parse-failure rate", "fraction of outputs", "parse_fail"),
               ("throughput", "tokens / s", "tokens_per_s"))
COST_AXES = {"cost/rehearsal_completion_tokens": "rehearsal completion tokens (mean per task)",
             "cost/rehearsal_wall_s": "rehearsal wall time (s, mean per task)"}
DATA_STATS = {"user_turns": ("user turns per row", "rows"), "tools_per_row": ("tools per row", "rows"),
              "steps_per_turn": ("assistant steps per user turn", "turns"),
              "calls_per_turn": ("tool calls per user turn", "turns"),
              "items_per_turn": ("checklist items per user turn", "turns"),
              "variants_per_row": ("checklist variants per row", "rows")}


# ---- inputs ---------------------------------------------------------------------------------------


def curves_frame(curves: Mapping[str, Any] | None) -> pd.DataFrame:
    """A ``curves`` object (key -> one value per step, null = not measured) as a float DataFrame;
    lists of unequal length are padded with NaN."""
    if not curves or not curves.get("step"):
        return pd.DataFrame()
    return pd.DataFrame({key: pd.Series(values, dtype=float) for key, values in curves.items()
                         if isinstance(values, list)})


def merge_curves(curves: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """train.json's curves plus the train_steps.csv columns they lack, outer-joined on step."""
    if curves.empty or "step" not in curves:
        return steps
    if steps.empty or "step" not in steps:
        return curves
    extra = [c for c in steps.columns if c not in curves.columns]
    merged = curves.merge(steps[["step", *extra]].astype({"step": float}), on="step", how="outer")
    return merged.sort_values("step", ignore_index=True)


CELL_NAME = re.compile(r"^(?P<benchmark>[^/]+)/(?P<mode>[^/]+)/n(?P<n_attempts>\d+)/(?P<rehearser>[^/]+)$")


def _cell_rows(cells: Any) -> list[dict[str, Any]]:
    """Flat cell rows from a list of cells or from cells keyed by name (``<benchmark>/<mode>/n<N>/<rehearser>``,
    ``envace.stages.rehearsal_sweep.cell_name``); a cell's own fields win over what its name says."""
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
        bounds = [wilson_interval(round(r * k), k) if pd.notna(k) else (math.nan, math.nan)
                  for r, k in zip(cells["success_rate"], n)]
        method = "95% Wilson (binomial, n tasks)"
    low, high = zip(*bounds) if bounds else ((), ())
    return cells.assign(low=list(low), high=list(high)), method


# ---- figure helpers -------------------------------------------------------------------------------


def new_figure(title: str, nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6.4, 3.6)):
    """A figure with an Agg canvas (no pyplot) and its axes (a flat array when there are several)."""
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    fig.suptitle(title)
    return fig, axes


def legend_outside(ax) -> None:
    """The axes' legend to the right of it, outside the data (nothing when there are no labels)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=8, frameon=False)


def integer_ticks(axis) -> None:
    axis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")


def _measured(frame: pd.DataFrame, columns) -> list[str]:
    return [c for c in columns if c in frame.columns and frame[c].notna().any()]


def _points(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[["step", column]].dropna()


def _step_axes(ax, ylabel: str) -> None:
    ax.set(xlabel=STEP_LABEL, ylabel=ylabel)
    integer_ticks(ax.xaxis)
    ax.grid(alpha=0.3)


# ---- training -------------------------------------------------------------------------------------


def reward_figure(steps: pd.DataFrame) -> Figure | str:
    """Reward per step: the per-step mean, its rolling mean, and ± the step's reward std."""
    if "step" not in steps or not _measured(steps, ["reward/mean"]):
        return "no per-step reward/mean in plots/train_steps.csv"
    cols = ["step", "reward/mean", *_measured(steps, ["reward/std"])]
    part = steps[cols].dropna(subset=["reward/mean"])
    fig, (ax,) = new_figure("Training reward per step")
    mean = part["reward/mean"]
    if "reward/std" in part:
        std = part["reward/std"].fillna(0.0)
        ax.fill_between(part["step"], mean - std, mean + std, color="tab:blue", alpha=0.15,
                        label="± std over the step's trajectories")
    ax.plot(part["step"], mean, "o", color="tab:blue", markersize=4, alpha=0.6, label="mean over the step's group")
    smooth = mean.rolling(SMOOTH_STEPS, center=True, min_periods=1).mean()
    ax.plot(part["step"], smooth, color="tab:blue", linewidth=2, label=f"rolling mean ({SMOOTH_STEPS} steps)")
    _step_axes(ax, "reward (checklist score, 0–1)")
    legend_outside(ax)
    return fig


def variant_reward_figure(variants: Mapping[str, pd.DataFrame]) -> Figure | str:
    """One line per training variant: reward/mean vs step."""
    drawn = {label: frame for label, frame in variants.items()
             if _measured(frame, ["step", "reward/mean"]) == ["step", "reward/mean"]}
    if not drawn:
        return "no variant has a per-step reward/mean"
    fig, (ax,) = new_figure("Training reward per variant")
    for label, frame in drawn.items():
        points = _points(frame, "reward/mean")
        ax.plot(points["step"], points["reward/mean"], marker="o", markersize=3, label=label)
    _step_axes(ax, "mean reward (0–1)")
    legend_outside(ax)
    return fig


def _role_series(curves: pd.DataFrame, key: str) -> list[tuple[str, str, str]]:
    """(column, label, colour) of ``key``: shared, per role part (key/role), per role model (role/key)."""
    shared = "generation tokens/s (both roles)" if key == "tokens_per_s" else "both roles (one value per step)"
    color = "tab:purple" if key == "tokens_per_s" else SHARED_COLOR
    found = [(key, shared, color)] if _measured(curves, [key]) else []
    for role in ROLES:
        for column, label in ((f"{key}/{role}", role.upper()), (f"{role}/{key}", f"{role.upper()} model")):
            if _measured(curves, [column]):
                found.append((column, label, ROLE_COLORS[role]))
    return found


def role_panels_figure(curves: pd.DataFrame) -> Figure | str:
    """A grid of training diagnostics (ROLE_PANELS), per role where the run records them per role."""
    series = {key: _role_series(curves, key) for _, _, key in ROLE_PANELS}
    if "step" not in curves or not any(series.values()):
        return "no loss, KL, grad-norm, clip, parse-failure or throughput columns in this run's training metrics"
    fig, axes = new_figure("Training diagnostics per role", 2, 3, size=(11, 5.6))
    for ax, (title, ylabel, key) in zip(axes, ROLE_PANELS):
        ax.set_title(title, fontsize=10)
        _step_axes(ax, ylabel)
        for column, label, color in series[key] + THROUGHPUT_EXTRA.get(key, []):
            if _measured(curves, [column]):
                points = _points(curves, column)
                ax.plot(points["step"], points[column], marker="o", markersize=3, color=color, label=label)
        _panel_note(ax, curves, [c for c, _, _ in series[key]], key)
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles),
               bbox_to_anchor=(0.5, 0.0), frameon=False, fontsize=9)
    fig.tight_layout()
    return fig


THROUGHPUT_EXTRA = {"tokens_per_s": [("update/tokens_per_s", "update tokens/s (throughput panel)", "tab:green")]}


def _panel_note(ax, curves: pd.DataFrame, columns: list[str], key: str) -> None:
    """Say in the panel when its key was not recorded, or was 0 at every step (the line alone hides it)."""
    note = "" if ax.lines else f"not recorded\n(no `{key}` column)"
    if columns and all((curves[c].dropna() == 0).all() for c in columns):
        note = "0 at every step"
    if note:
        ax.text(0.5, 0.62, note, ha="center", va="center", transform=ax.transAxes, color="0.35", fontsize=9)


def advantage_figure(curves: pd.DataFrame) -> Figure | str:
    """Per role: the advantage std (solid) and mean |advantage| (dashed). Means are not drawn: the
    group baseline centres them at 0 by construction; the title says so when the data agree."""
    roles = [r for r in ROLES if _measured(curves, [f"adv/{r}/std"])]
    if "step" not in curves or not roles:
        return "no adv/<role>/std columns in this run's training metrics"
    means = [curves[f"adv/{r}/mean"].abs().max() for r in roles if _measured(curves, [f"adv/{r}/mean"])]
    centred = bool(means) and max(means) < 1e-6
    title = "Per-role advantage spread" + (" (means are 0: centred per group)" if centred else "")
    fig, (ax,) = new_figure(title)
    for role in roles:
        points = _points(curves, f"adv/{role}/std")
        ax.plot(points["step"], points[f"adv/{role}/std"], marker="o", markersize=3, color=ROLE_COLORS[role],
                label=f"{role}: std")
        if _measured(curves, [f"adv/{role}/abs_mean"]):
            points = _points(curves, f"adv/{role}/abs_mean")
            ax.plot(points["step"], points[f"adv/{role}/abs_mean"], marker="s", markersize=3, linestyle="--",
                    color=ROLE_COLORS[role], label=f"{role}: mean |advantage|")
    _step_axes(ax, "advantage (reward units)")
    ax.set_ylim(bottom=0)
    legend_outside(ax)
    return fig


def fidelity_figure(curves: pd.DataFrame) -> Figure | str:
    """World-model fidelity (REHEARSE vs real execution) at the steps where it was measured."""
    columns = _measured(curves, FIDELITY_KEYS)
    if "step" not in curves or not columns:
        return "no fidelity/* values over training in this run's metrics (not measured)"
    calls = curves["fidelity/n_calls"].dropna().unique() if "fidelity/n_calls" in curves else []
    note = f" ({int(calls[0])} real calls per probe)" if len(calls) == 1 else ""
    fig, (ax,) = new_figure("World-model fidelity over training" + note)
    for column in columns:
        points = _points(curves, column)
        ax.plot(points["step"], points[column], marker="o", markersize=4, label=column.split("/", 1)[1])
    _step_axes(ax, "agreement with real responses (0–1)")
    ax.set_ylim(-0.03, 1.03)
    legend_outside(ax)
    return fig


# ---- test time ------------------------------------------------------------------------------------


SERIES_STYLE = {"parallel": ("o", "-", "none"), "sequential": ("s", "--", None)}  # marker, line, face
REHEARSER_COLORS = {"trained": "tab:blue", "base": "tab:orange"}
INTERVAL_NOTE = "bars: {method}"


def _series(cells: pd.DataFrame):
    """(index, label, rows with N > 0, matplotlib style) per rehearsing (mode, rehearser) series. Parallel
    markers are hollow and larger, so a sequential point at the same place stays visible inside them."""
    for i, ((mode, who), rows) in enumerate(cells[cells.n_attempts > 0].groupby(["mode", "rehearser"])):
        marker, line, face = SERIES_STYLE.get(mode, ("^", ":", None))
        color = REHEARSER_COLORS.get(who, f"C{i + 2}")
        style = {"color": color, "marker": marker, "linestyle": line, "markersize": 8 if face else 5,
                 "markerfacecolor": face or color, "markeredgewidth": 1.5}
        yield i, f"{mode}, {who} rehearser", rows.sort_values("n_attempts"), style


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
    fig.legend(handles, labels, title=INTERVAL_NOTE.format(method=method), loc="upper center", ncol=3,
               bbox_to_anchor=(0.5, 0.0), fontsize=8, title_fontsize=8, frameon=False)


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
    fig, axes = new_figure("Test-time rehearsal: success vs attempts N", 1, len(benches),
                           size=(5.6 * len(benches), 3.8))
    for ax, bench in zip(axes, benches):
        rows = cells[cells.benchmark == bench]
        base = rows[rows.n_attempts == 0]
        series = list(_series(rows))
        for i, label, part, style in series:
            shift = 0.07 * (i - (len(series) - 1) / 2)
            if len(base):  # a faint link from the shared baseline to the series' first N
                ax.plot([0, part.n_attempts.iloc[0] + shift], [base.success_rate.iloc[0], part.success_rate.iloc[0]],
                        color=style["color"], linestyle=style["linestyle"], alpha=0.4, linewidth=1)
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
        ax.annotate("N=" + ",".join(map(str, sorted(values))), (x, y), textcoords="offset points",
                    xytext=(4, -lift - 6 if y > 0.5 else lift), fontsize=7, color="0.25")


def testtime_cost_figure(cells: pd.DataFrame) -> Figure | str:
    """Success vs what rehearsal cost (completion tokens, wall seconds), one point per cell, each series'
    points joined in order of N; labels name N."""
    costs = [c for c in COST_AXES if not cells.empty and c in cells and cells[c].notna().any()]
    if cells.empty or "success_rate" not in cells or not costs:
        return "no rehearsal_sweep cells with cost/rehearsal_* fields"
    cells, method = cell_intervals(cells)
    several = cells["benchmark"].nunique() > 1
    fig, axes = new_figure("Test-time rehearsal: success vs rehearsal cost", 1, len(costs),
                           size=(5.2 * len(costs), 3.8))
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


# ---- data -----------------------------------------------------------------------------------------


def data_stats_figure(stats: Mapping[str, Any]) -> Figure | str:
    """One histogram per shape statistic of the training rows, one bar per integer value."""
    keys = [k for k in DATA_STATS if (stats.get(k) or {}).get("histogram")]
    if not keys:
        return "no histograms in the data statistics"
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = new_figure(f"Training data shape ({stats.get('n_rows', '?')} rows)", nrows, ncols,
                           size=(3.6 * ncols, 2.9 * nrows))
    for ax, key in zip(axes, keys):
        values, counts = zip(*[(int(v), int(c)) for v, c in stats[key]["histogram"]])
        xlabel, unit = DATA_STATS[key]
        ax.bar(values, counts, width=0.8, color="#4c72b0")
        ax.set_xticks(range(min(values), max(values) + 1))
        ax.set_xlim(min(values) - 0.6, max(values) + 0.6)
        integer_ticks(ax.yaxis)
        ax.set(title=xlabel, xlabel=xlabel.split(" per ")[0], ylabel=f"{unit} (count)")
        ax.title.set_fontsize(10)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


# ---- saving ---------------------------------------------------------------------------------------


def draw(build: Callable[[], Figure | str], path: Path) -> str | None:
    """Build one figure and save it to ``path``: None, or the builder's reason for not drawing it."""
    figure = build()
    if isinstance(figure, str):
        return figure
    save_figure(figure, path)
    return None


def plot_training_curve(steps: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: reward_figure(steps), path)


def plot_reward_per_variant(variants: Mapping[str, pd.DataFrame], path: Path) -> str | None:
    return draw(lambda: variant_reward_figure(variants), path)


def plot_role_panels(curves: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: role_panels_figure(curves), path)


def plot_advantages(curves: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: advantage_figure(curves), path)


def plot_fidelity(curves: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: fidelity_figure(curves), path)


def plot_testtime(cells: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: testtime_figure(cells), path)


def plot_testtime_cost(cells: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: testtime_cost_figure(cells), path)


def plot_data_stats(stats: Mapping[str, Any], path: Path) -> str | None:
    return draw(lambda: data_stats_figure(stats), path)


TESTTIME_POINTS = "testtime_points.csv"  # the test-time figure's points, for `dvc plots show`


def write_testtime_points(cells: pd.DataFrame, path: Path) -> None:
    """One row per sweep cell: what ``testtime.png`` draws, with its interval (``dvc.yaml`` plots it)."""
    cells, method = cell_intervals(cells)
    frame = cells.assign(series=cells["mode"] + "/" + cells["rehearser"], interval=method)
    cols = ["benchmark", "series", "n_attempts", "success_rate", "low", "high", "n", *COST_AXES, "interval"]
    frame[[c for c in cols if c in frame]].to_csv(path, index=False)


def save_plots(out: Path, *, steps: pd.DataFrame, curves: pd.DataFrame, variants: Mapping[str, pd.DataFrame],
               testtime: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """Draw every report figure into ``out``: (files written, {file not written: why}). ``testtime`` is
    ``sweep_cells(...)``; when it has cells their points also go to ``testtime_points.csv``."""
    jobs: dict[str, Callable[[Path], str | None]] = {
        "training_curve.png": lambda p: plot_training_curve(steps, p),
        "training_per_role.png": lambda p: plot_role_panels(curves, p),
        "reward_per_variant.png": lambda p: plot_reward_per_variant(variants, p),
        "advantages_per_role.png": lambda p: plot_advantages(curves, p),
        "fidelity_over_training.png": lambda p: plot_fidelity(curves, p),
        "testtime.png": lambda p: plot_testtime(testtime, p),
        "testtime_cost.png": lambda p: plot_testtime_cost(testtime, p),
    }
    made, skipped = [], {}
    for name, job in jobs.items():
        reason = job(out / name)
        if reason is None:
            made.append(name)
        else:
            skipped[name] = reason
    if "testtime.png" in made:
        write_testtime_points(testtime, out / TESTTIME_POINTS)
    return made, skipped
