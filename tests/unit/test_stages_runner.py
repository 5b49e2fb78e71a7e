"""The shared stage plumbing: atomic outputs, the runner (metrics file, MLflow run, failures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.config import compose, write_params
from envace.stages import runner
from envace.utils.io import atomic_dir, atomic_path, read_jsonl, write_jsonl


def test_atomic_dir_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "b.txt").write_text("2")
            raise RuntimeError("crash half-way")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    with atomic_dir(target) as tmp:
        (tmp / "c.txt").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["c.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp leftovers
    assert (target.stat().st_mode & 0o777) != 0o700  # usual permissions, not mkdtemp's


def test_atomic_file_writes_and_jsonl_round_trip(tmp_path):
    path = tmp_path / "x" / "rows.jsonl"
    assert write_jsonl(path, [{"a": 1}, {"b": [2]}]) == 2
    assert read_jsonl(path) == [{"a": 1}, {"b": [2]}]
    with pytest.raises(KeyError):
        with atomic_path(path) as tmp:
            tmp.write_text("garbage")
            raise KeyError("stop")
    assert read_jsonl(path) == [{"a": 1}, {"b": [2]}]
    path.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2"):
        read_jsonl(path)


def test_execute_writes_metrics_and_logs_a_nested_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose(["profile=smoke", "tracking.experiment=runner-test"])
    seen = {}

    def run(cfg, tracker):
        tracker.log_metrics({"loss": 1.5}, step=1)
        seen["tracker"] = type(tracker).__name__
        return {"n": 3, "nested": {"rate": 0.5}, "label": "x"}

    metrics = runner.execute("demo", run, cfg, tmp_path / "metrics" / "demo.json", tracking_uri=uri)
    assert metrics == json.loads((tmp_path / "metrics" / "demo.json").read_text())
    assert seen["tracker"] == "MlflowTracker"
    from envace.tracking import runs_table

    table = runs_table("runner-test", tracking_uri=uri, stage="demo")
    row = table.iloc[0]
    assert row["status"] == "FINISHED" and row["metrics.n"] == 3 and row["metrics.nested.rate"] == 0.5
    assert row["metrics.stage_seconds"] >= 0


def test_stage_main_reports_a_bad_override_without_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_params(["profile=smoke", "tracking=none"], root=tmp_path, conf_dir=Path(__file__).parents[2] / "conf")
    calls = []
    main = runner.stage_main("demo", lambda cfg, tracker: calls.append(cfg) or {})
    assert main(["train.steps=lots"]) == 2
    assert main(["profile=cpu"]) == 2
    assert calls == []
    assert main(["train.steps=3"]) == 0
    assert calls[0].train.steps == 3
    assert json.loads((tmp_path / "metrics" / "demo.json").read_text()) == {}
