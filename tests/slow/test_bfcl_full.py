"""BFCL-v4 full offline sets (marker ``slow``): the oracle on every entry of every offline category, and
the cross-check against ``bfcl evaluate`` on a larger perturbed sample.

Known gold quirks — entries whose bundled possible answer no output can satisfy (bfcl-eval 2026.3.23):
a required parameter the gold leaves out, a parameter missing from the function doc, an empty list of
allowed values, Java collections whose gold mixes element types or holds a bare string. The oracle
fails exactly these; every multi-turn and memory entry must pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.envs.bfcl import BfclAdapter, BfclOracle, resolve_categories, run_bfcl
from envace.envs.bfcl.oracle import PerturbedOracle
from envace.envs.bfcl.results import bfcl_evaluate, write_result_files

pytestmark = pytest.mark.slow

KNOWN_GOLD_QUIRKS = {
    "simple_java_36",
    "simple_java_64",
    "simple_java_65",
    "live_simple_106-63-0",
    "live_simple_112-68-0",
    "live_multiple_507-149-4",
    "live_multiple_862-181-3",
    "live_multiple_964-207-0",
}


def test_oracle_on_every_offline_entry(tmp_path: Path) -> None:
    adapter = BfclAdapter(work_dir=tmp_path)
    tasks = adapter.tasks("offline")
    report = run_bfcl(BfclOracle(tasks), "offline", adapter=adapter, progress=False)
    failed = {r.task_id for r in report.run.records if not r.success}
    assert failed == KNOWN_GOLD_QUIRKS
    assert report.run.metrics.error_rate == 0.0
    for name in resolve_categories("multi_turn,memory_kv,memory_rec_sum"):
        assert report.categories[name]["accuracy"] == 1.0, name
    assert sum(row.get("n", 0) for row in report.categories.values()) == len(tasks) == 4751


def test_cross_check_on_a_larger_perturbed_sample(tmp_path: Path) -> None:
    adapter = BfclAdapter(work_dir=tmp_path / "work")
    tasks = adapter.tasks("offline", limit=25, seed=7)
    report = run_bfcl(PerturbedOracle(BfclOracle(tasks)), "offline", limit=25, seed=7, adapter=adapter, progress=False)
    ran = {k: v for k, v in report.categories.items() if v["status"] == "ran"}
    write_result_files(report.run.records, tmp_path / "result")
    theirs = bfcl_evaluate(tmp_path / "result", tmp_path / "score", list(ran))["categories"]
    for name, row in ran.items():
        assert (theirs[name]["correct_count"], theirs[name]["total_count"]) == (row["correct"], row["n"]), name
        assert set(theirs[name]["failed_ids"]) == {
            r.task_id for r in report.run.records if r.domain == name and not r.success
        }, name
