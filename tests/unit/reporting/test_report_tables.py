"""The report stage on synthetic metrics dirs: ablation and scale rows (filtering, latest per variant,
the current run winning for its own variant), Overall over the benchmarks present, missing data, every
plot drawn (or listed as not drawn); n and a 95% interval in every scored cell, "—" where n = 0, context
overflows and not-runnable benchmarks flagged, the paper's numbers only in the reference column,
the provenance header and stale inputs, stable MLflow metric keys."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from envace.config.load import compose, typed_config
from envace.reporting.comparison import RunResult, ablation_table, collected_runs, latest_per, model_size
from envace.reporting.experiments import SCHEMA_VERSION
from envace.reporting.intervals import bootstrap_over_seeds, bootstrap_overall, wilson
from envace.reporting.layout import PER_ROLE_VERL_NOTE, REFERENCE_TITLE
from envace.reporting.plots import curves_frame, merge_curves, plot_reward_per_variant
from envace.reporting.provenance import CURRENT, STALE, header_lines, input_state, input_states, stale_note
from envace.reporting.reference import REFERENCE_COLUMN
from envace.reporting.report_markdown import ablation_note
from envace.reporting.tables import NOT_RUNNABLE, fidelity_table, main_table, render_markdown
from envace.stages import report
from envace.utils.io import write_json

ALL_PLOTS = [
    "training_curve.png",
    "training_per_role.png",
    "reward_per_variant.png",
    "advantages_per_role.png",
    "fidelity_over_training.png",
    "testtime.png",
    "testtime_cost.png",
    "success_vs_real_calls.png",
]


def _entry(
    name,
    algo,
    model="tiny",
    profile="smoke",
    ts="2026-01-01T00:00:00",
    rates=None,
    reward=0.1,
    curves=None,
    kind="experiment",
):
    return {
        "kind": kind,
        "name": name,
        "rev": name.ljust(40, "0"),
        "baseline": "b" * 40,
        "timestamp": ts,
        "params": {
            "profile": profile,
            "algo.name": algo,
            "model.name": model,
            "engine.name": "local",
            "experiment_name": "default",
            "seed": 0,
        },
        "success_rate": {b: {"policy": r, "base": 0.0} for b, r in (rates or {"toolworld": 0.25}).items()},
        "train": {"final_reward": reward, "steps_done": 2, "variant": algo, "real_env_calls": 40.0},
        "curves": curves,
        "curves_source": "train.json" if curves else None,
    }


EXPERIMENTS = [
    _entry("workspace", "per_role", kind="workspace", rates={"toolworld": 0.99}),  # stale snapshot: ignored
    _entry("grpo-old", "grpo", ts="2026-01-01T00:00:00", rates={"toolworld": 0.0}),
    _entry(
        "grpo-new",
        "grpo",
        ts="2026-01-02T00:00:00",
        rates={"toolworld": 0.25, "bfcl": 0.75},
        reward=0.2,
        curves={"step": [0, 1, 2], "reward/mean": [None, 0.1, 0.2]},
    ),
    _entry("per-role", "per_role", rates={"toolworld": 0.5}, curves={"step": [0, 1], "reward/mean": [0.0, 0.3]}),
    _entry("envace-exp", "envace", rates={"toolworld": 0.01}),  # the workspace run replaces it
    _entry("cpu-grpo", "grpo", profile="cpu", rates={"toolworld": 0.9}),
    _entry("smollm-envace", "envace", model="smollm2-135m", rates={"toolworld": 0.625}),
    _entry("smollm-grpo", "grpo", model="smollm2-135m", rates={"toolworld": 0.7}),
]


def _metrics_dir(root: Path, *, curves: bool = True, fidelity: bool = True, experiments: bool = True) -> None:
    metrics, plots = root / "metrics", root / "plots"
    write_json(
        metrics / "evaluate_toolworld.json",
        {
            "benchmark": "toolworld",
            "n_tasks": 8,
            "policy": {"success_rate": 0.375, "n_tasks": 8},
            "base": {"success_rate": 0.125, "n_tasks": 8},
        },
    )
    train = {
        "final/reward/mean": 0.5,
        "steps_done": 2,
        "variant": "envace",
        "final/real_env/sft_calls": 30.0,
        "final/real_env/calls_total": 30.0,
    }
    if curves:
        train["curves"] = {
            "step": [0, 1, 2],
            "reward/mean": [None, 0.25, 0.5],
            "adv/act/mean": [None, 0.0, 0.1],
            "adv/act/std": [None, 0.5, 0.4],
            "adv/rehearse/mean": [None, 0.0, -0.1],
            "adv/rehearse/std": [None, 0.3, 0.2],
            **(
                {
                    "fidelity/exact_match": [0.1, None, 0.3],
                    "fidelity/field_f1": [0.2, None, 0.4],
                    "fidelity/error_agreement": [0.5, None, 0.6],
                }
                if fidelity
                else {}
            ),
        }
    write_json(metrics / "train.json", train)
    write_json(
        metrics / "rehearsal_sweep.json",
        {
            "cells": [
                {"n_attempts": 0, "mode": "none", "rehearser": "none", "success_rate": 0.25, "gain_vs_none": 0.0},
                {
                    "n_attempts": 1,
                    "mode": "parallel",
                    "rehearser": "trained",
                    "success_rate": 0.5,
                    "gain_vs_none": 0.25,
                    "cost/rehearsal_completion_tokens": 120.0,
                },
            ]
        },
    )
    plots.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "step": [1.0, 2.0],
            "reward/mean": [0.25, 0.5],
            "adv/act/mean": [0.0, 0.1],
            "adv/act/std": [0.5, 0.4],
            "adv/act/abs_mean": [0.4, 0.3],
            "adv/rehearse/mean": [0.0, -0.1],
            "adv/rehearse/std": [0.3, 0.2],
            "loss": [0.1, 0.05],
        }
    ).to_csv(plots / "train_steps.csv", index=False)
    if experiments:
        write_json(metrics / "experiments.json", {"schema_version": SCHEMA_VERSION, "experiments": EXPERIMENTS})


@pytest.fixture
def make_report(tmp_path, paths_under):
    def build(benchmarks: str = "[toolworld]", **kwargs):
        _metrics_dir(tmp_path, **kwargs)
        cfg = compose(["profile=smoke", "tracking=none", f"eval.benchmarks={benchmarks}", *paths_under(tmp_path)])
        summary = report.run(typed_config(cfg))
        return tmp_path / "reports", summary

    return build


def test_ablation_rows_latest_per_variant_same_profile_and_model_current_run_wins(make_report):
    out, summary = make_report()
    table = pd.read_csv(out / "ablation.csv")
    assert [c for c in table.columns if "/" not in c] == [
        "variant",
        "run",
        "seeds",
        "toolworld",
        "Overall",
        "Overall (all)",
        "final_reward",
        REFERENCE_COLUMN,
    ]
    assert table["variant"].tolist() == ["grpo", "per_role", "envace"]
    assert table["run"].tolist() == ["grpo-new", "per-role", "workspace"] == summary["ablation_runs"]
    assert table["toolworld"].tolist() == [25.0, 50.0, 37.5]
    assert table["Overall"].isna().all()  # the paper's Overall: BFCL/τ²/VitaBench, none of them ran
    assert table["Overall (all)"].tolist() == [25.0, 50.0, 37.5]
    assert table["final_reward"].tolist() == [0.2, 0.1, 0.5]


def test_scale_rows_one_per_model_same_profile_and_variant_smallest_first(make_report):
    out, summary = make_report()
    table = pd.read_csv(out / "scale.csv")
    assert table["model"].tolist() == ["tiny", "smollm2-135m"]
    assert table["run"].tolist() == ["workspace", "smollm-envace"] == summary["scale_runs"]
    assert table["toolworld"].tolist() == [37.5, 62.5]


def test_overall_is_the_mean_over_benchmarks_present_and_missing_ones_stay_empty(make_report):
    out, _ = make_report(benchmarks="[toolworld,bfcl]")
    table = pd.read_csv(out / "ablation.csv").set_index("variant")
    assert table.loc["grpo", "bfcl"] == 75.0 and table.loc["grpo", "Overall (all)"] == 50.0
    assert table.loc["grpo", "Overall"] == 75.0  # the paper's Overall: only BFCL of its three ran
    assert pd.isna(table.loc["envace", "bfcl"]) and table.loc["envace", "Overall (all)"] == 37.5  # bfcl not run here
    assert pd.isna(table.loc["envace", "Overall"])
    assert pd.isna(table.loc["per_role", "bfcl"]) and table.loc["per_role", "Overall (all)"] == 50.0


def test_without_collected_experiments_each_table_is_the_current_run_and_says_how_to_add_rows(make_report):
    out, _ = make_report(experiments=False)
    assert pd.read_csv(out / "ablation.csv")["run"].tolist() == ["workspace"]
    assert pd.read_csv(out / "scale.csv")["run"].tolist() == ["workspace"]
    text = (out / "report.md").read_text()
    assert "python -m envace.reporting.experiments collect && dvc repro report" in text


def test_under_verl_the_ablation_table_says_why_per_role_has_no_row():
    verl, local = (typed_config(compose(["profile=smoke", f"engine={e}"])) for e in ("verl", "local"))
    without = pd.DataFrame({"variant": ["grpo", "envace"]})
    assert PER_ROLE_VERL_NOTE in ablation_note(verl, without, collected=True)
    assert PER_ROLE_VERL_NOTE not in ablation_note(local, without, collected=True)
    assert PER_ROLE_VERL_NOTE not in ablation_note(verl, pd.DataFrame({"variant": ["per_role"]}), collected=True)


def test_every_plot_is_drawn_and_listed(make_report):
    out, summary = make_report()
    assert summary["plots"] == ALL_PLOTS and summary["skipped_plots"] == {}
    for name in ALL_PLOTS:
        assert (out / name).read_bytes()[:4] == b"\x89PNG" and (out / name).stat().st_size > 2000
        assert f"![{name}]({name})" in (out / "report.md").read_text()
    assert {"ablation", "scale"} <= set(summary["tables"])


def test_sample_efficiency_table_places_each_policy_at_its_real_environment_calls(make_report):
    out, _ = make_report()
    table = pd.read_csv(out / "efficiency.csv")
    start, trained = table.iloc[0], table.iloc[1]
    assert start["policy"].startswith("start") and (start["real_env_calls"], start["success"]) == (30.0, 12.5)
    assert trained["policy"] == "envace (this run)" and (trained["real_env_calls"], trained["success"]) == (30.0, 37.5)
    collected = table.iloc[2:]
    assert len(collected) >= 1 and set(collected["real_env_calls"]) == {40.0}
    assert "## Sample efficiency" in (out / "report.md").read_text()


def test_fidelity_plot_is_skipped_and_explained_when_not_measured(make_report):
    out, summary = make_report(fidelity=False)
    assert "fidelity_over_training.png" not in summary["plots"]
    assert not (out / "fidelity_over_training.png").exists()
    assert "not measured" in summary["skipped_plots"]["fidelity_over_training.png"]
    assert "`fidelity_over_training.png` not drawn" in (out / "report.md").read_text()


def test_without_curves_the_current_run_is_plotted_from_train_steps_csv(make_report):
    _, summary = make_report(curves=False)
    assert {"reward_per_variant.png", "advantages_per_role.png"} <= set(summary["plots"])
    assert "fidelity_over_training.png" in summary["skipped_plots"]


def test_the_paper_numbers_stay_in_their_labelled_reference_column(make_report):
    out, _ = make_report()
    for csv in (p for p in out.glob("*.csv") if p.read_text().strip()):
        frame = pd.read_csv(csv)
        ours = frame.drop(columns=[REFERENCE_COLUMN], errors="ignore").to_csv(index=False)
        assert "32.91" not in ours and "36.7" not in ours, csv.name
    main = pd.read_csv(out / "main.csv").set_index("contender")
    assert main.loc["policy", REFERENCE_COLUMN].startswith("EnvACE-8B: Overall 32.91")  # variant envace
    assert main.loc["base", REFERENCE_COLUMN].startswith("Qwen3-8B: Overall 28.48")
    ablation = pd.read_csv(out / "ablation.csv").set_index("variant")[REFERENCE_COLUMN]
    assert ablation["grpo"] == "τ² 31.2" and ablation["envace"] == "τ² 36.7"
    testtime = pd.read_csv(out / "testtime.csv")
    assert testtime[REFERENCE_COLUMN].iloc[0].startswith("no rehearsal: Overall 36.7")
    assert pd.isna(testtime[REFERENCE_COLUMN].iloc[1])  # N=1: the paper reports only N=2
    text = (out / "report.md").read_text()
    assert f"| {REFERENCE_COLUMN}" in text and REFERENCE_TITLE in text


def test_reward_per_variant_uses_each_variants_curves(tmp_path):
    variants = {
        "grpo (a)": curves_frame({"step": [0, 1], "reward/mean": [None, 0.5]}),
        "per_role (b)": curves_frame({"step": [0, 1], "reward/mean": [0.1, None, 0.3]}),
    }  # padded
    assert len(variants["per_role (b)"]) == 3
    assert plot_reward_per_variant(variants, tmp_path / "r.png") is None and (tmp_path / "r.png").exists()
    empty = {"grpo (a)": curves_frame(None), "x (b)": curves_frame({"step": [0], "reward/mean": [None]})}
    assert plot_reward_per_variant(empty, tmp_path / "s.png") == "no variant has a per-step reward/mean"


def test_merge_curves_adds_csv_only_columns_on_step():
    curves = curves_frame({"step": [0, 1], "reward/mean": [None, 0.5]})
    steps = pd.DataFrame({"step": [1.0], "reward/mean": [0.4], "adv/act/abs_mean": [0.2]})
    merged = merge_curves(curves, steps)
    assert merged["step"].tolist() == [0.0, 1.0] and merged["reward/mean"].tolist()[1] == 0.5
    assert merged["adv/act/abs_mean"].tolist()[1] == 0.2
    assert merge_curves(curves_frame(None), steps) is steps


def test_latest_per_filters_on_the_fixed_keys_and_lets_the_current_run_win():
    runs = collected_runs({"schema_version": SCHEMA_VERSION, "experiments": EXPERIMENTS})
    assert "workspace" not in [r.run for r in runs]
    current = RunResult(
        run="workspace",
        params={"profile": "smoke", "model.name": "tiny", "algo.name": "envace"},
        success={"toolworld": 0.375},
    )
    chosen = latest_per(runs, current, vary="algo.name", same=("profile", "model.name"))
    assert {r.params["algo.name"]: r.run for r in chosen} == {
        "grpo": "grpo-new",
        "per_role": "per-role",
        "envace": "workspace",
    }
    with pytest.raises(ValueError, match="envace.reporting.experiments collect"):
        collected_runs({"schema_version": 999, "experiments": []})


@pytest.mark.parametrize(
    "name, size", [("qwen3-1.7b", 1.7e9), ("qwen3-8b", 8e9), ("smollm2-135m", 1.35e8), ("tiny", 0.0)]
)
def test_model_size_from_the_name(name, size):
    assert model_size(name) == pytest.approx(size)


def test_dvc_yaml_declares_every_report_figure_and_with_no_data_none_is_drawn(tmp_path):
    import yaml

    from envace.reporting.plots import save_plots

    empty = pd.DataFrame()
    made, skipped = save_plots(tmp_path, steps=empty, curves=empty, variants={}, testtime=empty)
    assert made == [] and list(skipped) == ALL_PLOTS and not list(tmp_path.iterdir())
    dvc_yaml = yaml.safe_load((Path(__file__).resolve().parents[3] / "dvc.yaml").read_text())
    images = [entry for entry in dvc_yaml["plots"] if isinstance(entry, str)]
    assert images == [f"${{paths.reports}}/{name}" for name in ALL_PLOTS]


def test_benchmark_table_lists_each_benchmarks_own_aggregates():
    from envace.reporting.tables import benchmark_table, main_table, overall_note

    m = {
        "evaluate_bfcl": {
            "benchmark": "bfcl",
            "policy": {
                "success_rate": 0.5,
                "context_overflows": 1,
                "categories": {
                    "simple_python": {"status": "ran", "accuracy": 0.5, "n": 2},
                    "web_search_base": {"status": "not_runnable_offline", "reason": "network"},
                },
                "aggregates": {"overall": 0.5, "multi_turn": None},
            },
        },
        "evaluate_tau2": {
            "benchmark": "tau2",
            "policy": {
                "success_rate": 0.25,
                "domains": {
                    "telecom:base": {"status": "ran", "avg_reward": 0.25, "pass^1": 0.25, "pass^2": 0.0, "n_tasks": 4}
                },
            },
        },
        "evaluate_finmcp": {
            "benchmark": "finmcp",
            "base": {"success_rate": 0.0, "finmcp": {"overall": {"macro": {"f1": 0.4}, "exact_match": 0.0}}},
        },
    }
    table = benchmark_table(m).set_index(["benchmark", "model", "measure"])["value"]
    assert table[("bfcl", "policy", "category:simple_python")] == 0.5
    assert ("bfcl", "policy", "category:web_search_base") not in table  # not run: in the category table only
    assert table[("bfcl", "policy", "bfcl:overall")] == 0.5 and ("bfcl", "policy", "bfcl:multi_turn") not in table
    assert table[("tau2", "policy", "telecom:base:pass^2")] == 0.0
    assert table[("finmcp", "base", "finmcp:macro/f1")] == 0.4
    assert table[("bfcl", "policy", "context_overflows")] == 1
    main = main_table(["bfcl", "tau2", "toolworld"], {"policy": "envace"}, m)
    assert main.loc[0, "Overall"] == pytest.approx(37.5) and main.loc[0, "Overall (all)"] == pytest.approx(37.5)
    assert "bfcl, tau2" in overall_note(main, ["bfcl", "tau2", "toolworld"])


# ---- n, intervals, flags ----------------------------------------------------------------------------
CELL = re.compile(r"^-?\d+\.\d \[\d+\.\d, \d+\.\d\] \(n=\d+")


def test_every_scored_cell_carries_n_and_a_95_interval(make_report):
    out, _ = make_report()
    main = pd.read_csv(out / "main.csv")
    for column in ("toolworld", "Overall (all)"):
        assert main[column].notna().all()
        assert (main[f"{column}/n"] > 0).all() and main[f"{column}/ci_low"].notna().all()
        assert (main[f"{column}/ci_low"] <= main[column]).all() and (main[column] <= main[f"{column}/ci_high"]).all()
    text = (out / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| envace (tiny)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "37.5 [13.7, 69.4] (n=8)"  # Wilson, 3 of 8
    assert CELL.match(cells[3])  # Overall (all): the stratified bootstrap
    testtime = pd.read_csv(out / "testtime.csv")  # n = the sweep's tasks (none recorded here: no interval)
    assert {"success_rate/n", "success_rate/ci_low", "success_rate/ci_high"} <= set(testtime.columns)


def test_wilson_and_the_bootstrap_give_known_numbers():
    assert wilson(0, 0) is None
    assert wilson(0, 3) == (0.0, pytest.approx(0.5615, abs=1e-4))
    assert wilson(3, 8) == (pytest.approx(0.1368, abs=1e-4), pytest.approx(0.6943, abs=1e-4))
    assert wilson(2, 2)[1] == 1.0
    low, high = bootstrap_overall([(3, 8), (0, 4)])
    assert 0.0 <= low < 0.1875 < high <= 0.5 and bootstrap_overall([(3, 8), (0, 4)]) == (low, high)  # seeded
    assert bootstrap_overall([(0, 3), (0, 2)]) == (0.0, 0.0) and bootstrap_overall([(1, 0)]) is None
    assert bootstrap_over_seeds([10.0]) is None
    low, high = bootstrap_over_seeds([10.0, 20.0, 30.0])
    assert 10.0 <= low < 20.0 < high <= 30.0


def _evaluate(bench, rate, n, **extra):
    return {
        "benchmark": bench,
        "n_tasks": n,
        "not_runnable": extra.pop("parts", {}),
        "policy": {"success_rate": rate, "n_tasks": n, **extra},
    }


def test_overflows_not_runnable_and_not_run_are_flagged_in_the_cells():
    m = {
        "evaluate_tau2": _evaluate("tau2", 0.0, 3, context_overflows=3),
        "evaluate_bfcl": _evaluate("bfcl", 0.5, 4, parts={"web_search_base": "needs SerpAPI"}),
        "evaluate_vitabench": _evaluate(
            "vitabench", 0.0, 2, error_rate=1.0, status_info={"status": "needs endpoints: user simulator, judge"}
        ),
    }
    main = main_table(["tau2", "bfcl", "vitabench", "finmcp"], {"policy": "envace"}, m, "envace")
    row = main.iloc[0]
    assert row["tau2/overflows"] == 3 and row["vitabench/status"] == NOT_RUNNABLE and pd.isna(row["vitabench"])
    assert row["finmcp/status"] == "not run" and row["finmcp/n"] == 0 and pd.isna(row["finmcp"])
    assert row["Overall"] == pytest.approx(25.0) and row["Overall/n"] == 7  # τ² and BFCL; Vita did not run
    text = render_markdown(main.drop(columns=["contender"]))
    cells = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert cells[1] == "0.0 [0.0, 56.1] (n=3; 3/3 overflow)"
    assert cells[2] == "50.0 [15.0, 85.0] (n=4; 1 part(s) not runnable offline)"
    assert cells[3] == "not runnable offline (n=2)"
    assert cells[4] == "—"


def test_nothing_measured_prints_a_dash_never_0():
    m = {
        "evaluate_toolworld": {
            "benchmark": "toolworld",
            "policy": {
                "success_rate": 0.0,
                "n_tasks": 2,
                "fidelity": {
                    "n": 0,
                    "exact_match": 0.0,
                    "field_f1": 0.0,
                    "error_agreement": 0.0,
                    "parse_failure_rate": 0.0,
                },
                "fidelity_gold": {
                    "n": 2,
                    "exact_match": 0.5,
                    "field_f1": 0.5,
                    "error_agreement": 1.0,
                    "parse_failure_rate": 0.0,
                },
            },
        }
    }
    fidelity = fidelity_table(m)
    own, gold = fidelity.iloc[0], fidelity.iloc[1]
    assert own["n"] == 0 and pd.isna(own["exact_match"]) and pd.isna(own["field_f1"])
    assert gold["exact_match"] == 0.5 and gold["exact_match/ci_low"] == pytest.approx(0.0945, abs=1e-4)
    lines = render_markdown(fidelity, 3).splitlines()
    assert lines[2].count("—") == 4 and " 0.000 " not in lines[2]  # exact, agreement, parse failures, F1
    assert "0.500 [0.095, 0.905] (n=2)" in lines[3]


def _run(name, algo, seed, rate):
    return RunResult(
        run=name,
        params={"profile": "smoke", "model.name": "tiny", "algo.name": algo, "seed": seed},
        success={"toolworld": rate},
        n={"toolworld": 8},
        final_reward=rate,
    )


def test_a_row_with_several_seeds_is_their_mean_with_a_bootstrap_over_seeds():
    runs = [_run("g0", "grpo", 0, 0.25), _run("g1", "grpo", 1, 0.5), _run("g2", "grpo", 2, 0.75)]
    table, chosen = ablation_table(runs, _run("workspace", "envace", 0, 0.375), ["toolworld"])
    grpo = table.set_index("variant").loc["grpo"]
    assert grpo["run"] == "g0, g1, g2" and grpo["seeds"] == "0, 1, 2" and len(chosen) == 4
    assert grpo["toolworld"] == pytest.approx(50.0) and grpo["toolworld/n"] == 3
    assert grpo["toolworld/unit"] == "seeds" and 25.0 <= grpo["toolworld/ci_low"] < 50.0 < grpo["toolworld/ci_high"]
    envace = table.set_index("variant").loc["envace"]  # one seed: Wilson over its 8 tasks
    assert envace["toolworld/n"] == 8 and envace["toolworld/ci_low"] == pytest.approx(13.68, abs=0.01)
    assert "(n=3 seeds)" in render_markdown(table)


# ---- provenance, stale inputs, MLflow keys --------------------------------------------------------------
def test_the_report_opens_with_its_provenance(make_report, monkeypatch):
    monkeypatch.setenv("ENVACE_OVERRIDES", '["algo.lr=1e-5"]')
    out, _ = make_report()
    lines = (out / "report.md").read_text().splitlines()
    assert lines[0].startswith("# envace report")
    provenance = lines[2]
    assert provenance.startswith("**Produced by** commit `") and "profile `smoke`" in provenance
    for part in ("overrides `algo.lr=1e-5`", "model `tiny`", "seed(s) 0", "UTC"):
        assert part in provenance
    train = next(line for line in lines if "/metrics/train.json`" in line)
    assert train.endswith("| — | unknown: not in a git work tree |")  # tmp_path: not in a repository


def _git(root, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True, capture_output=True
    )


def test_metrics_from_an_older_commit_than_the_code_are_marked_stale(tmp_path):
    (tmp_path / "envace").mkdir()
    (tmp_path / "metrics").mkdir()
    (tmp_path / "envace" / "stage.py").write_text("x = 1\n")
    write_json(tmp_path / "metrics" / "old.json", {"a": 1})
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "code and old metrics")
    (tmp_path / "envace" / "stage.py").write_text("x = 2\n")
    write_json(tmp_path / "metrics" / "new.json", {"a": 2})
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "new code, new metrics")
    old, new = input_states(tmp_path / "metrics", "metrics", ["old", "new"])
    assert old.state == STALE and "1 later commit(s) changed envace/" in old.detail and old.commit
    assert new.state == CURRENT and new.commit != old.commit
    assert stale_note(["old"], [old, new]) == "**STALE**: built from `metrics/old.json`, produced by older code."
    assert stale_note(["new"], [old, new]) is None
    (tmp_path / "envace" / "stage.py").write_text("x = 3\n")  # uncommitted code: nothing is current
    assert input_state(tmp_path / "metrics" / "new.json").state == STALE
    header = "\n".join(
        header_lines(
            commit="abc",
            dirty=True,
            profile="cpu",
            overrides=[],
            model="m",
            variant="envace",
            seeds=[0],
            date="d",
            inputs=[old, new],
        )
    )
    assert "(dirty" in header and "**STALE**: 1 later commit(s)" in header and "Stale inputs** (1 of 2)" in header


def test_report_metrics_have_stable_keys_and_the_labels_go_to_tags(make_report):
    _, summary = make_report()
    numeric = {k for k, v in summary.items() if isinstance(v, float)}
    assert {
        "overall_all/policy",
        "overall_all/base",
        "success/policy/toolworld",
        "success/base/toolworld/n",
        "overall_all/policy/ci_low",
    } <= numeric and "overall/policy" in summary
    assert summary["overall_all/policy"] == pytest.approx(37.5) and summary["overall/policy"] is None
    assert not [k for k in summary if "tiny" in k or " " in k or "(" in k]
    assert summary["labels"] == {"base": "tiny (base)", "policy": "envace (tiny)"}


def test_the_commit_recorded_by_the_stage_runner_decides_staleness(tmp_path, monkeypatch):
    (tmp_path / "envace").mkdir()
    (tmp_path / "metrics").mkdir()
    (tmp_path / "envace" / "stage.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "code")
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    for stem in ("a", "b"):
        write_json(tmp_path / "metrics" / f"{stem}.json", {"n": 1})
    write_json(tmp_path / "metrics" / "a.details.json", {"produced_by": {"commit": first, "code_dirty": False}})
    write_json(tmp_path / "metrics" / "b.details.json", {"produced_by": {"commit": first, "code_dirty": True}})
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "metrics committed later than the code that wrote them")
    a, b = input_states(tmp_path / "metrics", "metrics", ["a", "b"])
    assert a.state == CURRENT and a.commit == first[:7]  # no envace/ change since the producing commit
    assert b.state == STALE and "uncommitted code" in b.detail
    (tmp_path / "envace" / "stage.py").write_text("x = 2\n")
    _git(tmp_path, "commit", "-qam", "new code")
    a, _ = input_states(tmp_path / "metrics", "metrics", ["a", "b"])
    assert a.state == STALE and f"changed since {first[:7]}" in a.detail
    monkeypatch.setenv("DVC_STAGE", "report")  # inside dvc repro: the repro itself checked dvc.lock
    a, _ = input_states(tmp_path / "metrics", "metrics", ["a", "b"])
    assert a.state == CURRENT and a.commit == first[:7] and "dvc repro" in a.detail


def test_a_non_default_profile_in_params_yaml_leaves_the_code_clean(tmp_path):
    """params.yaml is the composed config (``make params``, ``dvc exp run -S``), not code: changing it
    does not make the report call the code dirty; an edit under envace/ does."""
    from envace.reporting.provenance import head_state

    (tmp_path / "envace").mkdir()
    (tmp_path / "envace" / "stage.py").write_text("x = 1\n")
    (tmp_path / "params.yaml").write_text("profile: cpu\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "code and the default params")
    (tmp_path / "params.yaml").write_text("profile: smoke\n")
    assert head_state(tmp_path)[1] is False
    (tmp_path / "envace" / "stage.py").write_text("x = 2\n")
    assert head_state(tmp_path)[1] is True


def test_gain_table_reads_each_evaluations_paired_difference_in_points():
    from envace.reporting.gain import baseline_name, gain_table

    m = {
        "evaluate_toolworld": {
            "benchmark": "toolworld",
            "baseline": "sft",
            "gain_vs_base": {
                "all": {"diff": 0.1, "n_tasks": 30, "ci95": [-0.05, 0.25], "verdict": "cannot tell"},
                "held_out_domain": {"diff": 0.0, "n_tasks": 6, "ci95": [0.0, 0.0], "verdict": "cannot tell"},
            },
        },
        "evaluate_bfcl": {"benchmark": "bfcl", "n_tasks": 6},  # compared with no baseline: no row
        "train": {},
    }
    table = gain_table(m)
    assert list(table["tasks"]) == ["all tasks", "held-out domain"] and set(table["benchmark"]) == {"toolworld"}
    assert table["gain_pp"].tolist() == pytest.approx([10.0, 0.0])
    assert table[["gain_pp/ci_low", "gain_pp/ci_high"]].iloc[0].tolist() == pytest.approx([-5.0, 25.0])
    assert "10.0 [-5.0, 25.0] (n=30)" in render_markdown(table)
    assert baseline_name(m) == "SFT'd start" and baseline_name({"evaluate_x": {}}) == "base"


def test_a_baseline_that_is_a_model_directory_is_named_in_the_labels():
    """The organism's baseline is its committed SFT start (model.kind=path, no warm-up in the run): the
    tables name that directory rather than "base", which would read as an untrained model."""
    from envace.stages.report import baseline_label

    base, sft = {"evaluate_toolworld": {"baseline": "base"}}, {"evaluate_toolworld": {"baseline": "sft"}}
    organism = typed_config(compose(["profile=organism"]))
    assert baseline_label(organism, base) == "base: science/organism/start"
    assert baseline_label(organism, sft) == "SFT'd start"
    assert baseline_label(typed_config(compose(["profile=smoke"])), base) == "base"
