"""A real Prefect server + the served deployment `envace/full-pipeline`, run with overrides like a
user would; the flow drives `dvc repro` per stage and owns the MLflow parent run."""

from __future__ import annotations

import json
import socket

import pytest
from e2e_helpers import assert_pipeline_in_mlflow, clone_env, run

pytestmark = pytest.mark.e2e

STAGES = ["prepare_data", "template_prompts", "train", "evaluate@toolworld", "rehearsal_sweep", "report"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_served_deployment_runs_the_pipeline(project):
    from flows.server import read_pid, start, stop

    port = free_port()
    env = {**clone_env(), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_HOME": str(project / ".prefect")}
    try:
        pids = start(project, port, timeout=240)
        assert read_pid(project, "server") == pids["server"] and read_pid(project, "serve") == pids["serve"]
        out = run(["prefect", "deployment", "run", "envace/full-pipeline", "-p", 'overrides=["profile=smoke"]',
                   "--watch"], project, timeout=600, env=env)
        assert "Completed" in out.stdout + out.stderr
    finally:
        stop(project)
    assert read_pid(project, "server") is None and read_pid(project, "serve") is None
    parent, stages = assert_pipeline_in_mlflow(project, STAGES)
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}").get_run(parent["run_id"]).data.tags
    assert tags.get("prefect.flow_run_id")
    assert json.loads(tags["envace.overrides"]) == ["profile=smoke"]
    assert (project / "reports" / "report.md").exists()
