"""End-to-end helpers: copy this project into a fresh git repo (what a user clones), run commands in
it, check what MLflow recorded."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from envace.utils.telemetry import TELEMETRY_OFF

ROOT = Path(__file__).resolve().parents[2]
# local state a clone would not have
_SKIP = (
    "mlflow.db",
    ".prefect/",
    ".envace/",
    "mlartifacts/",
    "dvc.lock",
    "metrics/",
    "plots/",
    "reports/",
    "science/dvc.lock",
    "science/metrics/",
    "science/report/",
    "science/science.json",
    "science/science.details.json",
)


def project_files() -> list[str]:
    """Files git would commit: tracked plus untracked-but-not-ignored."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    files = [f for f in out.stdout.decode().split("\0") if f]
    return [f for f in files if not f.startswith(_SKIP) and (ROOT / f).is_file()]


def clone_env() -> dict[str, str]:
    """Environment for commands in the copy: this venv first on PATH, no inherited pipeline state."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ENVACE_", "MLFLOW_TRACKING_URI", "DVC_", "PREFECT_API_URL", "PREFECT_HOME"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        TELEMETRY_OFF,
        GIT_AUTHOR_NAME="e2e",
        GIT_AUTHOR_EMAIL="e2e@example.com",
        GIT_COMMITTER_NAME="e2e",
        GIT_COMMITTER_EMAIL="e2e@example.com",
    )
    return env


def make_project(tmp_path: Path) -> Path:
    """This project copied into a new git repo with one commit."""
    dest = tmp_path / "envace"
    for rel in project_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    env = clone_env()
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "e2e clone"]):
        subprocess.run(cmd, cwd=dest, env=env, check=True)
    return dest


def run(cmd: list[str], cwd: Path, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, cwd=cwd, env=kwargs.pop("env", clone_env()), capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def assert_pipeline_in_mlflow(root: Path, expected_stages: list[str]):
    """One parent run, named by profile and variant, holding the composed config and one FINISHED nested
    run per stage, with metrics and artifacts and only the params its DVC stage declares."""
    from mlflow.tracking import MlflowClient

    from envace.tracking.params import declared_params
    from envace.tracking.store import runs_table

    uri = f"sqlite:///{root / 'mlflow.db'}"
    parents = runs_table("envace", tracking_uri=uri, kind="pipeline", include_params=True)
    assert len(parents) == 1, parents
    parent = parents.iloc[0]
    assert parent["status"] == "FINISHED"
    assert parent["run_name"].startswith("smoke/envace/seed0/") and parent["params.profile"] == "smoke"
    stages = runs_table("envace", tracking_uri=uri, parent_run_id=parent["run_id"], include_params=True)
    assert sorted(stages["stage"]) == sorted(expected_stages)
    assert set(stages["status"]) == {"FINISHED"}
    assert (stages["metrics.stage_seconds"] > 0).all()
    client = MlflowClient(tracking_uri=uri)
    assert [a.path for a in client.list_artifacts(parent["run_id"], "config")] == ["config/params.yaml"]
    with contextlib.chdir(root):  # the project's dvc.yaml
        declared = {s: set(declared_params(s)) for s in stages["stage"]}
    for _, row in stages.iterrows():
        logged = set(client.get_run(row["run_id"]).data.params)
        assert all(any(k == d or k.startswith(f"{d}.") for d in declared[row["stage"]]) for k in logged), row["stage"]
    for _, row in stages.iterrows():
        assert [a.path for a in client.list_artifacts(row["run_id"])], f"{row['stage']} logged no artifact"
    train = stages.set_index("stage").loc["train"]
    history = client.get_metric_history(train["run_id"], "reward/mean")
    assert [m.step for m in history] == [1, 2]
    return parent, stages
