"""Fault drill: `dvc repro train` killed with -9 mid-training (smoke profile, tiny model), then `dvc repro
train` again: training resumes from its last checkpoint (not step 0), the killed stage's MLflow run is
marked KILLED, and the final weights equal those of an uninterrupted run of the same config."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e_helpers import clone_env, run
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e

STEPS = 6  # GRPO steps (smoke has 2): the kill lands after checkpoint KILL_AFTER, with steps still to run
KILL_AFTER = 2
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")


def _latest_step(project: Path) -> int:
    """The step of the newest complete GRPO checkpoint in the train stage's work directory (0: none)."""
    pointers = list((project / ".envace" / "train").glob("*/checkpoints/latest"))
    names = [p.read_text().strip() for p in pointers if p.is_file()]
    return max((int(n.removeprefix("step_")) for n in names if n.startswith("step_")), default=0)


def _repro_killed_after(project: Path, step: int, log: Path, timeout: float) -> float:
    """Start `dvc repro train` in its own process group and kill the group with -9 (dvc and the stage)
    once checkpoint ``step`` exists; returns the seconds it ran."""
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["dvc", "repro", "train"],
            cwd=project,
            env=clone_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while _latest_step(project) < step:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"dvc repro train exited {proc.returncode} before checkpoint {step}:\n{log.read_text()[-4000:]}"
                    )
                if time.monotonic() - started > timeout:
                    raise AssertionError(f"no checkpoint {step} after {timeout} s:\n{log.read_text()[-4000:]}")
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.monotonic() - started


def _train_runs(project: Path):
    from envace.tracking.store import runs_table

    return runs_table("envace", tracking_uri=f"sqlite:///{project / 'mlflow.db'}", stage="train")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "data" / "checkpoints" / "final" / "policy" / "model.safetensors"))


def test_kill_9_during_dvc_repro_train_resumes_from_the_last_checkpoint(project, tmp_path):
    run([sys.executable, "-m", "envace.config", "profile=smoke", f"train.steps={STEPS}"], project, timeout=120)
    killed_s = _repro_killed_after(project, KILL_AFTER, tmp_path / "killed.log", timeout=400)
    at_kill = _latest_step(project)
    assert KILL_AFTER <= at_kill < STEPS, f"killed after checkpoint {at_kill} of {STEPS} steps"
    assert not (project / "data" / "checkpoints" / "final").exists()
    assert list(_train_runs(project)["status"]) == ["RUNNING"]  # kill -9: nothing ended the run

    started = time.monotonic()
    resumed = run(["dvc", "repro", "train"], project, timeout=400)
    resumed_s = time.monotonic() - started
    log = resumed.stdout + resumed.stderr
    assert [int(s) for s in RESUMED.findall(log)] == [at_kill], log[-4000:]
    assert "sft[" in (tmp_path / "killed.log").read_text()
    assert "sft[" not in log  # the warm-up is not redone: its weights come with the checkpoint
    manifest = json.loads((project / "data" / "checkpoints" / "manifest.json").read_text())
    assert manifest["steps_done"] == STEPS
    steps = [float(row.split(",")[0]) for row in (project / "plots" / "train_steps.csv").read_text().splitlines()[1:]]
    assert steps == [0.0, *map(float, range(1, STEPS + 1))]  # the whole curve (0: the fidelity probe), once
    runs = _train_runs(project).sort_values("start_time")
    assert list(runs["status"]) == ["KILLED", "FINISHED"]  # the orphan of the kill, then this run
    assert "marked KILLED" in log
    resumed_weights = _weights(project)
    shutil.copytree(project / "data" / "checkpoints", tmp_path / "resumed")

    started = time.monotonic()
    fresh = run(["dvc", "repro", "-f", "-s", "train"], project, timeout=400)  # the same config, uninterrupted
    fresh_s = time.monotonic() - started
    assert not RESUMED.findall(fresh.stdout + fresh.stderr)
    uninterrupted = _weights(project)
    assert resumed_weights.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed_weights[k], uninterrupted[k]) for k in uninterrupted)
    print(
        f"\nkill-resume drill: killed after checkpoint {at_kill}/{STEPS} at {killed_s:.1f} s (incl. "
        f"prepare_data, template_prompts); resumed from step {at_kill}, resumed repro {resumed_s:.1f} s; "
        f"uninterrupted train {fresh_s:.1f} s; {len(uninterrupted)} tensors equal"
    )
