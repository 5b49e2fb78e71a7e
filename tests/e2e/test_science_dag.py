"""`make science` and `make science-testtime` on the smoke profile in a fresh clone: the real DVC DAG of
science/dvc.yaml (shared SFT, cells two at a time, test-time, aggregate), then a no-op re-run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_helpers import run

from envace.reporting.metrics_files import read_metrics

pytestmark = pytest.mark.e2e

VENV = str(Path(sys.executable).parent.parent)


def test_make_science_smoke_then_noop(project):
    make = ["make", f"VENV={VENV}", "PROFILE=smoke", "SCIENCE_JOBS=2"]
    run([*make, "science"], project, timeout=900)
    out = read_metrics(project / "science" / "science.json")  # the headline merged with its details
    cells = {f"{v}/seed{k}" for v in ("envace", "grpo") for k in (0, 1)}
    assert cells <= set(out) and {"aggregate", "sft_base", "untrained_base", "testtime"} <= set(out)
    n = out["sft_base"]["n"]
    assert n > 0 and all(out[c]["n"] == n and set(out[c]["tasks"]) == set(out["sft_base"]["tasks"]) for c in cells)
    assert out["testtime"] == {}  # not run yet
    for name in ("science.md", "science_main.csv", "science_differences.csv", "science_main.png"):
        assert (project / "science" / "report" / name).exists(), name
    # every cell's per-part files are plain files in the clone (cache: false outputs), with their timing
    for cell in ("envace-seed0", "grpo-seed1"):
        d = project / "science" / "metrics" / "cells" / cell
        names = {p.name for p in d.iterdir()}
        assert {"tasks.json", "train.json", "evaluate_toolworld.json", "timing_cell.json"} <= names

    run([*make, "science-testtime"], project, timeout=900)
    out = read_metrics(project / "science" / "science.json")  # the headline merged with its details
    assert "envace/seed0/sequential/n1/base" in out["testtime"]
    assert "envace/seed1/parallel/n1/trained" in out["testtime"]
    assert "envace/seed1/sequential/n1/trained" not in out["testtime"]  # other seeds: parallel, trained only
    # the first seed's base-rehearser half ran as stage testtime_base, in its own files, folded in above
    base_half = project / "science" / "metrics" / "base_rehearser" / "testtime" / "envace-seed0"
    assert {"tasks.json", "rehearsal_sweep.json", "timing_testtime_base.json"} <= {p.name for p in base_half.iterdir()}
    assert "envace/seed0/parallel/n1/base-vs-n0" in out["testtime_comparisons"]

    status = run(["dvc", "status", "science/dvc.yaml"], project, timeout=120)
    assert "up to date" in status.stdout, status.stdout
    again = run([*make, "science"], project, timeout=300)
    assert "Running stage" not in again.stdout, again.stdout[-3000:]
