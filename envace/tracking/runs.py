"""The runs a stage logs into: one parent run per pipeline run, one nested run per stage, and the clean-up
of runs a killed process left RUNNING.

Layout in MLflow (experiment ``tracking.experiment``, default ``envace``):
- one **parent run per pipeline run**, named by profile, variant, seed and start time
  (``cpu/envace/seed0/2026-12-06T02:00``; tags: git commit, profile, overrides, Prefect flow-run id),
  holding the composed config once: the artifact ``config/params.yaml`` and the keys runs are filtered
  by as params (``envace.tracking.params``);
- one **nested run per stage** (``mlflow.parentRunId``), holding as params the keys its DVC stage
  declares under ``params:``, per-step metrics (``step=``) and the stage's artifacts. A stage that
  raises ends FAILED with the error as tags and an ``error.txt`` artifact.

How a stage finds its parent run:
1. ``ENVACE_PARENT_RUN_ID`` in the environment (set by the Prefect flow, which owns the parent), else
2. the nearest ``dvc`` ancestor process (``dvc repro`` / ``dvc exp run``) identifies the pipeline run:
   the first stage it launches creates the parent and records it in ``.envace/pipeline_run.json``
   keyed by that process; later stages of the same ``dvc`` process reuse it. One ``dvc repro`` = one
   parent run. Such an auto-created parent carries the status of the latest stage.
3. A stage started by hand (no ``dvc`` ancestor) gets a parent run of its own.

Orphaned runs: every run records the process that owns it (tags ``envace.pid``, ``envace.pid_started``,
``envace.host``: the stage process for a stage run and its cells, the ``dvc`` process for a parent it
created, the flow's process for a Prefect parent). A process killed with -9 (or by the OOM killer, or a
power cut) never ends its run, so each stage first looks for RUNNING runs of the same stage whose owner
is gone from this host and marks them KILLED, with the reason in the tag ``envace.orphaned`` and a
warning in the log (``end_orphaned_runs``); their pipeline run too, when its owner is gone. Runs owned
on another host, or by a process still alive, are left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from envace.tracking.params import CONFIG_ARTIFACT, config_yaml, pipeline_run_name, run_key_params, stage_params
from envace.tracking.store import MlflowStore
from envace.tracking.tracker import KIND_TAG, STAGE_TAG, NullTracker, Tracker, record_failure, stable_metric_key
from envace.utils.io import write_json

logger = logging.getLogger(__name__)

ENV_PARENT_RUN_ID = "ENVACE_PARENT_RUN_ID"
ENV_FLOW_RUN_ID = "ENVACE_FLOW_RUN_ID"
ENV_OVERRIDES = "ENVACE_OVERRIDES"
PIPELINE_RUN_FILE = Path(".envace") / "pipeline_run.json"
# the process that owns a run (ends it): pid, its start time (a reused pid is another process), host
OWNER_PID_TAG = "envace.pid"
OWNER_START_TAG = "envace.pid_started"
OWNER_HOST_TAG = "envace.host"
ORPHAN_TAG = "envace.orphaned"  # why a run left RUNNING by a vanished process was marked KILLED


# ---- pipeline (parent) runs ------------------------------------------------------------------------------
def git_commit(cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "none"


def pipeline_tags(profile: str, overrides: list[str] | None = None, flow_run_id: str | None = None) -> dict:
    commit = git_commit()
    tags = {
        KIND_TAG: "pipeline",
        "envace.profile": profile,
        "envace.overrides": json.dumps(overrides if overrides is not None else _env_overrides()),
        "mlflow.source.git.commit": commit,
        "git_commit": commit,
    }
    flow_run = flow_run_id or os.environ.get(ENV_FLOW_RUN_ID) or os.environ.get("PREFECT__FLOW_RUN_ID")
    if flow_run:
        tags["prefect.flow_run_id"] = flow_run
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    return tags


def _env_overrides() -> list[str]:
    raw = os.environ.get(ENV_OVERRIDES)
    return list(json.loads(raw)) if raw else []


def start_pipeline_run(
    store: MlflowStore,
    profile: str,
    overrides: list[str] | None = None,
    flow_run_id: str | None = None,
    owner: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> str:
    """Create a parent run for one pipeline run, owned by ``owner`` (``owner_tags``; default: this
    process), logging the composed flat ``config`` once (see the module docstring); returns its id."""
    config = config or {}
    tags = {**pipeline_tags(profile, overrides, flow_run_id), **(owner or owner_tags())}
    run = store.start_run(pipeline_run_name(profile, config), tags)
    if config:
        run.log_params(run_key_params(config))
        run.log_text(config_yaml(config), CONFIG_ARTIFACT)
    return run.run_id


def _dvc_ancestor_key() -> str | None:
    """Identify the ``dvc`` process (repro / exp run) that launched this stage, if any:
    ``<pid>-<start time, whole seconds>-<DVC_EXP_NAME>`` (``_key_owner`` reads the process back)."""
    proc = psutil.Process().parent()
    while proc is not None and proc.pid > 1:
        try:
            cmd = proc.cmdline()
            if any(Path(arg).name == "dvc" for arg in cmd[:2]) or cmd[1:3] == ["-m", "dvc"]:
                return f"{proc.pid}-{int(proc.create_time())}-{os.environ.get('DVC_EXP_NAME', '')}"
            proc = proc.parent()
        except psutil.Error:
            return None
    return None


def resolve_parent_run(store: MlflowStore, profile: str, config: Mapping[str, Any] | None = None) -> tuple[str, bool]:
    """(parent run id, whether this process manages its status) — see the module docstring. A parent
    created here logs ``config`` (the stage's composed config, flat)."""
    external = os.environ.get(ENV_PARENT_RUN_ID)
    if external:
        return external, False
    key = _dvc_ancestor_key()
    if key is not None and PIPELINE_RUN_FILE.exists():
        try:
            known = json.loads(PIPELINE_RUN_FILE.read_text())
        except (OSError, json.JSONDecodeError):
            known = {}
        if known.get("key") == key and known.get("tracking_uri") == store.tracking_uri:
            store.set_status(known["run_id"], "RUNNING")
            return known["run_id"], True
    run_id = start_pipeline_run(store, profile, owner=_key_owner(key), config=config)
    if key is not None:
        write_json(PIPELINE_RUN_FILE, {"key": key, "run_id": run_id, "tracking_uri": store.tracking_uri})
    return run_id, True


def _key_owner(key: str | None) -> dict[str, str]:
    """Owner tags of a parent run: the ``dvc`` process of ``key`` (``_dvc_ancestor_key``), else this one."""
    if key is None:
        return owner_tags()
    pid, started = key.split("-")[:2]
    return owner_tags(int(pid), float(started))


# ---- orphaned runs -------------------------------------------------------------------------------------
def owner_tags(pid: int | None = None, started: float | None = None) -> dict[str, str]:
    """Tags naming the process that owns a run: ``pid`` started at ``started`` (epoch seconds), on this
    host; by default the current process."""
    if pid is None:
        me = psutil.Process()
        pid, started = me.pid, me.create_time()
    tags = {OWNER_PID_TAG: str(pid), OWNER_HOST_TAG: socket.gethostname()}
    if started is not None:
        tags[OWNER_START_TAG] = f"{started:.3f}"
    return tags


def owner_alive(tags: Mapping[str, str]) -> bool | None:
    """Whether the process named by a run's owner tags still runs: None when that cannot be told here
    (no owner tags, as on runs logged before they existed, or a run owned on another host). A zombie, or
    a live process with the same pid but another start time (the pid was reused), is gone."""
    pid = tags.get(OWNER_PID_TAG)
    if pid is None or tags.get(OWNER_HOST_TAG) != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        started = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # it exists but may not be inspected: assume it is the owner
        return True
    recorded = tags.get(OWNER_START_TAG)
    return recorded is None or abs(started - float(recorded)) < 1.0  # dvc keys keep whole seconds


def end_orphaned_runs(store: MlflowStore, stage: str) -> list[str]:
    """Mark KILLED the RUNNING runs of ``stage`` in the store's experiment (stage runs and their cells)
    whose owner process is gone from this host, and the pipeline run above each when its owner is gone
    too; returns the ids marked (see the module docstring)."""
    query = f"tags.`{STAGE_TAG}` = '{stage}' and attributes.status = 'RUNNING'"
    runs = store.client.search_runs([store.experiment_id], query, max_results=1000)
    ended: list[str] = []
    for run in (r for r in runs if owner_alive(r.data.tags) is False):
        parent_id = run.data.tags.get("mlflow.parentRunId")
        parent = store.client.get_run(parent_id) if parent_id else None
        for candidate in (run, parent):
            if (
                candidate is not None
                and candidate.info.run_id not in ended
                and candidate.info.status == "RUNNING"
                and owner_alive(candidate.data.tags) is False
            ):
                ended.append(_end_orphan(store, candidate))
    return ended


def _end_orphan(store: MlflowStore, run: Any) -> str:
    tags, run_id = run.data.tags, run.info.run_id
    why = (
        f"left RUNNING by process {tags.get(OWNER_PID_TAG)} on {tags.get(OWNER_HOST_TAG)}, which is gone "
        "(killed with -9, out of memory, or the machine went down)"
    )
    store.client.set_tag(
        run_id, ORPHAN_TAG, f"{why}; marked KILLED at {time.strftime('%Y-%m-%d %H:%M:%S')} by process {os.getpid()}"
    )
    store.set_status(run_id, "KILLED")
    logger.warning(
        "MLflow: %s run %s (%s) was %s; marked KILLED", tags.get(KIND_TAG, "a"), run_id, run.info.run_name, why
    )
    return run_id


# ---- one stage = one nested run ------------------------------------------------------------------------
@contextlib.contextmanager
def stage_run(
    stage: str,
    config: Mapping[str, Any],
    *,
    profile: str,
    backend: str = "mlflow",
    experiment: str = "envace",
    tracking_uri: str | None = None,
) -> Iterator[Tracker]:
    """Open the nested MLflow run of ``stage`` (of the flat composed ``config``, the keys its DVC stage
    declares logged as params: ``envace.tracking.params.stage_params``), yield its tracker, end it
    FINISHED, or FAILED with the error as tags + ``error.txt`` when the body raises (re-raised, with a note
    naming the run). Orphaned runs of ``stage`` are marked KILLED first (``end_orphaned_runs``)."""
    if backend == "none":
        yield NullTracker()
        return
    store = MlflowStore(experiment, tracking_uri)
    try:
        end_orphaned_runs(store, stage)
    except Exception:  # housekeeping of earlier runs: never fail this stage on it
        logger.warning("MLflow: could not check for orphaned runs of stage %s", stage, exc_info=True)
    parent_id, owns_parent = resolve_parent_run(store, profile, config)
    shared = pipeline_tags(profile)
    tags = {k: v for k, v in shared.items() if k != "envace.overrides"}
    tags.update({KIND_TAG: "stage", STAGE_TAG: stage, **owner_tags()})
    run = store.start_run(stage, tags, parent_run_id=parent_id, summary_prefix=summary_prefix(stage))
    run.log_params(stage_params(stage, config))
    logger.info("MLflow: stage run %s (parent %s) in %s", run.run_id, parent_id, store.tracking_uri)
    try:
        yield run
    except BaseException as exc:
        status = record_failure(run, exc)
        store.set_status(run.run_id, status)
        if owns_parent:
            store.set_status(parent_id, status)
        exc.add_note(f"MLflow run {run.run_id} ({status}) holds the traceback in error.txt")
        raise
    store.set_status(run.run_id, "FINISHED")
    if owns_parent:
        store.set_status(parent_id, "FINISHED")


def summary_prefix(stage: str) -> str:
    """Prefix of a stage's summary metrics on the pipeline run: ``train/``, ``evaluate.toolworld/`` (a DVC
    ``foreach`` stage id ``evaluate@toolworld``)."""
    return stable_metric_key(stage.replace("@", ".")) + "/"
