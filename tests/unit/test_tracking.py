"""Tracking against a real SQLite MLflow store: nested stage runs, FAILED on error, parent-run
resolution (env var, one parent per dvc process), runs_table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace import tracking
from envace.tracking import (
    ENV_PARENT_RUN_ID,
    MlflowStore,
    NullTracker,
    numeric_items,
    runs_table,
    stage_run,
    start_pipeline_run,
)


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating it costs seconds); tests use their own experiments."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def experiment(request) -> str:
    return f"test-{request.node.name}"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_PARENT_RUN_ID, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_stage_run_nests_under_the_parent_from_the_environment(store_uri, experiment, in_tmp, monkeypatch):
    store = MlflowStore(experiment, store_uri)
    parent = start_pipeline_run(store, "smoke", ["profile=smoke"], flow_run_id="flow-123")
    monkeypatch.setenv(ENV_PARENT_RUN_ID, parent)
    (in_tmp / "stats.json").write_text('{"rows": 3}')
    with stage_run("train", {"algo.name": "envace", "rehearsal.n_attempts": [0, 2]}, profile="smoke",
                   experiment=experiment, tracking_uri=store_uri) as run:
        for step in (1, 2, 3):
            run.log_metrics({"reward/mean": step / 10, "note": "skipped"}, step=step)
        run.log_artifact(in_tmp / "stats.json", "data")
    child = client(store_uri).get_run(run.run_id)
    assert child.info.status == "FINISHED"
    assert child.data.tags["mlflow.parentRunId"] == parent
    assert child.data.tags["envace.stage"] == "train"
    assert child.data.params["algo.name"] == "envace" and json.loads(child.data.params["rehearsal.n_attempts"]) == [0, 2]
    history = client(store_uri).get_metric_history(run.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "note" not in child.data.metrics
    assert [a.path for a in client(store_uri).list_artifacts(run.run_id, "data")] == ["data/stats.json"]
    parent_run = client(store_uri).get_run(parent)
    assert parent_run.data.tags["prefect.flow_run_id"] == "flow-123"
    assert json.loads(parent_run.data.tags["envace.overrides"]) == ["profile=smoke"]
    assert parent_run.info.status == "RUNNING"  # the flow that owns it ends it, not the stage


def test_a_failing_stage_ends_failed_with_the_error_recorded(store_uri, experiment, in_tmp):
    with pytest.raises(ValueError, match="no rows"):
        with stage_run("prepare_data", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
            raise ValueError("no rows survived")
    failed = client(store_uri).get_run(run.run_id)
    assert failed.info.status == "FAILED"
    assert failed.data.tags["error"] == "ValueError: no rows survived"
    text = client(store_uri).download_artifacts(run.run_id, "error.txt", str(in_tmp))
    assert "no rows survived" in Path(text).read_text()
    parent = failed.data.tags["mlflow.parentRunId"]
    assert client(store_uri).get_run(parent).info.status == "FAILED"


def test_nested_runs_are_children_of_the_stage_run_and_record_failures(store_uri, experiment, in_tmp):
    with stage_run("rehearsal_sweep", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        with run.nested("toolworld/n1-parallel-trained", {"envace.cell": "n1-parallel-trained"}) as cell:
            cell.log_params({"n_attempts": 1, "mode": "parallel"})
            cell.log_metrics({"success_rate": 0.5, "cost/real_env_calls": 2.0})
        with pytest.raises(RuntimeError, match="boom"):
            with run.nested("toolworld/n2-parallel-trained") as broken:
                raise RuntimeError("boom")
    c = client(store_uri)
    ok, bad = c.get_run(cell.run_id), c.get_run(broken.run_id)
    assert ok.info.status == "FINISHED" and bad.info.status == "FAILED"
    assert ok.data.tags["mlflow.parentRunId"] == run.run_id == bad.data.tags["mlflow.parentRunId"]
    assert ok.data.tags["envace.kind"] == "cell" and ok.data.tags["envace.profile"] == "smoke"
    assert ok.data.params == {"n_attempts": "1", "mode": "parallel"}
    assert ok.data.metrics == {"success_rate": 0.5, "cost/real_env_calls": 2.0}
    assert bad.data.tags["error"] == "RuntimeError: boom"
    assert c.get_run(run.run_id).info.status == "FINISHED"
    with NullTracker().nested("anything") as null_child:
        assert isinstance(null_child, NullTracker)


def test_stages_of_one_dvc_process_share_one_parent(store_uri, experiment, in_tmp, monkeypatch):
    monkeypatch.setattr(tracking, "_dvc_ancestor_key", lambda: "4242-1000-")
    ids = []
    for stage in ("prepare_data", "train"):
        with stage_run(stage, {}, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
            pass
        ids.append(client(store_uri).get_run(run.run_id).data.tags["mlflow.parentRunId"])
    assert ids[0] == ids[1]
    assert json.loads((in_tmp / tracking.PIPELINE_RUN_FILE).read_text())["run_id"] == ids[0]
    assert client(store_uri).get_run(ids[0]).info.status == "FINISHED"
    monkeypatch.setattr(tracking, "_dvc_ancestor_key", lambda: "4343-1001-")  # the next `dvc repro`
    with stage_run("prepare_data", {}, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
        pass
    assert client(store_uri).get_run(run.run_id).data.tags["mlflow.parentRunId"] != ids[0]


def test_a_stage_run_by_hand_gets_its_own_parent(store_uri, experiment, in_tmp, monkeypatch):
    monkeypatch.setattr(tracking, "_dvc_ancestor_key", lambda: None)
    parents = set()
    for _ in range(2):
        with stage_run("report", {}, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
            pass
        parents.add(client(store_uri).get_run(run.run_id).data.tags["mlflow.parentRunId"])
    assert len(parents) == 2
    assert not (in_tmp / tracking.PIPELINE_RUN_FILE).exists()


def test_runs_table_compares_runs(store_uri, experiment, in_tmp, monkeypatch):
    store = MlflowStore(experiment, store_uri)
    parent = start_pipeline_run(store, "smoke")
    monkeypatch.setenv(ENV_PARENT_RUN_ID, parent)
    for stage, value in (("train", 0.25), ("report", 1.0)):
        with stage_run(stage, {"seed": 0}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
            run.log_metrics({"score": value})
    table = runs_table(experiment, tracking_uri=store_uri, parent_run_id=parent, include_params=True)
    assert sorted(table["stage"]) == ["report", "train"]
    assert set(table["parent_run_id"]) == {parent}
    assert table.set_index("stage").loc["train", "metrics.score"] == 0.25
    assert "params.seed" in table.columns
    only = runs_table(experiment, tracking_uri=store_uri, stage="report")
    assert list(only["metrics.score"]) == [1.0]
    pipelines = runs_table(experiment, tracking_uri=store_uri, kind="pipeline")
    assert list(pipelines["run_id"]) == [parent]
    assert runs_table("no-such-experiment", tracking_uri=store_uri).empty


def test_tracking_none_logs_nothing(in_tmp):
    with stage_run("train", {"a": 1}, profile="smoke", backend="none") as run:
        assert isinstance(run, NullTracker) and run.run_id is None
        run.log_metrics({"x": 1.0}, step=1)
    assert not (in_tmp / "mlflow.db").exists()


def test_default_store_is_sqlite_at_the_dvc_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking.default_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.default_tracking_uri() == "http://127.0.0.1:5000"


def test_numeric_items_keeps_finite_numbers_only():
    got = numeric_items({"a": 1, "b": 0.5, "c": True, "d": "x", "e": float("nan"), "f g(h)": 2, "l": [1]})
    assert got == {"a": 1.0, "b": 0.5, "c": 1.0, "f g_h_": 2.0}


def test_env_overrides_reach_the_parent_tags(monkeypatch):
    monkeypatch.setenv(tracking.ENV_OVERRIDES, json.dumps(["algo=grpo"]))
    monkeypatch.setenv(tracking.ENV_FLOW_RUN_ID, "abc")
    tags = tracking.pipeline_tags("cpu")
    assert json.loads(tags["envace.overrides"]) == ["algo=grpo"] and tags["prefect.flow_run_id"] == "abc"
    assert tags["envace.profile"] == "cpu" and tags["git_commit"]
