"""The figure builders of envace.reporting.plots and envace.reporting.testtime_plots on small synthetic
frames and on the committed metrics: each returns a titled figure with labelled axes, legends outside every
axes, integer ticks on step, N and count axes; the intervals are the textbook ones; missing data gives a
reason, not a figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from envace.reporting import plots, testtime_plots
from envace.reporting.metrics_files import read_metrics

ROOT = Path(__file__).resolve().parents[3]

STEPS = pd.DataFrame(
    {
        "step": [0.0, 1.0, 2.0, 3.0, 4.0],
        "reward/mean": [np.nan, 0.2, 0.4, 0.3, 0.6],
        "reward/std": [np.nan, 0.1, 0.2, 0.1, 0.3],
        "adv/act/mean": [np.nan, 0.0, 0.0, 0.0, 0.0],
        "adv/act/std": [np.nan, 0.2, 0.3, 0.2, 0.1],
        "adv/act/abs_mean": [np.nan, 0.15, 0.2, 0.1, 0.1],
        "adv/rehearse/mean": [np.nan, 0.0, 0.0, 0.0, 0.0],
        "adv/rehearse/std": [np.nan, 0.1, 0.2, 0.2, 0.1],
        "loss": [np.nan, 0.1, 0.2, 0.1, 0.0],
        "loss/act": [np.nan, 0.05, 0.1, 0.05, 0.0],
        "loss/rehearse": [np.nan, 0.05, 0.1, 0.05, 0.0],
        "kl": [np.nan, 0.0, 0.0, 0.0, 0.0],
        "grad_norm": [np.nan, 1.0, 2.0, 1.5, 1.0],
        "parse_fail/act": [np.nan, 0.0, 0.5, 0.0, 0.25],
        "parse_fail/rehearse": [np.nan, 0.1, 0.0, 0.0, 0.0],
        "tokens_per_s": [np.nan, 10.0, 12.0, 11.0, 13.0],
        "update/tokens_per_s": [np.nan, 100.0, 120.0, 90.0, 95.0],
        "fidelity/exact_match": [0.0, np.nan, 0.5, np.nan, 0.5],
        "fidelity/field_f1": [0.2, np.nan, 0.6, np.nan, 0.7],
        "fidelity/n_calls": [4.0, np.nan, 4.0, np.nan, 4.0],
    }
)
SWEEP = {
    "n_tasks": {"toolworld": 4},
    "cells": [
        {
            "benchmark": "toolworld",
            "n_attempts": 0,
            "mode": "none",
            "rehearser": "none",
            "success_rate": 0.5,
            "cost/rehearsal_completion_tokens": 0.0,
            "cost/rehearsal_wall_s": 0.0,
        },
        *(
            {
                "benchmark": "toolworld",
                "n_attempts": n,
                "mode": mode,
                "rehearser": who,
                "success_rate": 0.25 * n,
                "cost/rehearsal_completion_tokens": 100.0 * n,
                "cost/rehearsal_wall_s": 3.0 * n,
            }
            for n in (1, 2)
            for mode in ("parallel", "sequential")
            for who in ("trained", "base")
        ),
    ],
}
STATS = {
    "n_rows": 8,
    "user_turns": {"histogram": [[1, 4], [2, 3], [4, 1]]},
    "calls_per_turn": {"histogram": [[0, 2], [1, 8], [2, 4]]},
}


def _builders():
    cells = testtime_plots.sweep_cells(SWEEP)
    return {
        "reward": lambda: plots.reward_figure(STEPS),
        "variants": lambda: plots.variant_reward_figure({"grpo (a)": STEPS, "envace (b)": STEPS.iloc[:3]}),
        "role_panels": lambda: plots.role_panels_figure(STEPS),
        "advantages": lambda: plots.advantage_figure(STEPS),
        "fidelity": lambda: plots.fidelity_figure(STEPS),
        "testtime": lambda: testtime_plots.testtime_figure(cells),
        "testtime_cost": lambda: testtime_plots.testtime_cost_figure(cells),
        "data": lambda: plots.data_stats_figure(STATS),
    }


def _visible_axes(fig: Figure):
    return [ax for ax in fig.axes if ax.get_visible()]


def _legends(fig: Figure):
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def assert_well_formed(fig: Figure) -> None:
    """Titled, every axes labelled on both sides, every legend clear of every axes (drawn extents)."""
    assert isinstance(fig, Figure)
    assert fig._suptitle is not None and fig._suptitle.get_text()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in _visible_axes(fig):
        assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        for ax in _visible_axes(fig):
            assert not box.overlaps(ax.get_window_extent(renderer)), f"legend over axes {ax.get_title()!r}"


def _integral(ticks) -> bool:
    return len(ticks) > 0 and all(float(t).is_integer() for t in ticks)


@pytest.mark.parametrize("name", list(_builders()))
def test_every_builder_returns_a_titled_labelled_figure_with_legends_outside(name):
    fig = _builders()[name]()
    assert_well_formed(fig)


@pytest.mark.parametrize("name", ["reward", "variants", "role_panels", "advantages", "fidelity", "testtime"])
def test_step_and_n_axes_have_integer_ticks(name):
    fig = _builders()[name]()
    fig.canvas.draw()
    for ax in _visible_axes(fig):
        assert _integral(ax.get_xticks()), (name, ax.get_title(), ax.get_xticks())


def test_data_histograms_have_one_bar_per_integer_value_and_integer_count_axes():
    fig = plots.data_stats_figure(STATS)
    fig.canvas.draw()
    turns, calls = _visible_axes(fig)
    assert list(turns.get_xticks()) == [1, 2, 3, 4]  # 3 has no rows but keeps its place on the axis
    assert [p.get_height() for p in turns.patches] == [4, 3, 1]
    assert [p.get_x() + 0.4 for p in turns.patches] == pytest.approx([1, 2, 4])
    assert list(calls.get_xticks()) == [0, 1, 2]
    for ax in (turns, calls):
        assert _integral(ax.get_yticks()) and "count" in ax.get_ylabel()
    assert plots.data_stats_figure({"n_rows": 0}) == "no histograms in the data statistics"


def test_advantages_show_spread_not_the_centred_mean():
    fig = plots.advantage_figure(STEPS)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["act: std", "act: mean |advantage|", "rehearse: std"]
    assert "centred" in fig._suptitle.get_text()
    uncentred = STEPS.assign(**{"adv/act/mean": [np.nan, 0.1, 0.0, 0.0, 0.0]})
    assert "centred" not in plots.advantage_figure(uncentred)._suptitle.get_text()


def test_role_panels_draw_what_exists_and_say_what_was_not_recorded():
    fig = plots.role_panels_figure(STEPS.drop(columns=["clipfrac"], errors="ignore"))
    by_title = {ax.get_title(): ax for ax in fig.axes}
    assert [line.get_label() for line in by_title["loss"].get_lines()] == [
        "both roles (one value per step)",
        "ACT",
        "REHEARSE",
    ]
    assert [t.get_text() for t in by_title["clip fraction"].texts] == ["not recorded\n(no `clipfrac` column)"]
    assert [t.get_text() for t in by_title["KL to reference"].texts] == ["0 at every step"]
    per_role_model = pd.DataFrame({"step": [1.0, 2.0], "act/grad_norm": [1.0, 2.0], "rehearse/grad_norm": [3.0, 1.0]})
    panel = {ax.get_title(): ax for ax in plots.role_panels_figure(per_role_model).axes}["gradient norm (pre-clip)"]
    assert [line.get_label() for line in panel.get_lines()] == ["ACT model", "REHEARSE model"]
    assert "no loss" in plots.role_panels_figure(pd.DataFrame({"step": [1.0]}))


def test_wilson_and_bootstrap_intervals():
    low, high = testtime_plots.wilson_interval(0, 1)
    z2 = 1.959963984540054**2  # the Wilson upper bound of 0/1 is z²/(1+z²)
    assert low == 0.0 and high == pytest.approx(z2 / (1 + z2))
    assert testtime_plots.wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert all(math.isnan(v) for v in testtime_plots.wilson_interval(0, 0))
    assert testtime_plots.bootstrap_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    low, high = testtime_plots.bootstrap_interval([0.0, 1.0] * 20)
    assert low < 0.5 < high and testtime_plots.bootstrap_interval([0.0, 1.0] * 20) == (low, high)  # seeded
    cells, method = testtime_plots.cell_intervals(pd.DataFrame({"success_rate": [0.5], "scores": [[0.0, 1.0] * 20]}))
    assert method.startswith("95% bootstrap") and cells["low"].iloc[0] == low


def test_sweep_cells_from_a_list_or_cells_keyed_by_name():
    listed = testtime_plots.sweep_cells(SWEEP)
    assert len(listed) == 9 and set(listed["n"]) == {4}
    keyed = {
        "n_tasks": {"toolworld": 4},
        "cells": {  # rehearsal_sweep.json without its details file
            "toolworld/none/n0/none": {"success_rate": 0.5},
            "toolworld/parallel/n2/trained": {"success_rate": 0.75},
        },
    }
    frame = testtime_plots.sweep_cells(keyed)
    assert frame[["benchmark", "n_attempts", "mode", "rehearser", "n"]].values.tolist() == [
        ["toolworld", 0, "none", "none", 4],
        ["toolworld", 2, "parallel", "trained", 4],
    ]
    assert testtime_plots.sweep_cells(None).empty and testtime_plots.sweep_cells({"cells": []}).empty


def test_testtime_figure_names_its_interval_and_dodges_equal_series():
    fig = testtime_plots.testtime_figure(testtime_plots.sweep_cells(SWEEP))
    assert fig.legends[0].get_title().get_text() == "bars: 95% Wilson (binomial, n tasks)"
    assert fig.axes[0].get_title() == "toolworld (n = 4 tasks)"
    xs = {
        round(float(x), 3)
        for line in fig.axes[0].get_lines()
        for x in line.get_xdata()
        if line.get_marker() in ("o", "s") and 0.5 < float(x) < 1.5
    }
    assert len(xs) == 4  # four series at N=1, each at its own offset


def test_reasons_instead_of_figures_without_data():
    empty = pd.DataFrame()
    assert plots.reward_figure(empty).startswith("no per-step reward")
    assert testtime_plots.testtime_figure(empty) == "no rehearsal_sweep cells"
    baseline_only = testtime_plots.sweep_cells({"cells": [{"n_attempts": 0, "success_rate": 1.0}]})
    assert "cost" in testtime_plots.testtime_cost_figure(baseline_only)
    assert plots.fidelity_figure(STEPS[["step", "reward/mean"]]).endswith("(not measured)")
    assert plots.efficiency_figure(pd.DataFrame()).startswith("no policy with both")


def test_save_plots_writes_pngs_and_the_testtime_points(tmp_path):
    efficiency = pd.DataFrame(
        {
            "policy": ["start (sft)", "grpo (w)"],
            "benchmark": "toolworld",
            "real_env_calls": [30, 90],
            "success": [20, 40],
        }
    )
    made, skipped = plots.save_plots(
        tmp_path,
        steps=STEPS,
        curves=STEPS,
        variants={"envace (w)": STEPS},
        testtime=testtime_plots.sweep_cells(SWEEP),
        efficiency=efficiency,
    )
    assert (
        skipped == {}
        and "success_vs_real_calls.png" in made
        and all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in made)
    )
    points = pd.read_csv(tmp_path / testtime_plots.TESTTIME_POINTS)
    assert len(points) == 9 and {"n_attempts", "success_rate", "low", "high"} <= set(points.columns)


def test_the_committed_metrics_draw_well_formed_figures():
    steps = pd.read_csv(ROOT / "plots" / "train_steps.csv")
    train = json.loads((ROOT / "metrics" / "train.json").read_text())
    curves = plots.merge_curves(plots.curves_frame(train.get("curves")), steps)
    cells = testtime_plots.sweep_cells(read_metrics(ROOT / "metrics" / "rehearsal_sweep.json"))
    for figure in (
        plots.reward_figure(steps),
        plots.role_panels_figure(curves),
        plots.advantage_figure(curves),
        testtime_plots.testtime_figure(cells),
        testtime_plots.testtime_cost_figure(cells),
    ):
        assert_well_formed(figure)
