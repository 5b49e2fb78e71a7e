"""``envace.stages.suites``: the tasks a suite runs, and the error when a split has none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envace.config.load import compose, typed_config
from envace.stages.suites import VALIDATION_SETS, eval_suite, make_adapter, suite_tasks


def test_suite_tasks_follow_the_split_limit_and_data_seed() -> None:
    def picked(*overrides: str) -> list[str]:
        cfg = typed_config(compose(["data.n_test=12", *overrides]))
        suite = replace(eval_suite(cfg, "toolworld"), split="test", n_tasks=5)
        return [t.task_id for t in suite_tasks(cfg, suite, make_adapter(cfg, suite), who="t", fix="f")]

    first = picked()
    assert len(first) == 5 and picked() == first and picked("seed=7") != first
    assert picked("seed=7", "data.seed=0") == first  # the data seed, not the run seed, picks the tasks


def test_an_empty_split_names_who_asked_the_split_and_the_fix() -> None:
    cfg = typed_config(compose(["data.n_val=0", "train.val_every=5"]))
    with pytest.raises(
        ValueError,
        match=r"train.val_every=5: toolworld has no runnable tasks in split 'val'; set data.n_val > 0 \(now 0\)",
    ):
        VALIDATION_SETS["toolworld"](cfg)
