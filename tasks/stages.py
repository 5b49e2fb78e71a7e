"""One Prefect task per DVC stage. Each is a thin call of ``dvc repro <stage>``: dvc.yaml stays the
one DAG definition and DVC decides what is up to date (``cache_policy=NO_CACHE`` here).

Stages that may call network endpoints (an LLM judge or user simulator behind an OpenAI-compatible
server: ``evaluate``, ``rehearsal_sweep``) retry; the others fail fast.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from envace.config import write_params


def tool(name: str) -> str:
    """An executable of this interpreter's environment (venv/bin/<name>), else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def stage_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a stage process: this venv first on PATH (dvc.yaml says ``python``)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


def dvc_repro(stage: str, root: str, env: dict[str, str] | None = None) -> None:
    """``dvc repro <stage>`` in ``root``, its output streamed to the Prefect log; raises on failure."""
    logger = get_run_logger()
    cmd = [tool("dvc"), "repro", stage]
    logger.info("%s (in %s)", " ".join(cmd), root)
    proc = subprocess.Popen(
        cmd, cwd=root, env=stage_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        logger.info(line.rstrip())
    if proc.wait() != 0:
        raise RuntimeError(f"`dvc repro {stage}` failed with exit code {proc.returncode}; see the log above")


@task(name="compose_params", cache_policy=NO_CACHE)
def compose_params(overrides: list[str], root: str) -> str:
    """Write params.yaml from conf/ + overrides — the same composition as ``dvc exp run -S``."""
    return str(write_params(overrides, root=root))


@task(name="stage_order", cache_policy=NO_CACHE)
def stage_order(root: str) -> list[str]:
    """Stage names in dvc.yaml order (foreach stages expanded, e.g. ``evaluate@toolworld``)."""
    out = subprocess.run(
        [tool("dvc"), "stage", "list", "--name-only"], cwd=root, env=stage_env(), capture_output=True, text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"`dvc stage list` failed in {root}: {out.stderr.strip()}")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _stage_task(name: str, retries: int = 0) -> Callable[..., None]:
    @task(name=name, task_run_name="{stage}", cache_policy=NO_CACHE, retries=retries, retry_delay_seconds=30)
    def run_stage(stage: str, root: str, env: dict[str, str] | None = None) -> None:
        dvc_repro(stage, root, env)

    return run_stage


prepare_data = _stage_task("prepare_data")
template_prompts = _stage_task("template_prompts")
train = _stage_task("train")
evaluate = _stage_task("evaluate", retries=2)
rehearsal_sweep = _stage_task("rehearsal_sweep", retries=2)
report = _stage_task("report")

# dvc.yaml stage name (before any "@item") -> its task
STAGE_TASKS = {
    "prepare_data": prepare_data,
    "template_prompts": template_prompts,
    "train": train,
    "evaluate": evaluate,
    "rehearsal_sweep": rehearsal_sweep,
    "report": report,
}
