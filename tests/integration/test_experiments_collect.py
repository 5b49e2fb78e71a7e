"""`python -m envace.reporting.experiments collect` on real `dvc exp show --json` output: a scratch git+DVC repo
with one stage that writes this project's metrics files, two experiments run with `dvc exp run -S`
(real DVC: ~10 s on 2 cores, hence integration, still in the default run), then the collected
entries, byte-stable output and the error cases."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envace.reporting import experiments
from envace.reporting.experiments import CollectError, collect, curves_from_steps_csv, iter_rows, parse_row

STAGE = """
import csv, json, os, yaml
p = yaml.safe_load(open("params.yaml"))
algo = p["algo"]["name"]
rate = {"envace": 0.5, "grpo": 0.25, "per_role": 0.375}[algo]
os.makedirs("metrics", exist_ok=True)
os.makedirs("plots", exist_ok=True)
train = {"final/reward/mean": rate, "steps_done": 2, "variant": algo}
if algo != "per_role":  # per_role plays an older run: no `curves`, only train_steps.csv
    train["curves"] = {"step": [0, 1, 2], "reward/mean": [None, rate / 2, rate],
                       "fidelity/exact_match": [0.1, None, 0.3]}
json.dump(train, open("metrics/train.json", "w"))
json.dump({"benchmark": "toolworld", "policy": {"success_rate": rate, "n_tasks": 4},
           "base": {"success_rate": 0.125, "n_tasks": 4}}, open("metrics/evaluate_toolworld.json", "w"))
with open("plots/train_steps.csv", "w") as fh:
    fh.write("step,reward/mean,adv/act/mean,adv/act/std,loss\\n1.0,0.5,0.0,0.25,1.0\\n2.0,,0.1,0.5,0.5\\n")
"""

DVC_YAML = f"""
stages:
  train:
    cmd: {sys.executable} stage.py
    deps: [stage.py]
    params: [profile, algo, model, engine, seed]
    metrics:
      - metrics/train.json:
          cache: false
      - metrics/evaluate_toolworld.json:
          cache: false
    plots:
      - plots/train_steps.csv:
          cache: false
"""

PARAMS = """
profile: smoke
experiment_name: default
seed: 0
paths: {metrics: metrics, plots: plots}
model: {name: tiny}
algo: {name: envace}
engine: {name: local}
"""


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _dvc(root: Path, *args: str) -> str:
    proc = subprocess.run([experiments.find_dvc(), *args], cwd=root, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """Baseline commit without metrics; experiments smoke-grpo, smoke-per_role (workspace = the last)."""
    root = tmp_path_factory.mktemp("dvcrepo")
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "test@example.com")
    _git(root, "config", "user.name", "test")
    _dvc(root, "init", "-q")
    (root / "stage.py").write_text(textwrap.dedent(STAGE))
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "params.yaml").write_text(PARAMS)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "baseline")
    for algo in ("grpo", "per_role"):
        _dvc(root, "exp", "run", "-q", "-S", f"algo.name={algo}", "-n", f"smoke-{algo}")
    return root


@pytest.fixture(scope="module")
def collected(scratch) -> dict:
    return collect(scratch)


def test_one_entry_per_row_with_metrics_workspace_first_baseline_without_metrics_skipped(collected):
    entries = collected["experiments"]
    assert collected["schema_version"] == experiments.SCHEMA_VERSION
    assert [(e["kind"], e["name"]) for e in entries] == [
        ("workspace", "workspace"),
        ("experiment", "smoke-grpo"),
        ("experiment", "smoke-per_role"),
    ]
    grpo = entries[1]
    assert len(grpo["rev"]) == 40 and grpo["baseline"] and grpo["timestamp"]
    assert grpo["params"] == {
        "profile": "smoke",
        "experiment_name": "default",
        "algo.name": "grpo",
        "model.name": "tiny",
        "engine.name": "local",
        "seed": 0,
    }
    assert grpo["success_rate"] == {"toolworld": {"policy": 0.25, "base": 0.125}}
    assert grpo["train"] == {"final_reward": 0.25, "steps_done": 2, "variant": "grpo", "real_env_calls": None}
    assert entries[0]["params"]["algo.name"] == "per_role"  # a sequential exp run leaves the workspace at the last


def test_curves_come_from_train_json_else_from_that_revisions_train_steps_csv(collected):
    grpo, per_role = collected["experiments"][1:]
    assert grpo["curves_source"] == "train.json"
    assert grpo["curves"] == {
        "step": [0, 1, 2],
        "reward/mean": [None, 0.125, 0.25],
        "fidelity/exact_match": [0.1, None, 0.3],
    }
    assert per_role["curves_source"] == "train_steps.csv"
    assert per_role["curves"] == {
        "step": [1, 2],
        "reward/mean": [0.5, None],
        "adv/act/mean": [0, 0.1],
        "adv/act/std": [0.25, 0.5],
    }


def test_cli_output_is_sorted_atomic_and_byte_stable(scratch):
    out = scratch / "metrics" / "experiments.json"
    assert experiments.main(["collect", "--root", str(scratch)]) == 0
    first = out.read_bytes()
    assert experiments.main(["collect", "--root", str(scratch), "--out", str(out)]) == 0
    assert out.read_bytes() == first and first.endswith(b"\n")
    assert json.loads(first)["experiments"][1]["name"] == "smoke-grpo"
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    out.unlink()


def test_iter_rows_walks_the_dvc3_shape_and_failed_or_queued_rows_are_skipped(scratch):
    rows = experiments.dvc_exp_show(scratch)
    assert [kind for _, kind, _ in iter_rows(rows)] == ["workspace", "baseline", "experiment", "experiment"]
    failed = {"rev": "f" * 40, "name": "broken", "error": {"type": "Exception", "msg": "boom"}, "data": {}}
    queued = {"rev": "a" * 40, "name": "waiting", "error": None, "data": {"metrics": {}, "params": {}}}
    assert parse_row(scratch, failed, "experiment", "b" * 40) is None
    assert parse_row(scratch, queued, "experiment", "b" * 40) is None


def test_curves_from_steps_csv_keeps_known_columns_and_blanks_as_null():
    text = "step,reward/mean,other\n0,nan,1\n1.0,0.5,2\n"
    assert curves_from_steps_csv(text) == {"step": [0, 1], "reward/mean": [None, 0.5]}
    assert curves_from_steps_csv("reward/mean\n0.5\n") is None


def test_not_a_dvc_repo_and_missing_dvc_fail_with_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(CollectError, match="not a DVC repository"):
        collect(tmp_path)
    assert experiments.main(["collect", "--root", str(tmp_path)]) == 2
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CollectError, match="dvc not found"):
        experiments.find_dvc()
