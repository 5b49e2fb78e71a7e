"""The organism calibration driver's verdicts: the gate rule, Wilson intervals, a run without SFT epochs."""

from __future__ import annotations

import json

import pytest

from envace.stages.organism_calibration import gate_verdicts, sft_loss, wilson


def _gate(name: str, deltas: list[float]) -> list[dict]:
    return [{"kind": "gate", "name": name, "seed": s, "delta_points": d} for s, d in enumerate(deltas)]


def test_gate_holds_only_with_four_of_five_seeds_gaining_ten_points():
    assert gate_verdicts(_gate("a", [12, 15, 3, 11, 10]))[0].endswith("HOLDS")
    assert gate_verdicts(_gate("a", [12, 15, 3, 11, 9.9]))[0].endswith("does not hold")
    # decided early: with 0 of 2 gained, 3 remaining seeds cannot make 4
    assert gate_verdicts(_gate("a", [-5, 0]))[0].endswith("does not hold")
    assert gate_verdicts(_gate("a", [12]))[0].endswith("undecided")
    assert "deltas +0.0, +0.0, +1.0" in gate_verdicts(_gate("b", [0, 0, 1, 3, 2]))[0]
    # another variant's cells of the same run are not the positive control: they never decide the gate
    rows = _gate("c", [12, 12, 12, 12]) + [{**r, "variant": "envace"} for r in _gate("c", [0, 0, 0, 0, 0])]
    assert gate_verdicts(rows) == [
        "- gate c: 4 of 4 seeds gained >= 10 points (deltas +12.0, +12.0, +12.0, +12.0): undecided"
    ]


def test_wilson_interval_of_18_in_100():
    lo, hi = wilson(18, 100)
    assert (round(lo, 3), round(hi, 3)) == (0.117, 0.267)
    assert wilson(0, 0) == (0.0, 1.0)


def test_sft_loss_is_none_without_an_sft_epoch(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"final/sft/loss": float("nan")}))
    assert sft_loss(path) is None
    path.write_text(json.dumps({"final/sft/loss": 0.12227}))
    assert sft_loss(path) == pytest.approx(0.1223)
    assert sft_loss(tmp_path / "missing.json") is None


def test_budget_fit_counts_the_gold_outputs_a_budget_would_cut(tmp_path, monkeypatch):
    """``budgets``: per task the longest gold ACT output in the run's tokens; the count over the budget must
    shrink to 0 as the budget reaches the longest output, and the numbers follow the run's own params."""
    import yaml

    from envace.config.load import compose, to_plain
    from envace.models.toolworld_lm import OrganismConfig, save_organism
    from envace.stages import organism_calibration as oc
    from envace.stages.organism import tokenizer_corpus

    small = OrganismConfig(n_corpus_tasks=20, n_val=5, n_test=5, vocab_size=512)
    params = to_plain(compose(["profile=organism", "science.n_train=6", "science.n_val=4", "science.n_test=4"]))
    run = tmp_path / "data" / "organism" / "runs" / "r"
    save_organism(small, tokenizer_corpus(small), run / params["science"]["dir"] / "sft" / "final" / "policy")

    def fit(act_budget: int) -> dict:
        params["rollout"]["max_act_tokens"] = params["eval"]["act_max_new_tokens"] = act_budget
        (run / "params.yaml").write_text(yaml.safe_dump(params))
        return oc.budget_fit("r")

    monkeypatch.setattr(oc, "ROOT", tmp_path)
    tight = fit(8)
    assert [tight["splits"][s]["tasks"] for s in ("train", "val", "test")] == [6, 4, 4]
    assert tight["act_budget"] == 8 and tight["splits"]["val"]["tasks_over_act_budget"] == 4
    longest = max(v["act_max"] for v in tight["splits"].values())
    roomy = fit(longest)
    assert all(v["tasks_over_act_budget"] == 0 for v in roomy["splits"].values())
    assert roomy["splits"]["val"]["act_median"] == tight["splits"]["val"]["act_median"] > 8


def _tasks(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    (path / "tasks.json").write_text(json.dumps({"policy": rows}))


def test_outcome_counts_successes_per_domain(tmp_path):
    from envace.stages.organism_calibration import outcome

    rows = [
        {"domain": "bank", "success": True},
        {"domain": "bank", "success": False},
        {"domain": "calendar", "success": False},
        {"domain": "shop", "success": True},
    ]
    _tasks(tmp_path, rows)
    got = outcome(tmp_path)
    assert (got["n"], got["successes"]) == (4, 2)
    assert got["by_domain"] == {"bank": [1, 2], "calendar": [0, 1], "shop": [1, 1]}


def test_domain_success_reads_the_start_and_every_gate_cell(tmp_path, monkeypatch):
    from envace.stages import organism_calibration as oc

    monkeypatch.setattr(oc, "ROOT", tmp_path)
    metrics = tmp_path / oc.RUNS / "r" / oc.METRICS
    _tasks(metrics / "sft", [{"domain": "bank", "success": False}])
    _tasks(metrics / "cells" / "grpo-seed0", [{"domain": "bank", "success": True}])
    (metrics / "cells" / "grpo-seed1").mkdir(parents=True)  # a cell still training: no tasks.json yet
    row = oc.domain_success("r")
    assert row["parts"] == {"sft": {"bank": [0, 1]}, "grpo-seed0": {"bank": [1, 1]}}
    with pytest.raises(SystemExit, match="no evaluated part"):
        oc.domain_success("missing")


def test_gate_test_pairs_every_trained_seed_with_the_start_on_the_test_tasks(tmp_path, monkeypatch):
    """`test NAME`: the trained cells against their start on the test split, paired per task; evaluations
    already done are read, not re-run, and a seed without a trained policy is named."""
    from envace.stages import organism_calibration as oc

    monkeypatch.setattr(oc, "ROOT", tmp_path)
    run = tmp_path / oc.RUNS / "r"
    run.mkdir(parents=True)
    (run / "params.yaml").write_text("science:\n  dir: data/sci\n")
    with pytest.raises(SystemExit, match=r"seeds \[0, 1\] have no trained policy"):
        oc.gate_test("r", [0, 1])
    for seed in (0, 1):
        policy = run / "data/sci/cells" / f"grpo-seed{seed}" / "checkpoints/final/policy"
        policy.mkdir(parents=True)
        (policy / "config.json").write_text("{}")

    def rows(successes):
        return [
            {"task_id": f"t{i}", "domain": "todo" if i >= 8 else "shop", "success": ok, "held_out": i >= 8}
            | ({"held_out_kind": "domain"} if i >= 8 else {})
            for i, ok in enumerate(successes)
        ]

    test = run / oc.METRICS / "test"
    _tasks(test / "sft", rows([False] * 10))
    _tasks(test / "grpo-seed0", rows([True] * 6 + [False] * 4))
    _tasks(test / "grpo-seed1", rows([True] * 4 + [False] * 6))
    got = oc.gate_test("r", [0, 1])
    assert got["test_sft"]["successes"] == 0
    assert [got["test_after"][s]["successes"] for s in (0, 1)] == [6, 4]
    every = got["trained_minus_start"]
    assert every["all"]["diff"] == pytest.approx(0.5) and every["all"]["trained"] == pytest.approx(0.5)
    assert every["in_domain"]["diff"] == pytest.approx(5 / 8) and every["in_domain"]["n_tasks"] == 8
    assert every["held_out_domain"]["diff"] == 0 and every["held_out_domain"]["n_tasks"] == 2
    assert got["passed"] is True and every["all"]["ci95"][0] > 0
    (tmp_path / oc.OUT).mkdir(parents=True)
    (tmp_path / oc.ROWS).write_text(json.dumps({**got, "commit": "abc"}) + "\n")
    oc.table()
    text = (tmp_path / oc.OUT / "calibration.md").read_text()
    assert "| r | 0 1 | all | 10 | 0.000 | 0.500 | +50.0 |" in text
