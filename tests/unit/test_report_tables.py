"""The report stage on synthetic metrics dirs: ablation and scale rows (filtering, latest per variant,
the current run winning for its own variant), Overall over the benchmarks present, missing data, every
plot drawn (or listed as not drawn), the paper's numbers only in the reference section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from envace.config import compose
from envace.experiments import SCHEMA_VERSION
from envace.reporting.comparison import RunResult, collected_runs, latest_per, model_size
from envace.reporting.plots import curves_frame, merge_curves, plot_reward_per_variant
from envace.stages import report
from envace.utils.io import write_json

ALL_PLOTS = ["training_curve.png", "reward_per_variant.png", "advantages_per_role.png",
             "fidelity_over_training.png", "testtime.png"]


def _entry(name, algo, model="tiny", profile="smoke", ts="2026-01-01T00:00:00", rates=None, reward=0.1,
           curves=None, kind="experiment"):
    return {"kind": kind, "name": name, "rev": name.ljust(40, "0"), "baseline": "b" * 40, "timestamp": ts,
            "params": {"profile": profile, "algo.name": algo, "model.name": model, "engine.name": "local",
                       "experiment_name": "default", "seed": 0},
            "success_rate": {b: {"policy": r, "base": 0.0} for b, r in (rates or {"toolworld": 0.25}).items()},
            "train": {"final_reward": reward, "steps_done": 2, "variant": algo},
            "curves": curves, "curves_source": "train.json" if curves else None}


EXPERIMENTS = [
    _entry("workspace", "per_role", kind="workspace", rates={"toolworld": 0.99}),  # stale snapshot: ignored
    _entry("grpo-old", "grpo", ts="2026-01-01T00:00:00", rates={"toolworld": 0.0}),
    _entry("grpo-new", "grpo", ts="2026-01-02T00:00:00", rates={"toolworld": 0.25, "bfcl": 0.75}, reward=0.2,
           curves={"step": [0, 1, 2], "reward/mean": [None, 0.1, 0.2]}),
    _entry("per-role", "per_role", rates={"toolworld": 0.5}, curves={"step": [0, 1], "reward/mean": [0.0, 0.3]}),
    _entry("envace-exp", "envace", rates={"toolworld": 0.01}),  # the workspace run replaces it
    _entry("cpu-grpo", "grpo", profile="cpu", rates={"toolworld": 0.9}),
    _entry("smollm-envace", "envace", model="smollm2-135m", rates={"toolworld": 0.625}),
    _entry("smollm-grpo", "grpo", model="smollm2-135m", rates={"toolworld": 0.7}),
]


def _metrics_dir(root: Path, *, curves: bool = True, fidelity: bool = True, experiments: bool = True) -> None:
    metrics, plots = root / "metrics", root / "plots"
    write_json(metrics / "evaluate_toolworld.json", {"benchmark": "toolworld", "policy": {"success_rate": 0.375},
                                                     "base": {"success_rate": 0.125}})
    train = {"final/reward/mean": 0.5, "steps_done": 2, "variant": "envace"}
    if curves:
        train["curves"] = {"step": [0, 1, 2], "reward/mean": [None, 0.25, 0.5],
                           "adv/act/mean": [None, 0.0, 0.1], "adv/act/std": [None, 0.5, 0.4],
                           "adv/rehearse/mean": [None, 0.0, -0.1], "adv/rehearse/std": [None, 0.3, 0.2],
                           **({"fidelity/exact_match": [0.1, None, 0.3], "fidelity/field_f1": [0.2, None, 0.4],
                               "fidelity/error_agreement": [0.5, None, 0.6]} if fidelity else {})}
    write_json(metrics / "train.json", train)
    write_json(metrics / "rehearsal_sweep.json", {"cells": [
        {"n_attempts": 0, "mode": "none", "rehearser": "none", "success_rate": 0.25, "gain_vs_none": 0.0},
        {"n_attempts": 1, "mode": "parallel", "rehearser": "trained", "success_rate": 0.5, "gain_vs_none": 0.25}]})
    plots.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"step": [1.0, 2.0], "reward/mean": [0.25, 0.5], "adv/act/mean": [0.0, 0.1],
                  "adv/act/std": [0.5, 0.4], "adv/act/abs_mean": [0.4, 0.3], "adv/rehearse/mean": [0.0, -0.1],
                  "adv/rehearse/std": [0.3, 0.2]}).to_csv(plots / "train_steps.csv", index=False)
    if experiments:
        write_json(metrics / "experiments.json", {"schema_version": SCHEMA_VERSION, "experiments": EXPERIMENTS})


@pytest.fixture
def make_report(tmp_path, paths_under):
    def build(benchmarks: str = "[toolworld]", **kwargs):
        _metrics_dir(tmp_path, **kwargs)
        cfg = compose(["profile=smoke", "tracking=none", f"eval.benchmarks={benchmarks}", *paths_under(tmp_path)])
        summary = report.run(cfg)
        return tmp_path / "reports", summary

    return build


def test_ablation_rows_latest_per_variant_same_profile_and_model_current_run_wins(make_report):
    out, summary = make_report()
    table = pd.read_csv(out / "ablation.csv")
    assert list(table.columns) == ["variant", "run", "toolworld", "Overall", "Overall (all)", "final_reward"]
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
    assert "python -m envace.experiments collect && dvc repro report" in text


def test_every_plot_is_drawn_and_listed(make_report):
    out, summary = make_report()
    assert summary["plots"] == ALL_PLOTS and summary["skipped_plots"] == {}
    for name in ALL_PLOTS:
        assert (out / name).read_bytes()[:4] == b"\x89PNG" and (out / name).stat().st_size > 2000
        assert f"![{name}]({name})" in (out / "report.md").read_text()
    assert {"ablation", "scale"} <= set(summary["tables"])


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


def test_tables_hold_only_measured_numbers_and_the_paper_stays_in_the_reference_section(make_report):
    out, _ = make_report()
    for csv in out.glob("*.csv"):
        assert "32.91" not in csv.read_text() and "36.7" not in csv.read_text(), csv.name
    text = (out / "report.md").read_text()
    measured, reference = text.split("## Reference (paper numbers, not measured here)")
    assert "32.91" not in measured and report.PAPER_REFERENCE in reference


def test_reward_per_variant_uses_each_variants_curves(tmp_path):
    variants = {"grpo (a)": curves_frame({"step": [0, 1], "reward/mean": [None, 0.5]}),
                "per_role (b)": curves_frame({"step": [0, 1], "reward/mean": [0.1, None, 0.3]})}  # padded
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
    current = RunResult(run="workspace", params={"profile": "smoke", "model.name": "tiny", "algo.name": "envace"},
                        success={"toolworld": 0.375})
    chosen = latest_per(runs, current, vary="algo.name", same=("profile", "model.name"))
    assert {r.params["algo.name"]: r.run for r in chosen} == {"grpo": "grpo-new", "per_role": "per-role",
                                                             "envace": "workspace"}
    with pytest.raises(ValueError, match="envace.experiments collect"):
        collected_runs({"schema_version": 999, "experiments": []})


@pytest.mark.parametrize("name, size", [("qwen3-1.7b", 1.7e9), ("qwen3-8b", 8e9), ("smollm2-135m", 1.35e8),
                                        ("tiny", 0.0)])
def test_model_size_from_the_name(name, size):
    assert model_size(name) == pytest.approx(size)


def test_dvc_yaml_declares_every_report_figure_and_with_no_data_none_is_drawn(tmp_path):
    import yaml

    from envace.reporting.plots import save_plots

    empty = pd.DataFrame()
    made, skipped = save_plots(tmp_path, steps=empty, curves=empty, variants={}, testtime=empty)
    assert made == [] and list(skipped) == ALL_PLOTS and not list(tmp_path.iterdir())
    dvc_yaml = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())
    assert dvc_yaml["plots"] == [f"${{paths.reports}}/{name}" for name in ALL_PLOTS]


def test_benchmark_table_lists_each_benchmarks_own_aggregates():
    from envace.reporting.tables import benchmark_table, main_table, overall_note

    m = {
        "evaluate_bfcl": {"benchmark": "bfcl", "policy": {
            "success_rate": 0.5, "context_overflows": 1,
            "categories": {"simple_python": {"status": "ran", "accuracy": 0.5, "n": 2},
                           "web_search_base": {"status": "not_runnable_offline", "reason": "network"}},
            "aggregates": {"overall": 0.5, "multi_turn": None}}},
        "evaluate_tau2": {"benchmark": "tau2", "policy": {
            "success_rate": 0.25, "domains": {"telecom:base": {"status": "ran", "avg_reward": 0.25, "pass^1": 0.25,
                                                               "pass^2": 0.0, "n_tasks": 4}}}},
        "evaluate_finmcp": {"benchmark": "finmcp", "base": {
            "success_rate": 0.0, "finmcp": {"overall": {"macro": {"f1": 0.4}, "exact_match": 0.0}}}},
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
