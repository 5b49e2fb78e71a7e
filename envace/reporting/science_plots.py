"""The science report's figures: test success per model, training curves per variant, test-time
success against the number of rehearsal attempts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from envace.reporting.figures import integer_ticks, legend_outside, new_figure
from envace.reporting.science_stats import SUBSETS

# per-step curves drawn per variant (mean over seeds, band = min..max over seeds): (key, title, y label)
CURVES = (
    ("val/success", "validation success (real environment, greedy)", "success rate (0-1)"),
    ("reward/mean", "reward per step", "reward (0-1)"),
    ("loss/act", "ACT loss", "loss per token"),
    ("loss/rehearse", "REHEARSE loss", "loss per token"),
    ("kl", "KL to reference", "nats per token"),
    ("grad_norm", "gradient norm (pre-clip)", "L2 norm"),
    ("clipfrac", "clip fraction", "fraction"),
    ("parse_fail/act", "ACT parse failures", "fraction of outputs"),
    ("parse_fail/rehearse", "REHEARSE parse failures", "fraction of outputs"),
    ("fidelity/field_f1", "REHEARSE fidelity: field F1", "F1 (0-1)"),
    ("fidelity/error_agreement", "REHEARSE fidelity: error agreement", "agreement (0-1)"),
)


def curves_by_variant(cells: Mapping[str, Any]) -> dict[str, list[pd.DataFrame]]:
    out: dict[str, list[pd.DataFrame]] = {}
    for cell in cells.values():
        csv = Path(cell["dir"]) / "train_steps.csv"
        if csv.exists():
            out.setdefault(cell["variant"], []).append(pd.read_csv(csv))
    return out


def curves_figure(by_variant: Mapping[str, list[pd.DataFrame]]) -> Any:
    keys = [
        c for c in CURVES if any(c[0] in f.columns and f[c[0]].notna().any() for fs in by_variant.values() for f in fs)
    ]
    if not keys:
        return None
    ncols = 2
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = new_figure(
        "Training curves per variant (mean over seeds; band: min-max over seeds)", nrows, ncols, size=(10, 2.6 * nrows)
    )
    for ax, (key, title, ylabel) in zip(axes, keys):
        for variant, frames in sorted(by_variant.items()):
            series = [f.set_index("step")[key].dropna() for f in frames if key in f.columns]
            series = [s for s in series if len(s)]
            if not series:
                continue
            table = pd.concat(series, axis=1)
            ax.plot(table.index, table.mean(axis=1), marker="o", label=f"{variant} ({len(series)} seeds)")
            ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), alpha=0.2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(ylabel)
        integer_ticks(ax.xaxis)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    legend_outside(axes[0])
    return fig


def efficiency_figure(by_variant: Mapping[str, list[pd.DataFrame]]) -> Any:
    """Validation success against the real environment calls used so far (``real_env/calls_total``: the SFT
    warm-up's gold responses plus every real call of training) at each probed step: the sample-efficiency
    view. Per variant, the seed mean of both coordinates at each probed step; None without ``val/success``."""
    needed = {"step", "val/success", "real_env/calls_total"}
    drawn = {
        v: [f.dropna(subset=["val/success"]) for f in frames if needed <= set(f.columns)]
        for v, frames in by_variant.items()
    }
    drawn = {v: [f for f in fs if len(f)] for v, fs in drawn.items()}
    drawn = {v: fs for v, fs in drawn.items() if fs}
    if not drawn:
        return None
    fig, (ax,) = new_figure("Validation success against real environment calls (mean over seeds)", size=(7, 3.6))
    for variant, frames in sorted(drawn.items()):
        table = pd.concat([f.set_index("step")[["val/success", "real_env/calls_total"]] for f in frames])
        mean = table.groupby(level=0).mean().sort_index()
        ax.plot(mean["real_env/calls_total"], mean["val/success"], marker="o", label=f"{variant} ({len(frames)} seeds)")
    ax.set_xlabel("real environment calls so far (SFT gold responses + training)")
    ax.set_ylabel("validation success (0-1)")
    legend_outside(ax)
    return fig


def main_figure(agg: Mapping[str, Any], variants: list[str]) -> Any:
    names = [n for n in ["untrained_base", "sft_base", *variants] if n in agg["variants"]]
    if not names:
        return None
    fig, (ax,) = new_figure("Test success per model (95% bootstrap CI over tasks and seeds)", size=(7, 3.6))
    for offset, subset in zip((-0.25, 0.0, 0.25), SUBSETS):
        stats = [agg["variants"][n][subset] for n in names]
        means = np.array([s["mean"] for s in stats], dtype=float)
        lo = np.array([s["ci95"][0] if s["ci95"] else np.nan for s in stats])
        hi = np.array([s["ci95"][1] if s["ci95"] else np.nan for s in stats])
        x = np.arange(len(names)) + offset
        ax.bar(x, 100 * means, width=0.24, label=subset)
        ax.errorbar(x, 100 * means, yerr=[100 * (means - lo), 100 * (hi - means)], fmt="none", color="k", capsize=3)
    ax.set_xticks(np.arange(len(names)), names, rotation=20)
    ax.set_ylabel("success rate (%)")
    legend_outside(ax)
    return fig


def testtime_figure(testtime: Mapping[str, Any]) -> Any:
    """Success vs N per (mode, rehearser): the mean over the seeds that ran that line's every N (N=0: each
    seed's own), so that a line never mixes seeds across its points; the legend says how many."""
    rows = [
        dict(key=k, **{f: v for f, v in c.items() if f != "tasks"}, n=len(c.get("tasks", [])))
        for k, c in testtime.items()
    ]
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    fig, (ax,) = new_figure("Test-time rehearsal: success vs N (mean over the seeds that ran each line)", size=(7, 3.6))
    none = frame[frame["mode"] == "none"].set_index("seed")["success_rate"]
    for (mode, rehearser), group in frame[frame["mode"] != "none"].groupby(["mode", "rehearser"]):
        table = group.pivot_table(index="seed", columns="n_attempts", values="success_rate")
        table[0] = none.reindex(table.index)
        table = table.dropna()  # the seeds with every N of this line and their N=0
        if table.empty:
            continue
        mean = table[sorted(table.columns)].mean()
        seeds = list(table.index)
        which = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds"
        label = f"{mode}/{rehearser} ({which})"
        ax.plot(mean.index, 100 * mean.values, marker="o", linestyle="-" if len(seeds) > 1 else "--", label=label)
    ax.set_xlabel("private rehearsal attempts N")
    ax.set_ylabel("success rate (%)")
    integer_ticks(ax.xaxis)
    legend_outside(ax)
    return fig
