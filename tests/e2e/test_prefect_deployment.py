"""A real Prefect server + the served deployment `envace/full-pipeline`, run with overrides like a
user would; the flow drives `dvc repro` per stage and owns the MLflow parent run."""

from __future__ import annotations

import json
import socket
import time

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
        out = run(
            ["prefect", "deployment", "run", "envace/full-pipeline", "-p", 'overrides=["profile=smoke"]', "--watch"],
            project,
            timeout=600,
            env=env,
        )
        assert "Completed" in out.stdout + out.stderr
        # the report and the main tables are artifacts of the run (the Prefect UI's Artifacts tab)
        listed = run(["prefect", "artifact", "ls"], project, timeout=120, env=env).stdout
        assert "envace-report" in listed and "envace-main-table" in listed
    finally:
        stop(project)
    assert read_pid(project, "server") is None and read_pid(project, "serve") is None
    parent, stages = assert_pipeline_in_mlflow(project, STAGES)
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}").get_run(parent["run_id"]).data.tags
    assert tags.get("prefect.flow_run_id")
    assert json.loads(tags["envace.overrides"]) == ["profile=smoke"]
    assert (project / "reports" / "report.md").exists()


def test_a_second_run_of_the_deployment_waits_until_the_first_ends(project):
    """Two runs at once would both rewrite params.yaml: the deployment's concurrency limit (1, ENQUEUE)
    holds the second in AwaitingConcurrencySlot while the first runs; then it runs too."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.server import start, stop

    port = free_port()
    params = {"overrides": ["profile=smoke"], "stages": ["prepare_data"]}
    history: dict[str, list[str]] = {}
    try:
        start(project, port, timeout=240)
        with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            runs = [run_deployment("envace/full-pipeline", parameters=params, timeout=0) for _ in range(2)]
            ids = [r.id for r in runs]
            deadline = time.monotonic() + 600
            with get_client(sync_client=True) as client:
                while time.monotonic() < deadline:
                    now = [client.read_flow_run(i) for i in ids]
                    running = [r for r in now if r.state and r.state.is_running()]
                    assert len(running) <= 1, "two runs of the deployment ran at once"
                    if all(r.state and r.state.is_final() for r in now):
                        break
                    time.sleep(0.5)
                final = [client.read_flow_run(i) for i in ids]
                for i in ids:
                    history[str(i)] = [s.name for s in client.read_flow_run_states(i)]
    finally:
        stop(project)
    assert all(r.state.is_completed() for r in final), history
    first, second = sorted(final, key=lambda r: r.start_time)
    assert second.start_time >= first.end_time, (first.start_time, first.end_time, second.start_time)
    assert "AwaitingConcurrencySlot" in history[str(second.id)], history
