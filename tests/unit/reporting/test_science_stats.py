"""The science matrix's statistics (envace.reporting.science_stats) and its layout (envace.stages.science)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from envace.config.load import compose, load_params
from envace.reporting.metrics_files import read_metrics
from envace.reporting.science_stats import comparisons, mean_interval, outcomes_of, paired_difference
from envace.stages.science import cell_name, part_overrides


def rows(successes, held_out_every: int = 0):
    return [
        {
            "task_id": f"t{i:02d}",
            "success": bool(s),
            "domain": "bank",
            "held_out": bool(held_out_every and i % held_out_every == 0),
            "held_out_kind": "domain" if held_out_every and i % held_out_every == 0 else None,
        }
        for i, s in enumerate(successes)
    ]


def test_runs_on_different_tasks_are_refused():
    a, b = rows([1, 0, 1]), rows([1, 0, 1])
    b[2]["task_id"] = "other"
    with pytest.raises(ValueError, match="different test tasks"):
        outcomes_of([a, b], " of variant x")


def test_pairing_on_tasks_finds_a_small_consistent_gain():
    """B solves 10 of 40 tasks; A solves the same 10 plus 5 more. Paired on tasks, every resample's
    difference is >= 0 and 0 only if no gained task is drawn (p ~ 0.5%), so the interval excludes 0.
    Unpaired, the same rates (37.5% vs 25%) over 40 tasks would give an interval covering 0."""
    base = [1] * 10 + [0] * 30
    better = [1] * 15 + [0] * 25
    d = paired_difference(outcomes_of([rows(better)]), outcomes_of([rows(base)]), n_boot=2000)
    assert d["diff"] == pytest.approx(5 / 40)
    assert d["ci95"][0] > 0 and d["verdict"] == "A > B"
    # the order of tasks in a file does not matter: the pairing is by task id
    shuffled = list(reversed(rows(base)))
    assert paired_difference(outcomes_of([rows(better)]), outcomes_of([shuffled]), n_boot=2000) == d


def test_identical_outcomes_cannot_tell_and_opposite_ones_can():
    same = outcomes_of([rows([1, 0] * 20)])
    d = paired_difference(same, same, n_boot=500)
    assert d["diff"] == 0 and d["ci95"] == [0.0, 0.0] and d["verdict"] == "cannot tell"
    worse = paired_difference(outcomes_of([rows([0] * 40)]), outcomes_of([rows([1] * 40)]), n_boot=500)
    assert worse["diff"] == -1 and worse["verdict"] == "A < B"


def test_seed_spread_widens_the_interval():
    """Two seeds that disagree (one solves 30 of 40, the other 10) resample to a wider interval than one
    seed at their mean; a single run keeps its one row."""
    split = outcomes_of([rows([1] * 30 + [0] * 10), rows([0] * 30 + [1] * 10)])
    one = outcomes_of([rows([1, 0] * 20)])
    wide, narrow = mean_interval(split, 2000), mean_interval(one, 2000)
    assert wide["mean"] == narrow["mean"] == 0.5
    assert wide["n_seeds"] == 2 and narrow["n_seeds"] == 1 and wide["per_seed"] == [0.75, 0.25]
    assert (wide["ci95"][1] - wide["ci95"][0]) > (narrow["ci95"][1] - narrow["ci95"][0])


def test_held_out_subset_keeps_only_held_out_domain_tasks():
    o = outcomes_of([rows([1, 0, 0, 1, 1, 0], held_out_every=3)])
    held = o.subset("held_out_domain")
    assert held.task_ids == ("t00", "t03") and held.mean == 1.0
    assert o.subset("in_domain").task_ids == ("t01", "t02", "t04", "t05")


def test_comparisons_are_envace_vs_each_variant_and_each_vs_the_sft_base():
    assert comparisons(["envace", "grpo", "per_role"]) == [
        ("envace", "grpo"),
        ("envace", "per_role"),
        ("envace", "sft_base"),
        ("grpo", "sft_base"),
        ("per_role", "sft_base"),
    ]


def test_cells_share_data_and_start_but_not_outputs():
    cfg = compose(["profile=cpu"])
    s = cfg.science
    runs = {(v, k): part_overrides(cfg, "cell", v, k) for v in ("envace", "grpo") for k in (0, 1)}
    for (variant, seed), (train, evaluate) in runs.items():
        for overrides in (train, evaluate):
            assert f"data.seed={s.data_seed}" in overrides and f"seed={seed}" in overrides
            assert f"model.path={s.dir}/sft/final/policy" in overrides and "train.sft_epochs=0" in overrides
            assert f"paths.checkpoints={s.dir}/cells/{cell_name(variant, seed)}/checkpoints" in overrides
        assert f"algo.name={variant}" in train or variant == cfg.algo.name
        assert f"train.steps={s.steps}" in train
        assert "eval.compare_base=false" in evaluate
    # a cell selects the variant's config group, so grpo gets its own baseline, not the profile's envace one
    (grpo_train, _) = runs[("grpo", 0)]
    assert "algo.name=grpo" in grpo_train and "algo.baseline=trajectory_mean" in grpo_train
    composed = compose(["profile=cpu", *grpo_train]).algo
    assert composed == compose(["profile=cpu", "algo=grpo"]).algo
    (sft_eval,) = part_overrides(cfg, "sft_eval")
    assert "eval.compare_base=true" in sft_eval and f"paths.checkpoints={s.dir}/sft" in sft_eval


def test_the_sft_part_runs_no_validation_probe_so_its_final_metrics_are_the_warm_ups():
    # the organism profile probes validation every 25 steps; in an SFT-only run (train.steps=0) that probe's
    # step-0 row would be the last history row, i.e. the run's final metrics, in place of final/sft/loss
    cfg = compose(["profile=organism"])
    assert int(cfg.train.val_every) > 0
    (sft,) = part_overrides(cfg, "sft")
    assert "train.steps=0" in sft
    assert compose(["profile=organism", *sft]).train.val_every == 0


def test_testtime_grid_is_whole_for_the_first_seed_only():
    cfg = compose(["profile=cpu"])
    (first,) = part_overrides(cfg, "testtime", "envace", 0)
    (other,) = part_overrides(cfg, "testtime", "envace", 1)
    (base,) = part_overrides(cfg, "testtime_base", "envace", 0)  # the first seed's base-rehearser half
    assert "rehearsal.rehearsers=[trained]" in first and "rehearsal.modes=[parallel,sequential]" in first
    assert "rehearsal.rehearsers=[base,oracle]" in base and "rehearsal.modes=[parallel,sequential]" in base
    assert f"rehearsal.n_attempts_grid=[{','.join(map(str, cfg.science.testtime_n_attempts_grid))}]" in first
    assert "rehearsal.rehearsers=[trained]" in other and "rehearsal.n_attempts_grid=[0,2]" in other
    assert np.all([f"rehearsal.n_tasks={cfg.science.testtime_n_tasks}" in o for o in (first, other)])


def _write(path, data):
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("split", [False, True], ids=["one-sweep", "base-half-apart"])
def test_aggregate_writes_science_json_and_the_report(tmp_path, split):
    """Per-part files as the science stages write them -> science.json's layout and science.md's tables.
    ``split``: the base rehearser's cells come from stage testtime_base (base_rehearser/testtime/<cell>),
    as the DAG runs them; the aggregate folds them in with the same pairing as one whole sweep."""
    from envace.reporting.science import aggregate

    cfg = compose(
        [
            "profile=cpu",
            f"science.metrics={tmp_path}/m",
            f"science.json={tmp_path}/science.json",
            f"science.reports={tmp_path}/report",
            "science.variants=[envace,grpo]",
            "science.seeds=[0,1]",
            "science.bootstrap_resamples=300",
            "science.positive_control.min_seeds=1",
        ]
    )
    m = tmp_path / "m"
    base = [1] * 4 + [0] * 36
    for seed, end in ((0, 0.25), (1, 0.15)):  # the gate's validation half: +15 and +5 points
        csv = m / "cells" / f"grpo-seed{seed}" / "train_steps.csv"
        csv.parent.mkdir(parents=True, exist_ok=True)
        csv.write_text(f"step,val/success,reward/mean\n0,0.1,0.2\n1,,0.3\n2,{end},0.4\n")
    _write(m / "sft" / "tasks.json", {"policy": rows(base, 5), "base": rows([0] * 40, 5)})
    _write(m / "sft" / "evaluate_toolworld.json", {"policy": {"success_rate": 0.1, "n_tasks": 40}})
    for variant, gained in (("envace", 10), ("grpo", 4)):
        for seed in (0, 1):
            cell = m / "cells" / f"{variant}-seed{seed}"
            _write(cell / "tasks.json", {"policy": rows([1] * (gained + seed) + [0] * (40 - gained - seed), 5)})
            _write(cell / "train.json", {"steps_done": 4, "final": {"reward/mean": 0.3}})
            _write(cell / "evaluate_toolworld.json", {"policy": {"success_rate": 0.1, "n_tasks": 40}})
    sweep = {
        "cells": {
            "toolworld/none/n0/none": {"success_rate": 0.1, "n_attempts": 0},
            "toolworld/parallel/n2/trained": {"success_rate": 0.2, "n_attempts": 2},
            "toolworld/parallel/n2/base": {"success_rate": 0.1, "n_attempts": 2},
        }
    }
    tasks = {
        "n0-none-none": rows(base),
        "n2-parallel-trained": rows([1] * 8 + [0] * 32),
        "n2-parallel-base": rows(base),
    }
    halves = {m / "testtime" / "envace-seed0": lambda key: True}
    if split:
        halves = {
            m / "testtime" / "envace-seed0": lambda key: not key.endswith("base"),
            m / "base_rehearser" / "testtime" / "envace-seed0": lambda key: key.endswith("base"),
        }
    for tt, keep in halves.items():
        _write(tt / "rehearsal_sweep.json", {"cells": {k: v for k, v in sweep["cells"].items() if keep(k)}})
        _write(tt / "tasks.json", {k: v for k, v in tasks.items() if keep(k)})
    aggregate(cfg)
    out = read_metrics(tmp_path / "science.json")  # the headline merged with its details
    assert out["envace/seed1"]["success"] == pytest.approx(11 / 40) and out["envace/seed1"]["n"] == 40
    assert out["envace/seed0"]["tasks"]["t00"] == 1 and out["sft_base"]["success"] == pytest.approx(0.1)
    diffs = out["aggregate"]["differences"]
    assert set(diffs) == {"envace-grpo", "envace-sft_base", "grpo-sft_base"}
    assert diffs["envace-sft_base"]["all"]["diff"] == pytest.approx(10.5 / 40 - 0.1)
    assert diffs["envace-sft_base"]["all"]["verdict"] == "A > B"  # a consistent gain on the same tasks
    assert out["aggregate"]["variants"]["envace"]["held_out_domain"]["n_tasks"] == 8
    assert {"envace/seed0/parallel/n2/trained", "envace/seed0/parallel/n2/base"} <= set(out["testtime"])
    assert out["testtime_comparisons"]["envace/seed0/parallel/n2/base-vs-n0"]["diff"] == pytest.approx(0.0)
    assert out["testtime_comparisons"]["envace/seed0/parallel/n2/trained-vs-base"]["diff"] == pytest.approx(0.1)
    primary = out["primary"]["comparisons"]  # the declared family, 2 seeds (1 for the test-time cells)
    assert out["primary"]["family"] == list(cfg.science.primary.comparisons)
    assert out["primary"]["family_size"] == 4 and set(primary) == set(out["primary"]["family"])
    assert primary["envace-sft_base"]["per_seed"] == pytest.approx([0.15, 0.175])
    assert primary["envace-sft_base"]["p"] == 0.25 == primary["envace-sft_base"]["min_attainable_p"]
    assert primary["envace-sft_base"]["p_holm"] == 1.0 and primary["envace-sft_base"]["verdict"] == "not supported"
    assert primary["envace/parallel/n2/trained-vs-base"]["per_seed"] == pytest.approx([0.1])
    assert out["primary"]["interval_level"] == pytest.approx(1 - 0.05 / 4)
    report = (tmp_path / "report" / "science.md").read_text()
    assert "envace − sft_base = +16.2" in report and "paper (Qwen3-8B, reference)" in report
    primary_md, exploratory_md = report.split("## Primary comparisons")[1].split("## Exploratory differences")
    assert "| envace-grpo " in primary_md and "98.75% CI" in primary_md and "at least 7 seeds" in primary_md
    assert "| envace − grpo " in exploratory_md.split("## World-model")[0]
    assert "verdict" not in exploratory_md.split("## World-model")[0]
    assert {p.name for p in (tmp_path / "report").glob("*.png")} >= {"science_main.png", "science_testtime.png"}
    # the gate on the matrix's own grpo cells: seed 0 gains +15 (>= 10 in >= 1 seed), but grpo - SFT start on
    # the test split (+1.25 points) has an interval covering 0, so it does not hold
    gate = out["positive_control"]
    assert gate["validation"]["0"]["gain_points"] == pytest.approx(15) and gate["seeds_with_gain"] == 1
    assert gate["validation_passed"] is True and gate["test_passed"] is False and gate["passed"] is False
    assert gate["test_minus_start"]["diff"] == pytest.approx(4.5 / 40 - 0.1)
    assert out["design"]["model"] == cfg.model.name
    # science.md opens with the claims, then the calibration and the gate
    assert report.index("## The paper's claims") < report.index("## Calibration") < report.index("## The positive")
    assert "seed 0: 10% → 25% (+15)" in report and "The gate **does not hold**" in report
    assert "Self-rehearsal beats training on a frozen simulator's responses" in report


def test_the_gate_is_undecided_without_a_validation_curve():
    from envace.reporting.science import gate_text, positive_control

    summary = {"cells": {}, "aggregate": {"differences": {}}}
    gate = positive_control(summary, {"variant": "grpo", "min_gain_points": 10, "min_seeds": 4}, 5)
    assert gate["passed"] is None and gate["validation_passed"] is None and gate["test_passed"] is None
    assert "**Not measured**" in gate_text(gate)


@pytest.mark.parametrize(
    ("gains", "expected"),
    [
        ([12, 15, 11, 10], True),  # 4 of 5 reached: holds whatever the fifth does
        ([12, 15, 3], None),  # part-way: two more seeds could still reach 4
        ([12, 2, 3], False),  # two short already: at most 3 of 5 can reach it
        ([12, 15, 11, 10, 3], True),
    ],
)
def test_the_validation_half_is_decided_only_when_the_remaining_seeds_cannot_change_it(tmp_path, gains, expected):
    from envace.reporting.science import positive_control

    cells = {}
    for seed, gain in enumerate(gains):
        d = tmp_path / f"grpo-seed{seed}"
        d.mkdir()
        (d / "train_steps.csv").write_text(f"step,val/success\n0,0.2\n60,{0.2 + gain / 100}\n")
        cells[f"grpo/seed{seed}"] = {"variant": "grpo", "seed": seed, "dir": str(d)}
    summary = {"cells": cells, "aggregate": {"differences": {}}}
    gate = positive_control(summary, {"variant": "grpo", "min_gain_points": 10, "min_seeds": 4}, 5)
    assert gate["validation_passed"] is expected and gate["seeds_measured"] == len(gains)
    assert gate["passed"] is None  # no test half without sft_base


def test_the_base_half_may_not_repeat_a_cell_of_the_trained_half(tmp_path):
    from envace.reporting.science_stats import testtime_cells

    cell = {"cells": {"toolworld/none/n0/none": {"success_rate": 0.1, "n_attempts": 0}}}
    for half in ("testtime", "base_rehearser/testtime"):
        _write(tmp_path / half / "envace-seed0" / "rehearsal_sweep.json", cell)
    with pytest.raises(ValueError, match=r"repeats test-time cells .*envace/seed0/none/n0/none.*testtime_base"):
        testtime_cells(tmp_path)


def test_the_base_half_is_the_first_seeds_grid_without_n0():
    cfg = compose(
        [
            "profile=cpu",
            "science.seeds=[3,1]",
            "science.testtime_n_attempts_grid=[0,1,4]",
            "+science.testtime_max_n_by_mode.sequential=2",
        ]
    )
    (overrides,) = part_overrides(cfg, "testtime_base", "envace", 3)
    assert "rehearsal.rehearsers=[base,oracle]" in overrides and "rehearsal.n_attempts_grid=[1,4]" in overrides
    s = cfg.science
    assert f"paths.metrics={s.metrics}/base_rehearser/testtime/envace-seed3" in overrides
    assert f"paths.rehearsal={s.dir}/testtime_base/envace-seed3" in overrides
    (trained,) = part_overrides(cfg, "testtime", "envace", 3)  # the trained half keeps N=0
    assert "rehearsal.rehearsers=[trained]" in trained and "rehearsal.n_attempts_grid=[0,1,4]" in trained
    (other,) = part_overrides(cfg, "testtime", "envace", 1)
    assert "rehearsal.n_attempts_grid=[0,2]" in other and "rehearsal.modes=[parallel]" in other
    # the first seed's per-mode caps reach the sweep (both halves), and compose as a typed dict
    assert "rehearsal.max_n_by_mode={sequential: 2}" in trained and not any("max_n" in o for o in other)
    assert "rehearsal.max_n_by_mode={sequential: 2}" in overrides
    (uncapped,) = part_overrides(compose(["profile=cpu"]), "testtime", "envace", 0)  # the default: the full grid
    assert not any("max_n" in o for o in uncapped)


def test_the_stage_overrides_load_over_params_yaml(tmp_path):
    """The parts' overrides go to ``load_params`` (params.yaml + a dot list), as the stages read them."""
    cfg = compose(
        ["profile=cpu", "+science.testtime_max_n_by_mode.sequential=2", "+science.testtime_max_n_by_mode.parallel=3"]
    )
    params = tmp_path / "params.yaml"
    OmegaConf.save(cfg, params)
    (trained,) = part_overrides(cfg, "testtime", "envace", int(cfg.science.seeds[0]))
    loaded = load_params(params, trained)
    assert dict(loaded.rehearsal.max_n_by_mode) == {"sequential": 2, "parallel": 3}
    assert list(loaded.rehearsal.n_attempts_grid) == list(cfg.science.testtime_n_attempts_grid)
    with pytest.raises(ValueError, match="no N > 0"):
        part_overrides(compose(["profile=cpu", "science.testtime_n_attempts_grid=[0]"]), "testtime_base", "envace", 0)
    with pytest.raises(ValueError, match="first seed"):
        part_overrides(cfg, "testtime_base", "envace", 1)


def test_testtime_table_reports_how_many_episodes_ended_on_an_act_parse_error():
    from envace.reporting.science_tables import testtime_table

    ended = [{"termination": t} for t in ("act_parse_error", "final_reply", "act_parse_error", "max_steps")]
    cells = {
        "envace/seed0/none/n0/none": {"success_rate": 0.25, "tasks": ended[1:]},
        "envace/seed0/parallel/n2/trained": {"success_rate": 0.0, "tasks": ended},
        "envace/seed0/parallel/n4/base": {"success_rate": 0.0},
        "envace/seed0/sequential/n1/trained": {"success_rate": 0.0, "same_as": "n1-parallel-trained"},
    }
    table = testtime_table(cells, {}).set_index("N")
    assert table.loc[1, "same run as"] == "n1-parallel-trained" and table.loc[4, "same run as"] == "–"
    assert table.loc[0, "ended by ACT parse error %"] == "33.3"
    assert table.loc[2, "ended by ACT parse error %"] == "50.0"
    assert table.loc[4, "ended by ACT parse error %"] == "–"  # no per-task rows: not measured


def _stage_overrides(stage: str) -> list[str]:
    """The key=value arguments that science/dvc.yaml's ``stage`` passes on its command line."""
    import shlex
    from pathlib import Path

    import yaml

    spec = yaml.safe_load((Path(__file__).parents[3] / "science" / "dvc.yaml").read_text())["stages"][stage]
    return [a for a in shlex.split(spec["cmd"]) if "=" in a and not a.startswith("-")]


def test_sft_eval_compares_the_sft_checkpoint_with_the_untrained_model_and_cells_score_gold_calls():
    """``auto`` would pick the SFT weights the checkpoint lists, i.e. the evaluated policy itself; a cell
    scores REHEARSE on the oracle's calls without the (costly) pass over its own calls."""
    from envace.config.enums import EvalBaseline
    from envace.config.load import typed_config
    from envace.stages.suites import eval_suite

    cfg = compose(["profile=cpu"])
    (overrides,) = part_overrides(cfg, "sft_eval")
    final = typed_config(compose(["profile=cpu", *overrides, *_stage_overrides("sft_eval")]))
    assert final.eval.baseline == EvalBaseline.base
    assert final.eval.compare_base and final.eval.fidelity and final.eval.gold_fidelity_tasks > 0
    assert eval_suite(final, "toolworld").gold_fidelity_tasks == final.eval.gold_fidelity_tasks
    _, evaluation = part_overrides(cfg, "cell", "envace", 0)
    cell = typed_config(compose(["profile=cpu", *evaluation, *_stage_overrides("cell")]))
    assert not cell.eval.compare_base and not cell.eval.fidelity
    assert eval_suite(cell, "toolworld").gold_fidelity_tasks == cfg.science.gold_fidelity_tasks > 0


def test_gold_fidelity_table_counts_the_scored_calls(tmp_path):
    from envace.reporting.science_tables import fidelity_table

    gold = {"n": 11, "exact_match": 0.0909, "field_f1": 0.3256, "error_agreement": 0.9091}
    _write(tmp_path / "sft" / "evaluate_toolworld.json", {"policy": {"fidelity_gold": gold}, "base": {}})
    (row,) = fidelity_table(tmp_path, {}).to_dict("records")
    assert row == {
        "rehearser": "sft_base",
        "calls": 11,
        "exact match": "9.1",
        "field F1": "32.6",
        "error agreement": "90.9",
    }


def test_claim_two_also_reads_the_frozen_rehearse_ablation_when_it_ran():
    from envace.reporting.science import claims_reading

    def diff(value, lo, hi, verdict):
        return {"all": {"diff": value, "ci95": [lo, hi], "verdict": verdict, "n_tasks": 40, "n_seeds": [3, 3]}}

    agg = {"differences": {"envace-grpo": diff(0.0, -0.05, 0.05, "cannot tell")}, "testtime": {}}
    assert not any("frozen_rehearse" in line for line in claims_reading(agg))
    agg["differences"]["envace-frozen_rehearse"] = diff(-0.1, -0.2, -0.025, "A < B")
    (line,) = [x for x in claims_reading(agg) if "frozen_rehearse" in x]
    assert "envace − frozen_rehearse = -10.0 [-20.0, -2.5] points (40 tasks) → exploratory" in line
    assert not any("frozen_act" in line for line in claims_reading(agg))
    agg["differences"]["envace-frozen_act"] = diff(0.05, 0.0, 0.1, "cannot tell")
    (line,) = [x for x in claims_reading(agg) if "frozen_act" in x]
    assert (
        "ACT not trained" in line and "envace − frozen_act = +5.0 [+0.0, +10.0] points (40 tasks) → exploratory" in line
    )


def test_claims_read_a_declared_primary_with_its_corrected_verdict():
    from envace.reporting.science import claims_reading

    row = {"diff": 0.1, "ci": [0.02, 0.2], "per_seed": [0.1] * 5, "n_seeds": 5, "p": 1 / 32, "p_holm": 1 / 32}
    agg = {
        "differences": {},
        "testtime": {},
        "primary": {
            "alpha": 0.05,
            "comparisons": {"envace-grpo": {**row, "min_attainable_p": 1 / 32, "verdict": "supported"}},
        },
    }
    (line,) = [x for x in claims_reading(agg) if "GRPO" in x]
    assert "envace − grpo = +10.0 [+2.0, +20.0] points" in line and "Holm-adjusted 0.0312" in line
    assert "smallest attainable with 5 seeds: 0.0312" in line and "**supported**" in line


# ---- the primary family: Holm over a seed-level sign-flip test (envace.reporting.science_family) ----------


def test_holm_matches_a_hand_computation():
    """p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06,
    0.04·1 = 0.04 → 0.06 (adjusted p never fall along the order). At α = 0.05 the 1st and 4th are rejected."""
    from envace.reporting.science_family import holm

    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted.tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert (adjusted < 0.05).tolist() == [True, False, False, True]
    assert holm([0.3, 0.6]).tolist() == pytest.approx([0.6, 0.6])  # capped at the largest, never above 1
    assert holm([0.7, 0.9]).tolist() == pytest.approx([1.0, 1.0])
    # batched over leading axes: each row is its own family
    assert np.allclose(holm(np.array([[0.01, 0.04], [0.04, 0.01]])), [[0.02, 0.04], [0.04, 0.02]])


def test_sign_flip_p_is_exact_on_a_tiny_example():
    """Seed differences (+0.1, +0.2, −0.05): the 8 sign patterns give sums ±0.35, ±0.25, ±0.15, ±0.05;
    two of them (0.35, 0.25) reach the observed 0.25, so the one-sided p is 2/8."""
    from envace.reporting.science_family import min_attainable_p, sign_flip_p

    assert sign_flip_p(np.array([0.1, 0.2, -0.05])) == pytest.approx(2 / 8)
    assert sign_flip_p(np.array([0.1, 0.2, 0.05])) == pytest.approx(1 / 8)  # all positive: the identity only
    assert sign_flip_p(np.array([0.0, 0.0, 0.0])) == pytest.approx(1.0)  # no difference: every pattern ties
    assert sign_flip_p(np.array([[0.1, 0.2, 0.05], [-0.1, -0.2, -0.05]])).tolist() == pytest.approx([1 / 8, 1.0])
    assert min_attainable_p(3) == 1 / 8 and min_attainable_p(5) == 1 / 32 and min_attainable_p(0) == 1.0
    # more seeds than are enumerated: random patterns from a fixed seed, p = (1 + hits) / (1 + draws)
    many = np.full(20, 0.1)
    assert sign_flip_p(many, permutations=999) == pytest.approx(1 / 1000)
    assert min_attainable_p(20, permutations=999) == pytest.approx(1 / 1000)
    mixed = np.linspace(-0.1, 0.3, 20)
    assert sign_flip_p(mixed, permutations=999) == sign_flip_p(mixed, permutations=999)  # seeded


def _seed_differences(rng, sims: int, seeds: int, tasks: int, effect: float) -> np.ndarray:
    """Synthetic science cells: per-seed A − B differences of mean success, shape (sims, seeds).

    Each task has a difficulty shared by both arms and every seed (the same test tasks); each training
    seed shifts an arm's skill (training randomness: a part shared by both arms of that seed, a part of
    its own); outcomes are Bernoulli. ``effect`` adds that many points to A's success probability."""
    difficulty = rng.normal(-0.5, 1.5, size=(sims, 1, 1, tasks))
    shared_seed = rng.normal(0.0, 0.2, size=(sims, 1, seeds, 1))
    own_seed = rng.normal(0.0, 0.2, size=(sims, 2, seeds, 1))
    prob = 1 / (1 + np.exp(-(difficulty + shared_seed + own_seed)))
    prob[:, 0] = np.clip(prob[:, 0] + effect, 0.0, 1.0)
    means = (rng.random(prob.shape) < prob).mean(axis=-1)  # (sims, arms, seeds)
    return means[:, 0] - means[:, 1]


def test_verdict_false_positive_rate():
    """The primary verdict (one-sided sign-flip over seeds, Holm over the family) on synthetic outcomes:
    with no effect it says "supported" in at most 5% of 2,000 simulated matrices of 5 seeds × 400 tasks;
    with +10 points it has power (printed). A family of four null comparisons (7 seeds) keeps its
    family-wise rate at most 5%, and finds one real effect among them (power printed)."""
    from envace.reporting.science_family import family_verdicts

    rng = np.random.default_rng(2024)
    sims, alpha = 2000, 0.05
    null = _seed_differences(rng, sims, 5, 400, 0.0)[:, None, :]  # a family of one: (sims, 1, seeds)
    fpr = family_verdicts(null, alpha)["supported"].mean()
    power = family_verdicts(_seed_differences(rng, sims, 5, 400, 0.10)[:, None, :], alpha)["supported"].mean()
    print(f"\none primary, 5 seeds x 400 tasks: false-positive rate {fpr:.3f}, power at +10 points {power:.3f}")
    assert fpr <= alpha and power >= 0.6

    # four primaries need 7 seeds: Holm's first step asks p <= 0.05/4 and 1/2^7 is the first p below it
    family = np.stack([_seed_differences(rng, sims // 2, 7, 400, 0.0) for _ in range(4)], axis=1)
    fwer = family_verdicts(family, alpha)["supported"].any(axis=1).mean()
    family[:, 0] = _seed_differences(rng, sims // 2, 7, 400, 0.10)
    found = family_verdicts(family, alpha)["supported"][:, 0].mean()
    print(
        f"four primaries, 7 seeds: family-wise false-positive rate {fwer:.3f}, power of the one real effect {found:.3f}"
    )
    assert fwer <= alpha and found >= 0.6


def test_unknown_primary_names_are_refused_with_the_valid_ones():
    from envace.reporting.science_family import check_family

    cfg = compose(["profile=cpu"])
    s = cfg.science
    check_family(s)  # the declared family names comparisons this matrix has
    bad = compose(["profile=cpu", "science.primary.comparisons=[envace-gpro,envace/parallel/n2/trained-vs-n0]"])
    with pytest.raises(ValueError, match=r"envace-gpro.*envace-grpo.*envace-sft_base"):
        check_family(bad.science)
    for name in (
        "grpo/parallel/n2/trained-vs-n0",
        "envace/diagonal/n2/trained-vs-n0",
        "envace/parallel/n0/trained-vs-n0",
    ):
        with pytest.raises(ValueError, match="science.primary.comparisons"):
            check_family(compose(["profile=cpu", f"science.primary.comparisons=[{name}]"]).science)


def _params_here(tmp_path, monkeypatch):
    """A params.yaml composed from conf/ (profile cpu) in ``tmp_path``, the working directory: what a stage reads."""
    OmegaConf.save(compose(["profile=cpu"]), tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)


def test_aggregate_refuses_cells_at_different_precisions(tmp_path, monkeypatch):
    """Cells that ran at different precisions are not comparable: the aggregate stage names them and stops."""
    from envace.stages.science import one_precision, run_part

    _params_here(tmp_path, monkeypatch)
    m = tmp_path / "m"
    _write(m / "sft" / "train.details.json", {"precision": "bf16"})
    _write(m / "cells" / "envace-seed0" / "train.details.json", {"precision": "bf16"})
    _write(m / "cells" / "grpo-seed0" / "train.details.json", {"precision": "bf16"})
    _write(m / "cells" / "grpo-seed0" / "evaluate_toolworld.details.json", {"precision": "fp32"})
    outputs = [f"science.metrics={m}", f"science.json={tmp_path}/science.json", f"science.reports={tmp_path}/r"]
    with pytest.raises(ValueError, match=r"different precisions.*grpo-seed0/evaluate_toolworld: fp32.*sft/train: bf16"):
        run_part("aggregate", None, None, outputs)
    assert not (tmp_path / "science.json").exists()
    _write(m / "cells" / "grpo-seed0" / "evaluate_toolworld.details.json", {"precision": "bf16"})
    assert one_precision(m) == "bf16" and one_precision(tmp_path / "none") is None


def test_cells_run_at_the_precision_the_sft_warm_up_decided(tmp_path, monkeypatch):
    """The matrix's precision is decided once, by the SFT warm-up (its manifest's record): every later part
    runs its training and its models at it, where engine.precision / eval.precision are auto."""
    from envace.stages import science

    _params_here(tmp_path, monkeypatch)
    _write(tmp_path / "sft" / "manifest.json", {"precision": {"precision": "bf16", "device": "cpu"}})
    seen = []
    monkeypatch.setattr(science, "execute", lambda name, fn, cfg, path: seen.append(cfg))
    monkeypatch.setattr(science, "write_task_outcomes", lambda *args: {})
    where = [f"science.dir={tmp_path}", f"science.metrics={tmp_path}/m"]
    assert (load_params("params.yaml").engine.precision, load_params("params.yaml").eval.precision) == ("auto", "auto")
    science.run_part("cell", "envace", 0, where)
    assert [(c.engine.precision, c.eval.precision) for c in seen] == [("bf16", "bf16")] * 2
    seen.clear()
    science.run_part("cell", "envace", 0, [*where, "eval.precision=fp32"])  # an explicit setting stays
    assert [(c.engine.precision, c.eval.precision) for c in seen] == [("bf16", "fp32")] * 2


def test_primary_family_pairs_by_seed_and_keeps_unmeasured_comparisons_in_the_family():
    """envace has seeds 0 and 1, grpo only seed 1: envace − grpo pairs seed 1 alone; the SFT start serves
    both seeds; the test-time primaries were not run, read "not measured" and still count in Holm's m."""
    from envace.reporting.science_family import primary_family

    s = compose(["profile=cpu"]).science
    cells = {
        f"{v}/seed{k}": {"variant": v, "seed": k, "tasks": rows(outcome)}
        for v, k, outcome in (("envace", 0, [1, 1, 0, 0]), ("envace", 1, [1, 1, 1, 0]), ("grpo", 1, [1, 0, 0, 0]))
    }
    summary = {"cells": cells, "groups": {"sft_base": outcomes_of([rows([1, 0, 0, 0])])}, "testtime": {}}
    family = primary_family(summary, s, n_boot=200)
    grpo, sft = family["comparisons"]["envace-grpo"], family["comparisons"]["envace-sft_base"]
    assert grpo["per_seed"] == [0.5] and grpo["n_seeds"] == 1 and grpo["p"] == 0.5
    assert sft["per_seed"] == [0.25, 0.5] and sft["p"] == 0.25 and sft["diff"] == pytest.approx(0.375)
    assert sft["p_holm"] == 1.0 and sft["verdict"] == "not supported"  # 0.25 · 4 primaries, capped
    testtime = family["comparisons"]["envace/parallel/n2/trained-vs-n0"]
    assert testtime["verdict"] == "not measured" and testtime["p"] is None and testtime["p_holm"] is None
    assert family["family_size"] == 4 and family["interval_level"] == pytest.approx(0.9875)


def test_the_efficiency_figure_plots_seed_mean_validation_success_against_real_calls():
    import pandas as pd

    from envace.reporting.science_plots import CURVES, efficiency_figure

    def steps(success, calls):  # probed at steps 0 and 2; step 1 has no probe
        val = [success[0], None, success[1]]
        return pd.DataFrame({"step": [0, 1, 2], "val/success": val, "real_env/calls_total": [100, 140, calls]})

    frames = {"grpo": [steps((0.2, 0.4), 180), steps((0.2, 0.3), 200)], "envace": [steps((0.1, 0.1), 100)]}
    fig = efficiency_figure(frames)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {"grpo (2 seeds)", "envace (1 seeds)"}
    grpo = lines["grpo (2 seeds)"]
    assert list(grpo.get_xdata()) == [100, 190] and list(grpo.get_ydata()) == pytest.approx([0.2, 0.35])
    assert efficiency_figure({"grpo": [pd.DataFrame({"step": [1], "reward/mean": [0.3]})]}) is None
    assert CURVES[0][0] == "val/success"  # the training-curves figure opens with the validation curve


def test_the_cost_table_carries_each_parts_peak_memory(tmp_path):
    from envace.reporting.science_tables import timings

    _write(tmp_path / "cells/grpo-seed0/timing_cell.json", {"part": "cell", "seconds": {"train": 600, "evaluate": 60}})
    _write(tmp_path / "sft/timing_sft.json", {"part": "sft", "seconds": {"train": 30}, "peak_rss_mb": 812.5})
    frame = timings(tmp_path).set_index("part")
    assert frame.loc["cells/grpo-seed0/cell", "minutes"] == 11.0
    assert frame.loc["sft/sft", "peak MiB"] == 812.5 and frame["peak MiB"].isna().sum() == 1  # older files: none


def test_a_matrix_without_a_warm_up_reports_no_untrained_base(tmp_path):
    """The organism's SFT part copies a committed SFT model (no epochs), so its eval's ``base`` is that same
    model: reporting it as "untrained" would put the start's own score on the untrained row."""
    from envace.reporting.science_stats import summarize
    from envace.reporting.science_tables import calibration_table, fidelity_table

    start = rows([1] * 10 + [0] * 30, 5)
    fid = {"fidelity_gold": {"n": 9, "exact_match": 0.5, "field_f1": 0.6, "error_agreement": 1.0}}
    _write(tmp_path / "sft" / "tasks.json", {"policy": start, "base": start})
    evaluate = {
        "policy": {"success_rate": 0.25, "n_tasks": 40, **fid},
        "base": {"success_rate": 0.25, "n_tasks": 40, **fid},
    }
    _write(tmp_path / "sft" / "evaluate_toolworld.json", evaluate)
    _write(tmp_path / "sft" / "train.json", {"n_train_rows": 2000, "steps_done": 0})
    out = summarize(tmp_path, ["envace"], 100)
    assert "untrained_base" not in out["groups"] and "sft_base" in out["groups"]
    assert list(calibration_table(tmp_path)["model"]) == ["SFT'd base (every cell's start)"]
    assert list(fidelity_table(tmp_path, {})["rehearser"]) == ["sft_base"]
    _write(tmp_path / "sft" / "train.json", {"steps_done": 0, "final/sft/loss": 0.41})  # a warm-up ran
    assert "untrained_base" in summarize(tmp_path, ["envace"], 100)["groups"]
    assert len(calibration_table(tmp_path)) == 2 and len(fidelity_table(tmp_path, {})) == 2


def test_the_report_names_the_committed_start_when_the_matrix_runs_no_warm_up():
    from envace.reporting.science import start_text

    assert start_text(compose(["profile=organism"])).startswith("The SFT model at `science/organism/start`")
    assert start_text(compose(["profile=cpu"])).startswith("One SFT warm-up (")


def _sweep(directory, cells):
    """A sweep's files as the rehearsal stage writes them: ``cells`` maps '<mode>/n<N>/<rehearser>' to 0/1 lists."""
    _write(
        directory / "rehearsal_sweep.json",
        {"cells": {f"toolworld/{k}": {"success_rate": float(np.mean(v))} for k, v in cells.items()}},
    )
    labels = {k: "-".join((k.split("/")[1], k.split("/")[0], k.split("/")[2])) for k in cells}
    _write(directory / "tasks.json", {labels[k]: rows(v) for k, v in cells.items()})


def test_the_grid_on_further_seeds_folds_in_pools_over_seeds_and_reports_its_reruns(tmp_path):
    """Stage testtime_grid's halves join the test-time cells; a cell stage testtime already ran keeps
    testtime's run, and the two runs' agreement is reported; comparisons pool over the seeds that have them."""
    from envace.reporting.science_stats import (
        grid_cells,
        staged_testtime_cells,
        testtime_cells,
        testtime_comparisons,
        testtime_reruns,
    )

    n0 = [1] * 10 + [0] * 30
    _sweep(tmp_path / "testtime" / "envace-seed0", {"none/n0/none": n0, "parallel/n2/trained": [1] * 12 + [0] * 28})
    _sweep(tmp_path / "base_rehearser" / "testtime" / "envace-seed0", {"parallel/n2/base": [1] * 11 + [0] * 29})
    _sweep(tmp_path / "testtime" / "envace-seed1", {"none/n0/none": n0, "parallel/n2/trained": [1] * 8 + [0] * 32})
    rerun = [1] * 7 + [0] * 32 + [1]  # two of 40 tasks turn out otherwise on the re-run
    grid = tmp_path / "full_grid"
    _sweep(
        grid / "trained" / "testtime" / "envace-seed1",
        {"none/n0/none": n0, "parallel/n2/trained": rerun, "sequential/n1/trained": [1] * 9 + [0] * 31},
    )
    _sweep(grid / "base" / "testtime" / "envace-seed1", {"parallel/n2/base": [1] * 6 + [0] * 34})
    grid, staged = grid_cells(tmp_path), staged_testtime_cells(tmp_path)
    cells = testtime_cells(tmp_path, grid, staged)
    assert cells == testtime_cells(tmp_path)  # the cells read here or inside
    assert {"envace/seed1/sequential/n1/trained", "envace/seed1/parallel/n2/base"} <= set(cells)
    assert cells["envace/seed1/parallel/n2/trained"]["success_rate"] == pytest.approx(0.2)  # testtime's run kept
    reruns = testtime_reruns(staged, grid)
    assert set(reruns) == {"envace/seed1/none/n0/none", "envace/seed1/parallel/n2/trained"}
    assert testtime_reruns(staged, {}) == {} and testtime_reruns({}, grid) == {}  # a rerun needs both runs
    assert reruns["envace/seed1/none/n0/none"]["agree"] == 1.0
    r = reruns["envace/seed1/parallel/n2/trained"]
    assert (r["success"], r["rerun_success"], r["agree"], r["n_tasks"]) == (0.2, 0.2, pytest.approx(38 / 40), 40)

    out = testtime_comparisons(cells, 200)
    assert out["envace/seed1/parallel/n2/trained-vs-base"]["diff"] == pytest.approx(0.05)  # every seed with both
    pooled = out["envace/parallel/n2/trained-vs-n0"]
    assert pooled["seeds"] == [0, 1] and pooled["per_seed"] == pytest.approx([0.05, -0.05])
    assert pooled["diff"] == pytest.approx(0.0) and pooled["n_tasks"] == 40
    assert out["envace/parallel/n2/trained-vs-base"]["per_seed"] == pytest.approx([0.025, 0.05])
    assert "envace/sequential/n1/trained-vs-n0" not in out  # one seed: no pooled row, the seed's own row only
    assert "envace/seed1/sequential/n1/trained-vs-n0" in out


def test_the_grids_two_halves_may_not_hold_the_same_cell(tmp_path):
    from envace.reporting.science_stats import testtime_cells

    for half in ("trained", "base"):
        _sweep(tmp_path / "full_grid" / half / "testtime" / "envace-seed1", {"parallel/n2/base": [1, 0]})
    with pytest.raises(ValueError, match=r"two halves hold the same test-time cells.*testtime_grid"):
        testtime_cells(tmp_path)
