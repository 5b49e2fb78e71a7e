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
