"""``envace.stages.suites``: the tasks a suite runs, and the error when a split has none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envace.config.load import compose, typed_config
from envace.stages.suites import VALIDATION_SETS, eval_suite, make_adapter, suite_tasks


def test_suite_tasks_follow_the_split_limit_and_data_seed() -> None:
    cfg = typed_config(compose(["data.n_test=12"]))
    suite = replace(eval_suite(cfg, "toolworld"), split="test", n_tasks=5)
    adapter = make_adapter(cfg, suite)
    first = suite_tasks(cfg, suite, adapter, who="t", fix="f")
    assert len(first) == 5 and [t.task_id for t in first] == [
        t.task_id for t in suite_tasks(cfg, suite, adapter, who="t", fix="f")
    ]


def test_an_empty_split_names_who_asked_the_split_and_the_fix() -> None:
    cfg = typed_config(compose(["data.n_val=0", "train.val_every=5"]))
    with pytest.raises(
        ValueError,
        match=r"train.val_every=5: toolworld has no runnable tasks in split 'val'; set data.n_val > 0 \(now 0\)",
    ):
        VALIDATION_SETS["toolworld"](cfg)
