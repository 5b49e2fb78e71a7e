"""The shared stage plumbing: atomic outputs, the runner (metrics file, MLflow run, failures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.config.load import compose, write_params
from envace.reporting import metrics_files
from envace.stages import runner
from envace.utils.io import atomic_dir, atomic_path, read_jsonl, write_jsonl
from envace.utils.machine import cpu_has_bf16, cpu_model


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
    assert json.loads((tmp_path / "metrics" / "demo.json").read_text()) == {"n": 3, "nested": {"rate": 0.5}}
    details = json.loads((tmp_path / "metrics" / "demo.details.json").read_text())
    record = details.pop("produced_by")  # the report's stale check and provenance table read it
    assert record.keys() == {"commit", "code_dirty", "cpu", "cpu_bf16", "precision"}
    assert record["cpu"] == cpu_model() and record["cpu_bf16"] == cpu_has_bf16()
    assert details == {"label": "x"}
    assert metrics == metrics_files.read_metrics(tmp_path / "metrics" / "demo.json")
    assert seen["tracker"] == "MlflowTracker"
    from envace.tracking.store import runs_table

    table = runs_table("runner-test", tracking_uri=uri, stage="demo")
    row = table.iloc[0]
    assert row["status"] == "FINISHED" and row["metrics.n"] == 3 and row["metrics.nested.rate"] == 0.5
    assert row["metrics.stage_seconds"] >= 0


def test_stage_main_reports_a_bad_override_without_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_params(["profile=smoke", "tracking=none"], root=tmp_path, conf_dir=Path(__file__).parents[3] / "conf")
    calls = []
    main = runner.stage_main("demo", lambda cfg, tracker: calls.append(cfg) or {})
    assert main(["train.steps=lots"]) == 2
    assert main(["profile=cpu"]) == 2
    assert calls == []
    assert main(["train.steps=3"]) == 0
    assert calls[0].train.steps == 3
    assert json.loads((tmp_path / "metrics" / "demo.json").read_text()) == {}


RETURNED = {
    "n_tasks": 8,
    "ok": True,
    "variant": "envace",
    "rate": float("nan"),
    "empty": {},
    "none": None,
    "curves": {"step": [0, 1], "reward/mean": [None, 0.5]},
    "policy": {
        "success_rate": 0.125,
        "status": "ran",
        "fidelity": {"n": 0, "field_f1": 0.0, "note": None},
        "domains": {"telecom:base": {"mode": "solo", "pass^1": 0.0}},
    },
}


def test_split_puts_numbers_in_the_metrics_half_and_everything_else_in_the_details_half():
    numbers, details = metrics_files.split_metrics(RETURNED)
    assert numbers == {
        "n_tasks": 8,
        "ok": True,
        "policy": {
            "success_rate": 0.125,
            "fidelity": {"n": 0, "field_f1": 0.0},
            "domains": {"telecom:base": {"pass^1": 0.0}},
        },
    }
    assert details["variant"] == "envace" and details["curves"] == RETURNED["curves"] and details["empty"] == {}
    assert details["none"] is None and details["policy"] == {
        "status": "ran",
        "fidelity": {"note": None},
        "domains": {"telecom:base": {"mode": "solo"}},
    }

    def leaves(tree):
        for value in tree.values():
            yield from (leaves(value) if isinstance(value, dict) and value else [value])

    assert all(isinstance(v, (int, float)) and v == v for v in leaves(numbers))  # numbers only, no NaN
    assert not any(isinstance(v, (int, float)) and not isinstance(v, bool) and v == v for v in leaves(details))


def test_merge_round_trips_the_split_and_read_metrics_merges_both_files(tmp_path):
    for headline in (None, ("n_tasks", "policy.*")):
        numbers, details = metrics_files.split_metrics(RETURNED, headline)
        merged = metrics_files.merge_metrics(numbers, details)
        assert json.dumps(merged, sort_keys=True) == json.dumps(RETURNED, sort_keys=True)  # NaN == NaN as text
    path = tmp_path / "metrics" / "demo.json"
    assert metrics_files.write_metrics(path, RETURNED) == (path, tmp_path / "metrics" / "demo.details.json")
    assert json.dumps(metrics_files.read_metrics(path), sort_keys=True) == json.dumps(RETURNED, sort_keys=True)
    (tmp_path / "old.json").write_text(json.dumps({"variant": "grpo", "n": 1}))  # written before the split
    assert metrics_files.read_metrics(tmp_path / "old.json") == {"variant": "grpo", "n": 1}
    assert metrics_files.merge_metrics({"a": {"b": 1}}, {"a": {"c": "x"}, "d": [1]}) == {
        "a": {"b": 1, "c": "x"},
        "d": [1],
    }


def test_headline_keeps_few_numbers_in_the_metrics_file_for_dvc_metrics_show():
    numbers, details = metrics_files.split_metrics(RETURNED, ("n_tasks", "policy.success_rate", "policy.*.pass^1"))
    assert numbers == {"n_tasks": 8, "policy": {"success_rate": 0.125}}  # depth must match: no domains.x
    assert details["ok"] is True and details["policy"]["fidelity"] == {"n": 0, "field_f1": 0.0, "note": None}
    assert metrics_files.headline_for("evaluate@bfcl") == metrics_files.HEADLINE["evaluate"]
    assert metrics_files.headline_for("demo") is None
    train = {"steps_done": 8, "final/reward/mean": 0.2, "final/kl": 0.0, "final/time/step": 9.0, "variant": "g"}
    numbers, _ = metrics_files.split_metrics(train, metrics_files.headline_for("train"))
    assert numbers == {"steps_done": 8, "final/reward/mean": 0.2, "final/kl": 0.0}
    assert len(metrics_files.HEADLINE["evaluate"]) <= 8 and len(metrics_files.HEADLINE["train"]) <= 8
