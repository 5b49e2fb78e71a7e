"""The evaluation's baseline (eval.baseline) and its paired gain: which model is compared, and how."""

from __future__ import annotations

import pytest

from envace.config.load import compose, typed_config
from envace.reporting.science_stats import gain_vs_base, trial_keyed
from envace.stages.common import MANIFEST, baseline_kind
from envace.utils.io import write_json


def _cfg(tmp_path, baseline: str, manifest: dict | None):
    if manifest is not None:
        write_json(tmp_path / MANIFEST, manifest)
    return typed_config(compose(["profile=smoke", f"paths.checkpoints={tmp_path}", f"eval.baseline={baseline}"]))


def test_auto_picks_the_sft_weights_only_when_the_run_had_a_warm_up(tmp_path):
    with_sft = {"roles": {}, "baseline": {"act": "sft/policy", "rehearse": "sft/policy"}}
    assert baseline_kind(_cfg(tmp_path, "auto", with_sft)) == "sft"
    assert baseline_kind(_cfg(tmp_path, "base", with_sft)) == "base"
    assert baseline_kind(_cfg(tmp_path, "auto", {"roles": {}})) == "base"


def test_asking_for_sft_without_a_warm_up_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"eval.baseline=sft .*train.sft_epochs > 0"):
        baseline_kind(_cfg(tmp_path, "sft", {"roles": {}}))


def test_a_bad_baseline_value_is_refused_by_the_schema(tmp_path):
    with pytest.raises(Exception, match="baseline"):
        compose(["profile=smoke", "eval.baseline=untrained"])


def _rows(outcomes: list[tuple[str, bool, str | None]]) -> list[dict]:
    return [
        {"task_id": t, "success": ok, "held_out": kind is not None, "held_out_kind": kind} for t, ok, kind in outcomes
    ]


def test_repeated_trials_stay_separate_outcomes():
    keyed = trial_keyed(_rows([("a", True, None), ("b", False, None), ("a", False, None)]))
    assert [r["task_id"] for r in keyed] == ["a#0", "b#0", "a#1"]


def test_gain_is_paired_on_tasks_and_split_by_held_out_domain():
    tasks = [(f"t{i}", None) for i in range(8)] + [(f"h{i}", "domain") for i in range(4)]
    policy = _rows([(t, i < 6, k) for i, (t, k) in enumerate(tasks)])
    base = _rows([(t, i < 2, k) for i, (t, k) in enumerate(tasks)])
    gain = gain_vs_base(policy, list(reversed(base)))  # order does not matter: rows pair by task
    assert set(gain) == {"all", "in_domain", "held_out_domain"}
    assert gain["all"]["diff"] == pytest.approx(4 / 12) and gain["all"]["n_tasks"] == 12
    assert gain["in_domain"]["diff"] == pytest.approx(4 / 8) and gain["held_out_domain"]["diff"] == 0.0
    assert gain["all"]["ci95"][0] > 0 and gain["all"]["verdict"] == "A > B"  # every pair is a win or a tie
    same = gain_vs_base(policy, policy)
    assert same["all"]["diff"] == 0.0 and same["all"]["ci95"] == [0.0, 0.0]
