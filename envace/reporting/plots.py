"""The report's PNG plots. Each ``plot_*`` draws one figure into ``path`` and returns None, or returns
why it drew nothing (no such data in these metrics) — the report lists those reasons instead of
failing. ``save_plots`` draws them all.

Curves are DataFrames with a ``step`` column and the per-step keys of ``metrics/train.json``'s
``curves`` / ``plots/train_steps.csv`` (``reward/mean``, ``adv/<role>/{mean,std,abs_mean}``,
``fidelity/{exact_match,field_f1,error_agreement}``), NaN where a step was not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

ROLES = ("act", "rehearse")
FIDELITY_KEYS = ("fidelity/exact_match", "fidelity/field_f1", "fidelity/error_agreement")


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


def _measured(frame: pd.DataFrame, columns) -> list[str]:
    return [c for c in columns if c in frame.columns and frame[c].notna().any()]


def _figure(title: str, xlabel: str, ylabel: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig, ax


def _save(fig, ax, path: Path) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_training_curve(steps: pd.DataFrame, path: Path) -> str | None:
    """The current run's reward columns per step (up to four)."""
    columns = [c for c in steps.columns if "reward" in c][:4]
    if steps.empty or not columns:
        return "no per-step reward in plots/train_steps.csv"
    ax = steps.plot(x="step", y=columns, figsize=(6, 3.5), title="training reward per step")
    _save(ax.figure, ax, path)
    return None


def plot_reward_per_variant(variants: Mapping[str, pd.DataFrame], path: Path) -> str | None:
    """One line per training variant: reward/mean vs step."""
    drawn = {label: frame for label, frame in variants.items() if _measured(frame, ["step", "reward/mean"]) == ["step", "reward/mean"]}
    if not drawn:
        return "no variant has a per-step reward/mean"
    fig, ax = _figure("training reward per variant", "step", "reward/mean")
    for label, frame in drawn.items():
        points = frame[["step", "reward/mean"]].dropna()
        ax.plot(points["step"], points["reward/mean"], marker="o", markersize=3, label=label)
    _save(fig, ax, path)
    return None


def plot_advantages(curves: pd.DataFrame, path: Path) -> str | None:
    """Per role: advantage mean with a ±std band, and |advantage| mean (dashed) when recorded."""
    roles = [r for r in ROLES if _measured(curves, [f"adv/{r}/mean", f"adv/{r}/std"]) == [f"adv/{r}/mean", f"adv/{r}/std"]]
    if "step" not in curves or not roles:
        return "no adv/<role>/mean and adv/<role>/std columns in this run's training metrics"
    fig, ax = _figure("per-role advantage statistics", "step", "advantage")
    for role, color in zip(roles, ("tab:blue", "tab:orange")):
        part = curves[["step", f"adv/{role}/mean", f"adv/{role}/std"]].dropna()
        mean, std = part[f"adv/{role}/mean"], part[f"adv/{role}/std"]
        ax.plot(part["step"], mean, color=color, marker="o", markersize=3, label=f"{role} mean")
        ax.fill_between(part["step"], mean - std, mean + std, color=color, alpha=0.2, label=f"{role} ± std")
        if _measured(curves, [f"adv/{role}/abs_mean"]):
            absolute = curves[["step", f"adv/{role}/abs_mean"]].dropna()
            ax.plot(absolute["step"], absolute[f"adv/{role}/abs_mean"], color=color, linestyle="--",
                    label=f"{role} |adv| mean")
    _save(fig, ax, path)
    return None


def plot_fidelity(curves: pd.DataFrame, path: Path) -> str | None:
    """World-model fidelity (REHEARSE vs real execution) at the steps where it was measured."""
    columns = _measured(curves, FIDELITY_KEYS)
    if "step" not in curves or not columns:
        return "no fidelity/* values over training in this run's metrics (not measured)"
    fig, ax = _figure("world-model fidelity over training", "step", "score")
    for column in columns:
        points = curves[["step", column]].dropna()
        ax.plot(points["step"], points[column], marker="o", markersize=3, label=column.split("/", 1)[1])
    ax.set_ylim(-0.02, 1.02)
    _save(fig, ax, path)
    return None


def plot_testtime(cells: pd.DataFrame, path: Path) -> str | None:
    """Success vs private rehearsal attempts N, one line per (benchmark, mode, rehearser), from N=0."""
    if cells.empty:
        return "no rehearsal_sweep cells"
    fig, ax = _figure("test-time rehearsal", "private rehearsal attempts N", "success rate")
    cells = cells if "benchmark" in cells.columns else cells.assign(benchmark="")
    several = cells.benchmark.nunique() > 1
    for bench, rows in cells.groupby("benchmark", sort=True):
        base = rows[rows.n_attempts == 0].success_rate
        for (mode, who), group in rows[rows.n_attempts > 0].groupby(["mode", "rehearser"]):
            start = base.iloc[:1] if len(base) else group.success_rate.iloc[:1]
            label = f"{bench}: {mode}, {who} rehearser" if several else f"{mode}, {who} rehearser"
            ax.plot([0, *group.n_attempts], [*start, *group.success_rate], marker="o", label=label)
    _save(fig, ax, path)
    return None


def save_plots(out: Path, *, steps: pd.DataFrame, curves: pd.DataFrame, variants: Mapping[str, pd.DataFrame],
               testtime: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """Draw every plot into ``out``: (files written, {file not written: why})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs: dict[str, Callable[[Path], str | None]] = {
        "training_curve.png": lambda p: plot_training_curve(steps, p),
        "reward_per_variant.png": lambda p: plot_reward_per_variant(variants, p),
        "advantages_per_role.png": lambda p: plot_advantages(curves, p),
        "fidelity_over_training.png": lambda p: plot_fidelity(curves, p),
        "testtime.png": lambda p: plot_testtime(testtime, p),
    }
    made, skipped = [], {}
    try:
        for name, draw in jobs.items():
            reason = draw(out / name)
            if reason is None:
                made.append(name)
            else:
                skipped[name] = reason
    finally:
        plt.close("all")
    return made, skipped
