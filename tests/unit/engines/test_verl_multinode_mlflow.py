"""The multi-node ``submit.sh`` marks its launch's MLflow child run FAILED when the job fails (issue 43, point 3).

``ray job submit`` exits non-zero when the job failed; a job can die before verl attaches to the run (model loading,
worker start-up), where the ``envace`` trainer's own hook never runs, so the script's exit hook marks the child run
the launcher created. A fake ``ray`` on PATH stands in for the cluster; the MLflow store is a real SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envace.config.load import compose
from envace.engines.verl.launcher import plan_launch, write_multinode_scripts

REPO = Path(__file__).resolve().parents[3]


def submit_script(tmp_path: Path, store_uri: str, experiment: str) -> tuple[Path, str]:
    """``submit.sh`` of a launch under a parent run (as ``--multinode`` writes it); returns (script, child run id)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri)
    parent = client.create_run(client.create_experiment(experiment)).info.run_id
    cfg = OmegaConf.to_container(
        compose(["profile=smoke", "model.kind=path", f"model.path={tmp_path / 'model'}"]), resolve=True
    )
    files = {split: tmp_path / "data" / f"{split}.parquet" for split in ("train", "val")}
    plan = plan_launch(cfg, output_dir=tmp_path / "run", tracking_uri=store_uri, parent_run_id=parent, files=files)
    write_multinode_scripts(plan, "10.0.0.1", 8)
    return plan.output_dir / "submit.sh", plan.env_vars["MLFLOW_RUN_ID"]


def run_submit(script: Path, tmp_path: Path, ray_exit: int) -> subprocess.CompletedProcess:
    """Run ``script`` with a fake ``ray`` exiting ``ray_exit``; ``python`` is this interpreter (this tree's envace)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "ray").write_text(f"#!/usr/bin/env bash\necho 'job failed' >&2\nexit {ray_exit}\n")
    (fake_bin / "python").write_text(f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n')
    for name in ("ray", "python"):
        (fake_bin / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("ray_exit", [1, 0])
def test_failed_submission_marks_the_child_run_failed(
    ray_exit: int, tmp_path: Path, store_uri: str, experiment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("ENVACE_PARENT_RUN_ID", raising=False)
    script, child = submit_script(tmp_path, store_uri, experiment)
    text = script.read_text()
    assert "trap envace_on_exit EXIT" in text and text.splitlines()[-1].startswith("ray job submit")
    done = run_submit(script, tmp_path, ray_exit)
    assert done.returncode == ray_exit, done.stderr  # the job's status is the script's
    run = MlflowClient(store_uri).get_run(child)
    if ray_exit:
        assert run.info.status == "FAILED" and run.data.tags["envace.returncode"] == str(ray_exit), done.stderr
    else:  # a job that succeeded: verl ended the run itself; the hook leaves it alone
        assert run.info.status == "RUNNING" and "envace.returncode" not in run.data.tags


def test_no_hook_without_a_child_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVACE_PARENT_RUN_ID", raising=False)
    cfg = OmegaConf.to_container(
        compose(["profile=smoke", "model.kind=path", f"model.path={tmp_path / 'model'}", "tracking=none"]),
        resolve=True,
    )
    files = {split: tmp_path / f"{split}.parquet" for split in ("train", "val")}
    plan = plan_launch(cfg, output_dir=tmp_path / "run", files=files)
    write_multinode_scripts(plan, "10.0.0.1", 8)
    assert "envace_on_exit" not in (plan.output_dir / "submit.sh").read_text()
