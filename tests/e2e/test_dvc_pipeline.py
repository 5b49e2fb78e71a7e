"""`dvc exp run -S profile=smoke` on a fresh clone: the whole DAG, one MLflow parent run with a nested
run per stage; then `dvc repro` is a fast no-op."""

from __future__ import annotations

import time

import pytest
from e2e_helpers import assert_pipeline_in_mlflow, run

pytestmark = pytest.mark.e2e

STAGES = ["prepare_data", "template_prompts", "train", "evaluate@toolworld", "rehearsal_sweep", "report"]


def test_dvc_exp_run_smoke_then_noop_repro(project):
    started = time.monotonic()
    out = run(["dvc", "exp", "run", "-S", "profile=smoke"], project, timeout=600)
    assert "Ran experiment" in out.stdout + out.stderr
    assert time.monotonic() - started < 420
    for path in (
        "reports/report.md",
        "reports/main.csv",
        "reports/testtime.png",
        "metrics/train.json",
        "plots/train_steps.csv",
        "data/checkpoints/manifest.json",
    ):
        assert (project / path).exists(), path
    parent, _ = assert_pipeline_in_mlflow(project, STAGES)
    assert parent["profile"] == "smoke"

    started = time.monotonic()
    again = run(["dvc", "repro"], project, timeout=120)
    assert "Data and pipelines are up to date." in again.stdout
    assert time.monotonic() - started < 30
    assert "Running stage" not in again.stdout
