"""What runs log as params, against a real SQLite MLflow store: a pipeline run is named by profile, variant,
seed and time and logs the composed config once (the artifact config/params.yaml plus the keys runs are
filtered by); a stage run logs the keys its DVC stage declares under ``params:`` (envace.tracking.params)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from envace.config.load import flatten
from envace.tracking import runs as tracking_runs
from envace.tracking.params import CONFIG_ARTIFACT, RUN_KEYS, declared_params, stage_params
from envace.tracking.runs import ENV_PARENT_RUN_ID, stage_run

ROOT = Path(__file__).resolve().parents[3]

CONFIG = {
    "profile": "cpu",
    "experiment_name": "default",
    "seed": 0,
    "model.name": "smollm2-135m",
    "model.dtype": "bf16",
    "data.source": "toolworld",
    "data.n_train": 16,
    "algo.name": "envace",
    "algo.lr": 1e-5,
    "engine.name": "local",
    "eval.n_tasks": 4,
    "eval.benchmarks": ["toolworld"],
    "rehearsal.n_attempts_grid": [0, 2],
}

DVC_YAML = """
stages:
  train:
    cmd: python -m envace.stages.train
    params: [seed, algo]
  evaluate:
    foreach: [toolworld, bfcl]
    do:
      cmd: python -m envace.stages.evaluate eval.benchmark=${item}
      params: [model, eval.n_tasks, "other.yaml:rehearsal"]
  report:
    cmd: python -m envace.stages.report
    params:
      - params.yaml: [profile, eval.benchmarks]
"""

SCIENCE_YAML = """
stages:
  cell:
    matrix: {variant: [grpo, envace], seed: [0, 1]}
    wdir: ..
    cmd: python -m envace.stages.science cell
    params: [data.n_train, rehearsal]
"""


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A working directory with a dvc.yaml (and science/dvc.yaml), outside any DVC or Prefect run."""
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "science").mkdir()
    (tmp_path / "science" / "dvc.yaml").write_text(SCIENCE_YAML)
    monkeypatch.chdir(tmp_path)
    for name in (ENV_PARENT_RUN_ID, "MLFLOW_TRACKING_URI", "DVC_STAGE", "DVC_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_the_pipeline_run_is_named_by_variant_and_logs_the_config_once(store_uri, experiment, project, monkeypatch):
    monkeypatch.setattr(tracking_runs, "_dvc_ancestor_key", lambda: "4242-1000-")  # one `dvc repro`
    stage_ids = []
    for stage in ("train", "evaluate@toolworld"):
        with stage_run(stage, CONFIG, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
            stage_ids.append(run.run_id)
    c = client(store_uri)
    parent_id = c.get_run(stage_ids[0]).data.tags["mlflow.parentRunId"]
    parent = c.get_run(parent_id)
    assert re.fullmatch(r"cpu/envace/seed0/\d{4}-\d\d-\d\dT\d\d:\d\d", parent.info.run_name), parent.info.run_name
    assert parent.data.params == {k: str(CONFIG[k]) for k in RUN_KEYS}
    config_file = c.download_artifacts(parent_id, CONFIG_ARTIFACT, str(project))
    composed = yaml.safe_load(Path(config_file).read_text())
    assert composed["algo"] == {"name": "envace", "lr": 1e-5} and composed["rehearsal"] == {"n_attempts_grid": [0, 2]}
    assert flatten(composed) == CONFIG
    for run_id in stage_ids:  # the config is logged once: on the pipeline run, not again on each stage
        assert not c.list_artifacts(run_id, "config")


def test_stage_runs_log_the_params_their_dvc_stage_declares(store_uri, experiment, project, monkeypatch):
    logged = {}
    for stage in ("train", "evaluate@bfcl", "report"):
        with stage_run(stage, CONFIG, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
            pass
        logged[stage] = client(store_uri).get_run(run.run_id).data.params
    assert sorted(logged["train"]) == ["algo.lr", "algo.name", "seed"]
    # a foreach stage declares once for every item; keys of another params file are not this config's
    assert sorted(logged["evaluate@bfcl"]) == ["eval.n_tasks", "model.dtype", "model.name"]
    assert sorted(logged["report"]) == ["eval.benchmarks", "profile"]
    # DVC names the stage it runs (DVC_STAGE, relative to DVC_ROOT): here a matrix stage of another dvc.yaml
    monkeypatch.setenv("DVC_ROOT", str(project))
    monkeypatch.setenv("DVC_STAGE", "science/dvc.yaml:cell@grpo-1")
    with stage_run("science_cell/grpo-1", CONFIG, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
        pass
    assert sorted(client(store_uri).get_run(run.run_id).data.params) == ["data.n_train", "rehearsal.n_attempts_grid"]


def test_a_stage_no_dvc_yaml_declares_logs_the_whole_config(project, caplog):
    (project / "dvc.yaml").unlink()
    with caplog.at_level("INFO", logger="envace.tracking.params"):
        assert declared_params("train") is None
        assert stage_params("train", CONFIG) == CONFIG
    assert "dvc.yaml" in caplog.text


def test_every_stage_of_the_real_dvc_yaml_declares_keys_of_the_composed_config(monkeypatch):
    """The repository's own dvc.yaml: each stage (foreach items included) logs a few of params.yaml's
    keys, and every key it declares names something in the config."""
    monkeypatch.chdir(ROOT)
    for name in ("DVC_STAGE", "DVC_ROOT"):
        monkeypatch.delenv(name, raising=False)
    config = flatten(yaml.safe_load((ROOT / "params.yaml").read_text()))
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in [*stages, "evaluate@toolworld"]:
        declared = declared_params(stage)
        assert declared, f"dvc.yaml stage {stage} declares no params"
        for key in declared:
            assert any(k == key or k.startswith(f"{key}.") for k in config), f"{stage}: {key} is not in params.yaml"
        assert 0 < len(stage_params(stage, config)) < len(config) / 2, stage
