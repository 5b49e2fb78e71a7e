"""The report's training and data figures, and ``save_plots``, which draws every report figure.

``plot_*`` wraps a builder (``envace.reporting.figures``): it saves the figure to ``path`` and returns
None, or returns the reason it drew nothing. ``save_plots`` draws the report's figures (the test-time
ones from ``envace.reporting.testtime_plots``) and lists what it did not draw, so the report names those
instead of failing.

Inputs. Curves are DataFrames with a ``step`` column and the per-step keys of ``metrics/train.json``'s
``curves`` / ``plots/train_steps.csv`` (``reward/{mean,std}``, ``adv/<role>/{mean,std,abs_mean}``,
``loss``, ``kl``, ``grad_norm``, ``clipfrac``, ``parse_fail/<role>``, ``tokens_per_s``, ``fidelity/*``;
a per-role model adds ``<role>/<key>``), NaN where a step was not measured. Data statistics are
``stats.json``'s ``{name: {"histogram": [[value, count], ...]}}``. The reward band is ± the per-step
``reward/std`` (spread over that step's trajectories), not an interval over seeds: one run has one seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from envace.reporting.figures import draw, integer_ticks, legend_outside, new_figure
from envace.reporting.testtime_plots import TESTTIME_POINTS, plot_testtime, plot_testtime_cost, write_testtime_points

ROLES = ("act", "rehearse")
ROLE_COLORS = {"act": "tab:blue", "rehearse": "tab:orange"}
SHARED_COLOR = "0.3"  # a key measured once for both roles (one model)
FIDELITY_KEYS = ("fidelity/exact_match", "fidelity/field_f1", "fidelity/error_agreement")
STEP_LABEL = "GRPO step"
SMOOTH_STEPS = 3
# (panel title, y label, key): the training-diagnostics grid; each draws `key` and its per-role variants
ROLE_PANELS = (
    ("loss", "loss (per token)", "loss"),
    ("KL to reference", "KL (nats per token)", "kl"),
    ("gradient norm (pre-clip)", "L2 norm", "grad_norm"),
    ("clip fraction", "fraction of tokens", "clipfrac"),
    ("parse-failure rate", "fraction of outputs", "parse_fail"),
    ("throughput", "tokens / s", "tokens_per_s"),
)
DATA_STATS = {
    "user_turns": ("user turns per row", "rows"),
    "tools_per_row": ("tools per row", "rows"),
    "steps_per_turn": ("assistant steps per user turn", "turns"),
    "calls_per_turn": ("tool calls per user turn", "turns"),
    "items_per_turn": ("checklist items per user turn", "turns"),
    "variants_per_row": ("checklist variants per row", "rows"),
}


# ---- inputs ---------------------------------------------------------------------------------------


def curves_frame(curves: Mapping[str, Any] | None) -> pd.DataFrame:
    """A ``curves`` object (key -> one value per step, null = not measured) as a float DataFrame;
    lists of unequal length are padded with NaN."""
    if not curves or not curves.get("step"):
        return pd.DataFrame()
    return pd.DataFrame(
        {key: pd.Series(values, dtype=float) for key, values in curves.items() if isinstance(values, list)}
    )


def merge_curves(curves: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """train.json's curves plus the train_steps.csv columns they lack, outer-joined on step."""
    if curves.empty or "step" not in curves:
        return steps
    if steps.empty or "step" not in steps:
        return curves
    extra = [c for c in steps.columns if c not in curves.columns]
    merged = curves.merge(steps[["step", *extra]].astype({"step": float}), on="step", how="outer")
    return merged.sort_values("step", ignore_index=True)


# ---- figure helpers -------------------------------------------------------------------------------


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
        ax.fill_between(
            part["step"],
            mean - std,
            mean + std,
            color="tab:blue",
            alpha=0.15,
            label="± std over the step's trajectories",
        )
    ax.plot(part["step"], mean, "o", color="tab:blue", markersize=4, alpha=0.6, label="mean over the step's group")
    smooth = mean.rolling(SMOOTH_STEPS, center=True, min_periods=1).mean()
    ax.plot(part["step"], smooth, color="tab:blue", linewidth=2, label=f"rolling mean ({SMOOTH_STEPS} steps)")
    _step_axes(ax, "reward (checklist score, 0–1)")
    legend_outside(ax)
    return fig


def variant_reward_figure(variants: Mapping[str, pd.DataFrame]) -> Figure | str:
    """One line per training variant: reward/mean vs step."""
    drawn = {
        label: frame
        for label, frame in variants.items()
        if _measured(frame, ["step", "reward/mean"]) == ["step", "reward/mean"]
    }
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
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="upper center",
        ncol=len(handles),
        bbox_to_anchor=(0.5, 0.0),
        frameon=False,
        fontsize=9,
    )
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
        ax.plot(
            points["step"],
            points[f"adv/{role}/std"],
            marker="o",
            markersize=3,
            color=ROLE_COLORS[role],
            label=f"{role}: std",
        )
        if _measured(curves, [f"adv/{role}/abs_mean"]):
            points = _points(curves, f"adv/{role}/abs_mean")
            ax.plot(
                points["step"],
                points[f"adv/{role}/abs_mean"],
                marker="s",
                markersize=3,
                linestyle="--",
                color=ROLE_COLORS[role],
                label=f"{role}: mean |advantage|",
            )
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


# ---- data -----------------------------------------------------------------------------------------


def data_stats_figure(stats: Mapping[str, Any]) -> Figure | str:
    """One histogram per shape statistic of the training rows, one bar per integer value."""
    keys = [k for k in DATA_STATS if (stats.get(k) or {}).get("histogram")]
    if not keys:
        return "no histograms in the data statistics"
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = new_figure(
        f"Training data shape ({stats.get('n_rows', '?')} rows)", nrows, ncols, size=(3.6 * ncols, 2.9 * nrows)
    )
    for ax, key in zip(axes, keys):
        values, counts = zip(*[(int(v), int(c)) for v, c in stats[key]["histogram"]])
        xlabel, unit = DATA_STATS[key]
        ax.bar(values, counts, width=0.8, color="#4c72b0")
        ax.set_xticks(range(min(values), max(values) + 1))
        ax.set_xlim(min(values) - 0.6, max(values) + 0.6)
        integer_ticks(ax.yaxis)
        ax.set(title=xlabel, xlabel=xlabel.split(" per ")[0], ylabel=f"{unit} (count)")
        ax.title.set_fontsize(10)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


# ---- saving ---------------------------------------------------------------------------------------


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


def plot_data_stats(stats: Mapping[str, Any], path: Path) -> str | None:
    return draw(lambda: data_stats_figure(stats), path)


def efficiency_figure(table: pd.DataFrame) -> Figure | str:
    """Success (%) against the real environment calls a policy's training used, one point per policy."""
    rows = table.dropna(subset=["real_env_calls", "success"]) if not table.empty else table
    if rows.empty:
        return "no policy with both a success rate and a count of real environment calls"
    fig, (ax,) = new_figure("Success vs real environment calls used in training")
    for i, row in enumerate(rows.to_dict("records")):
        ax.scatter([row["real_env_calls"]], [row["success"]], color=f"C{i}", label=row["policy"], zorder=3)
    ax.set_xlabel("real environment calls (SFT warm-up's gold responses + RL rollouts)")
    ax.set_ylabel(f"success on {rows['benchmark'].iloc[0]} (%)")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    return fig


def plot_efficiency(table: pd.DataFrame, path: Path) -> str | None:
    return draw(lambda: efficiency_figure(table), path)


def save_plots(
    out: Path,
    *,
    steps: pd.DataFrame,
    curves: pd.DataFrame,
    variants: Mapping[str, pd.DataFrame],
    testtime: pd.DataFrame,
    efficiency: pd.DataFrame | None = None,
) -> tuple[list[str], dict[str, str]]:
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
        "success_vs_real_calls.png": lambda p: plot_efficiency(
            efficiency if efficiency is not None else pd.DataFrame(), p
        ),
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
