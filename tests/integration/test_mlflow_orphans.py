"""Orphaned MLflow runs, against the real SQLite store: a stage process killed with -9 leaves its run
RUNNING; the next start of that stage marks it (and its pipeline run) KILLED, and leaves alone the runs
of a process that is still alive, of another host, or from before runs recorded their owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envace.config.load import write_params
from envace.tracking import runs as tracking_runs
from envace.tracking import tracker as tracking
from envace.tracking.runs import ORPHAN_TAG, OWNER_HOST_TAG, OWNER_PID_TAG, OWNER_START_TAG, owner_alive, owner_tags
from envace.tracking.store import MlflowStore, runs_table

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "orphans"

# a stage as the stage modules build theirs (runner.stage_main): it records its run id, then sleeps
STAGE_SCRIPT = textwrap.dedent('''
    """Stage ``demo``: sleeps (a stand-in for a long stage)."""
    import sys
    import time
    from pathlib import Path

    from envace.stages.runner import stage_main

    def run(cfg, tracker):
        Path(sys.argv[1]).write_text(tracker.run_id)
        time.sleep(float(sys.argv[2]))
        return {"slept": float(sys.argv[2])}

    raise SystemExit(stage_main("demo", run)(sys.argv[3:]))
''')


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_params(["profile=smoke", f"tracking.experiment={EXPERIMENT}"], root=tmp_path, conf_dir=ROOT / "conf")
    (tmp_path / "demo_stage.py").write_text(STAGE_SCRIPT)
    MlflowStore(EXPERIMENT, f"sqlite:///{tmp_path / 'mlflow.db'}")  # create the store once, before any stage
    return tmp_path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENVACE_", "MLFLOW_TRACKING_URI", "DVC_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _start(project: Path, name: str, seconds: float) -> tuple[subprocess.Popen, Path]:
    marker = project / f"{name}.run_id"
    proc = subprocess.Popen(
        [sys.executable, "demo_stage.py", str(marker), str(seconds)],
        cwd=project,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, marker


def _run_id_of(proc: subprocess.Popen, marker: Path, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while not marker.exists() or not marker.read_text():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stage never opened its MLflow run"
        time.sleep(0.1)
    return marker.read_text()


def _status(project: Path) -> dict[str, str]:
    uri = f"sqlite:///{project / 'mlflow.db'}"
    table = runs_table(EXPERIMENT, tracking_uri=uri)
    return dict(zip(table["run_id"], table["status"]))


def test_a_stage_killed_with_9_is_marked_killed_by_the_next_start(project):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    (killed_proc, killed_marker), (alive_proc, alive_marker) = (
        _start(project, name, 300) for name in ("killed", "alive")
    )
    try:
        killed, alive = _run_id_of(killed_proc, killed_marker), _run_id_of(alive_proc, alive_marker)
        assert _status(project)[killed] == "RUNNING"
        tags = client.get_run(killed).data.tags
        assert tags[OWNER_PID_TAG] == str(killed_proc.pid) and owner_alive(tags) is True
        parent = tags["mlflow.parentRunId"]  # started by hand: a pipeline run of its own, owned by the stage
        assert client.get_run(parent).data.tags[OWNER_PID_TAG] == str(killed_proc.pid)

        os.kill(killed_proc.pid, signal.SIGKILL)
        killed_proc.communicate()
        assert _status(project)[killed] == "RUNNING" and owner_alive(tags) is False  # nothing ended it
        again = subprocess.run(
            [sys.executable, "demo_stage.py", str(project / "again.run_id"), "0"],
            cwd=project,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert again.returncode == 0, again.stderr
        status = _status(project)
        assert status[killed] == "KILLED" and status[parent] == "KILLED"
        assert status[alive] == "RUNNING"  # its owner still runs: left alone
        assert status[(project / "again.run_id").read_text()] == "FINISHED"
        reason = client.get_run(killed).data.tags[ORPHAN_TAG]
        assert f"process {killed_proc.pid}" in reason and "marked KILLED" in reason
        assert f"run {killed} (demo) was left RUNNING by process {killed_proc.pid}" in again.stderr
    finally:  # by pid, the two stage processes this test started
        for proc in (killed_proc, alive_proc):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _exited_pid() -> int:
    """The pid of a process that has come and gone."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_only_gone_owners_on_this_host_count_as_orphans():
    me = owner_tags()
    assert owner_alive(me) is True and me[OWNER_PID_TAG] == str(os.getpid())
    assert owner_alive({**me, OWNER_START_TAG: str(float(me[OWNER_START_TAG]) - 50)}) is False  # reused pid
    assert owner_alive({**me, OWNER_HOST_TAG: "another-host"}) is None  # cannot tell from here
    assert owner_alive({}) is None  # a run logged before owners were recorded
    assert owner_alive(owner_tags(_exited_pid())) is False


def test_the_sweep_leaves_runs_it_cannot_judge(tmp_path):
    store = MlflowStore(EXPERIMENT, f"sqlite:///{tmp_path / 'mlflow.db'}")
    gone = _exited_pid()
    stage = {tracking.KIND_TAG: "stage", tracking.STAGE_TAG: "train"}
    elsewhere = store.start_run("train", {**stage, **owner_tags(gone), OWNER_HOST_TAG: "another-host"})
    legacy = store.start_run("train", stage)
    other_stage = store.start_run("report", {**stage, tracking.STAGE_TAG: "report", **owner_tags(gone)})
    orphan = store.start_run("train", {**stage, **owner_tags(gone)})
    assert tracking_runs.end_orphaned_runs(store, "train") == [orphan.run_id]
    status = {r: store.client.get_run(r).info.status for r in (elsewhere.run_id, legacy.run_id, other_stage.run_id)}
    assert set(status.values()) == {"RUNNING"}
    assert store.client.get_run(orphan.run_id).info.status == "KILLED"
