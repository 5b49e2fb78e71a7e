"""Experiment tracking behind one small interface: ``Tracker`` (MLflow or null).

Layout in MLflow (experiment ``tracking.experiment``, default ``envace``):
- one **parent run per pipeline run** (tags: git commit, profile, overrides, Prefect flow-run id);
- one **nested run per stage** (``mlflow.parentRunId``), holding the resolved config as flat params,
  per-step metrics (``step=``) and the stage's artifacts. A stage that raises ends FAILED with the
  error as tags and an ``error.txt`` artifact.

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

Metric names are stable: ``stable_metric_key`` renames keys with spaces, parentheses or other display
characters (with a warning); labels and model names belong in params/tags. A stage's summary (what it
logs without a step: the runner's flattened metrics) is mirrored on the pipeline run as ``<stage>/<key>``
(``evaluate@toolworld`` -> ``evaluate.toolworld/…``). The experiment is tagged
``mlflow.experimentKind=custom_model_development`` so the UI opens on its runs, not the GenAI overview.
``runs_table(group_by=…)`` / ``compare_runs`` put variants or seeds side by side on the same metric names.
Rollout tables, data-set inputs, the model, system metrics and episode traces: ``envace.mlflow_logging``.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<root>/mlflow.db`` with artifacts under
``<root>/mlartifacts``, where root is ``DVC_ROOT`` (queued DVC experiments run in a temp copy but log
to the main repo) or the working directory.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import math
import os
import re
import socket
import subprocess
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

logger = logging.getLogger(__name__)

ENV_PARENT_RUN_ID = "ENVACE_PARENT_RUN_ID"
ENV_FLOW_RUN_ID = "ENVACE_FLOW_RUN_ID"
ENV_OVERRIDES = "ENVACE_OVERRIDES"
PIPELINE_RUN_FILE = Path(".envace") / "pipeline_run.json"
STAGE_TAG = "envace.stage"
KIND_TAG = "envace.kind"  # "pipeline" | "stage" | "cell" (a sweep cell under a stage)
# the process that owns a run (ends it): pid, its start time (a reused pid is another process), host
OWNER_PID_TAG = "envace.pid"
OWNER_START_TAG = "envace.pid_started"
OWNER_HOST_TAG = "envace.host"
ORPHAN_TAG = "envace.orphaned"  # why a run left RUNNING by a vanished process was marked KILLED
_MAX_PARAM_CHARS = 6000
_BATCH = 100
_MAX_SUMMARY = 1000  # metrics one stage mirrors on the pipeline run
# the MLflow UI opens an experiment on its runs (not the GenAI overview) for this kind
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


# ---- the interface -----------------------------------------------------------------------------------
class Tracker(abc.ABC):
    """What a stage may log. ``run_id`` is None for the null tracker."""

    run_id: str | None = None

    @abc.abstractmethod
    def log_params(self, params: Mapping[str, Any]) -> None: ...

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log the numeric entries of ``metrics`` (others are skipped) at ``step``."""

    @abc.abstractmethod
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a file or a whole directory."""

    @abc.abstractmethod
    def log_text(self, text: str, artifact_file: str) -> None: ...

    @abc.abstractmethod
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...

    @contextlib.contextmanager
    def nested(self, name: str, tags: Mapping[str, Any] | None = None) -> Iterator[Tracker]:
        """A child run of this one (e.g. one cell of a sweep), ended FINISHED, or FAILED when the body
        raises. The null tracker's child is itself."""
        yield self


class NullTracker(Tracker):
    """Logs nothing (tests, ``tracking=none``)."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass


NULL_TRACKER = NullTracker()


_UNSTABLE_KEY = re.compile(r"[^A-Za-z0-9_\-./]+")
_warned_keys: set[str] = set()


def _metric_key(key: str) -> str:
    """An MLflow-safe key: characters MLflow refuses become ``_``."""
    return re.sub(r"[^\w\-. /]", "_", str(key))


def stable_metric_key(key: str) -> str:
    """A stable metric name: ``[A-Za-z0-9_-./]`` only. A key with spaces, parentheses or other display
    characters (e.g. a table label such as ``overall.envace (smollm2-135m)``) is renamed with a warning:
    labels and model names belong in params/tags, metric names must not change with them."""
    key = str(key)
    fixed = _UNSTABLE_KEY.sub("_", key)
    fixed = (fixed.strip("_") or "_") if fixed != key else key
    if fixed != key and key not in _warned_keys:
        _warned_keys.add(key)
        logger.warning("MLflow metric key %r is not a stable name (spaces/parentheses/labels); logged as %r. "
                       "Put display labels and model names in params or tags.", key, fixed)
    return fixed


def numeric_items(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric (incl. bool) entries of a mapping, as floats, with stable keys
    (``stable_metric_key``)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[stable_metric_key(key)] = float(value)
    return out


class MlflowTracker(Tracker):
    """Logs into one existing MLflow run through an explicit client (no global fluent state)."""

    def __init__(self, client: Any, run_id: str, parent_run_id: str | None = None, summary_prefix: str = "") -> None:
        self.client = client
        self.run_id = run_id
        # a stage run mirrors its summary (metrics logged without a step) on the pipeline run, prefixed
        self.parent_run_id = parent_run_id
        self.summary_prefix = summary_prefix

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(_metric_key(k), _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        numeric = numeric_items(metrics)
        items = [Metric(k, v, now, step or 0) for k, v in numeric.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + _BATCH])
        if step is None and self.parent_run_id:
            summary = [Metric(f"{self.summary_prefix}{k}"[:250], v, now, 0) for k, v in numeric.items()]
            for i in range(0, min(len(summary), _MAX_SUMMARY), _BATCH):
                self.client.log_batch(self.parent_run_id, metrics=summary[i : min(i + _BATCH, _MAX_SUMMARY)])

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path or path.name)
        elif path.exists():
            self.client.log_artifact(self.run_id, str(path), artifact_path)
        else:
            logger.warning("artifact %s does not exist; not logged", path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value)[:_MAX_PARAM_CHARS])

    @contextlib.contextmanager
    def nested(self, name: str, tags: Mapping[str, Any] | None = None) -> Iterator[Tracker]:
        parent = self.client.get_run(self.run_id)
        inherited = {k: v for k, v in parent.data.tags.items() if k.startswith("envace.") and k != KIND_TAG}
        all_tags = {**inherited, KIND_TAG: "cell", "mlflow.runName": name, "mlflow.parentRunId": self.run_id,
                    **{k: str(v)[:_MAX_PARAM_CHARS] for k, v in (tags or {}).items()}}
        run = self.client.create_run(parent.info.experiment_id, tags=all_tags, run_name=name)
        child = MlflowTracker(self.client, run.info.run_id)
        try:
            yield child
        except BaseException as exc:
            self.client.set_terminated(child.run_id, status=_record_failure(child, exc))
            raise
        self.client.set_terminated(child.run_id, status="FINISHED")


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:_MAX_PARAM_CHARS]


# ---- the store -----------------------------------------------------------------------------------------
def tracking_root() -> Path:
    """Where the default store lives: the main repo of a DVC run, else the working directory."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def default_tracking_uri(root: Path | None = None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{(root or tracking_root()) / 'mlflow.db'}"


class MlflowStore:
    """An MLflow tracking store and one experiment in it (created on first use)."""

    def __init__(self, experiment: str = "envace", tracking_uri: str | None = None) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_id = self._experiment_id(experiment)

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if EXPERIMENT_KIND_TAG not in found.tags:
                self._set_kind(found.experiment_id)
            return found.experiment_id
        return self._set_kind(self._create_experiment(name))

    def _set_kind(self, experiment_id: str) -> str:
        try:
            self.client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception:  # cosmetic (the UI's default view): never fail a stage on it
            logger.warning("could not tag experiment %s with %s", experiment_id, EXPERIMENT_KIND_TAG, exc_info=True)
        return experiment_id

    def _create_experiment(self, name: str) -> str:
        location = None
        if self.tracking_uri.startswith("sqlite:///"):
            db = Path(self.tracking_uri[len("sqlite:///") :])
            location = (db.resolve().parent / "mlartifacts").as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created concurrently by another stage: read it back
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def start_run(self, name: str, tags: Mapping[str, Any], parent_run_id: str | None = None,
                  summary_prefix: str | None = None) -> MlflowTracker:
        """A new run; with ``summary_prefix`` (a stage run) its step-less metrics are mirrored on the parent
        as ``<prefix><key>``."""
        all_tags = {"mlflow.runName": name, **{k: str(v) for k, v in tags.items()}}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        mirror = parent_run_id if summary_prefix is not None else None
        return MlflowTracker(self.client, run.info.run_id, mirror, summary_prefix or "")

    def set_status(self, run_id: str, status: str) -> None:
        """``RUNNING`` reopens a run; ``FINISHED``/``FAILED``/``KILLED`` end it now."""
        if status == "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.client.set_terminated(run_id, status=status)


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
    store: MlflowStore, profile: str, overrides: list[str] | None = None, flow_run_id: str | None = None,
    owner: Mapping[str, str] | None = None,
) -> str:
    """Create a parent run for one pipeline run, owned by ``owner`` (``owner_tags``; default: this
    process); returns its id."""
    name = f"pipeline-{profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    tags = {**pipeline_tags(profile, overrides, flow_run_id), **(owner or owner_tags())}
    return store.start_run(name, tags).run_id


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


def resolve_parent_run(store: MlflowStore, profile: str) -> tuple[str, bool]:
    """(parent run id, whether this process manages its status) — see the module docstring."""
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
    run_id = start_pipeline_run(store, profile, owner=_key_owner(key))
    if key is not None:
        from envace.utils.io import write_json

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
            if (candidate is not None and candidate.info.run_id not in ended and candidate.info.status == "RUNNING"
                    and owner_alive(candidate.data.tags) is False):
                ended.append(_end_orphan(store, candidate))
    return ended


def _end_orphan(store: MlflowStore, run: Any) -> str:
    tags, run_id = run.data.tags, run.info.run_id
    why = (f"left RUNNING by process {tags.get(OWNER_PID_TAG)} on {tags.get(OWNER_HOST_TAG)}, which is gone "
           "(killed with -9, out of memory, or the machine went down)")
    store.client.set_tag(run_id, ORPHAN_TAG, f"{why}; marked KILLED at {time.strftime('%Y-%m-%d %H:%M:%S')} "
                                             f"by process {os.getpid()}")
    store.set_status(run_id, "KILLED")
    logger.warning("MLflow: %s run %s (%s) was %s; marked KILLED", tags.get(KIND_TAG, "a"), run_id,
                   run.info.run_name, why)
    return run_id


# ---- one stage = one nested run ------------------------------------------------------------------------
@contextlib.contextmanager
def stage_run(
    stage: str, params: Mapping[str, Any], *, profile: str, backend: str = "mlflow", experiment: str = "envace",
    tracking_uri: str | None = None,
) -> Iterator[Tracker]:
    """Open the nested MLflow run of ``stage`` (flat ``params`` logged), yield its tracker, end it
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
    parent_id, owns_parent = resolve_parent_run(store, profile)
    shared = pipeline_tags(profile)
    tags = {k: v for k, v in shared.items() if k != "envace.overrides"}
    tags.update({KIND_TAG: "stage", STAGE_TAG: stage, **owner_tags()})
    run = store.start_run(stage, tags, parent_run_id=parent_id, summary_prefix=summary_prefix(stage))
    run.log_params(params)
    logger.info("MLflow: stage run %s (parent %s) in %s", run.run_id, parent_id, store.tracking_uri)
    try:
        yield run
    except BaseException as exc:
        status = _record_failure(run, exc)
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


def _record_failure(run: Tracker, exc: BaseException) -> str:
    """Record ``exc`` on ``run`` (tags + ``error.txt``); returns the status to end it with."""
    try:
        run.set_tags({"error": f"{type(exc).__name__}: {exc}", "error.type": type(exc).__name__})
        run.log_text("".join(traceback.format_exception(exc)), "error.txt")
    except Exception:  # never mask the stage's own error
        logger.exception("could not record the failure in MLflow")
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


# ---- comparing runs ------------------------------------------------------------------------------------
def runs_table(
    experiment: str = "envace", *, parent_run_id: str | None = None, stage: str | None = None,
    kind: str | None = None, filter_string: str = "", tracking_uri: str | None = None,
    include_params: bool = False, max_results: int = 1000, group_by: str | Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
):
    """One row per run (newest first): ids, names, status, stage, parent, times, ``metrics.*`` and
    optionally ``params.*`` columns (also ``tags.*`` when grouping by a tag). Filters combine with AND.

    ``group_by`` (columns such as ``"params.algo.name"``, ``"params.seed"``, ``"stage"``; params/tags
    columns are added for it) turns it into a comparison: one row per group, for each metric (``metrics``,
    default: all) ``<metric>.mean``, ``<metric>.std`` and ``<metric>.n`` side by side, plus ``n_runs``.
    E.g. ``runs_table(stage="train", group_by="params.algo.name", metrics=["final/reward_mean"])``."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return pd.DataFrame(columns=["run_id", "run_name", "status", "stage", "parent_run_id"])
    clauses = [filter_string] if filter_string else []
    if parent_run_id:
        clauses.append(f"tags.mlflow.parentRunId = '{parent_run_id}'")
    if stage:
        clauses.append(f"tags.`{STAGE_TAG}` = '{stage}'")
    if kind:
        clauses.append(f"tags.`{KIND_TAG}` = '{kind}'")
    runs = client.search_runs(
        [exp.experiment_id], " and ".join(clauses), max_results=max_results, order_by=["attributes.start_time DESC"]
    )
    keys = [group_by] if isinstance(group_by, str) else list(group_by or [])
    with_params = include_params or any(k.startswith("params.") for k in keys)
    with_tags = any(k.startswith("tags.") for k in keys)
    table = pd.DataFrame([_run_row(run, with_params, with_tags) for run in runs])
    return compare(table, keys, metrics) if keys else table


def compare(table: Any, by: Sequence[str], metrics: Sequence[str] | None = None) -> Any:
    """Group a ``runs_table`` frame by columns ``by``: ``n_runs`` and per metric ``.mean``/``.std``/``.n``."""
    import pandas as pd

    missing = [k for k in by if k not in table.columns]
    if table.empty or missing:
        if missing and not table.empty:
            logger.warning("runs_table: no column %s to group by (runs have columns %s)", missing,
                           sorted(c for c in table.columns if not c.startswith("metrics."))[:40])
        return pd.DataFrame(columns=[*by, "n_runs"])
    names = [m if m.startswith("metrics.") else f"metrics.{m}" for m in metrics] if metrics else \
        sorted(c for c in table.columns if c.startswith("metrics."))
    for name in names:
        if name not in table.columns:
            table[name] = float("nan")
    groups = table.groupby(list(by), dropna=False)
    out = groups.size().rename("n_runs").to_frame()
    for name in names:
        col = groups[name]
        short = name[len("metrics.") :]
        out[f"{short}.mean"], out[f"{short}.std"], out[f"{short}.n"] = col.mean(), col.std(), col.count()
    return out.reset_index()


def compare_runs(metrics: str | Sequence[str], by: str | Sequence[str] = "params.algo.name", **filters: Any):
    """``runs_table(group_by=by, metrics=…)``: the same metric names side by side per variant/seed/…"""
    return runs_table(group_by=by, metrics=[metrics] if isinstance(metrics, str) else list(metrics), **filters)


def _run_row(run: Any, include_params: bool, include_tags: bool = False) -> dict[str, Any]:
    info, tags = run.info, run.data.tags
    end = info.end_time
    row: dict[str, Any] = {
        "run_id": info.run_id,
        "run_name": info.run_name,
        "status": info.status,
        "kind": tags.get(KIND_TAG),
        "stage": tags.get(STAGE_TAG),
        "parent_run_id": tags.get("mlflow.parentRunId"),
        "profile": tags.get("envace.profile"),
        "start_time": info.start_time,
        "duration_s": (end - info.start_time) / 1000 if end and info.start_time else None,
    }
    row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
    if include_params:
        row.update({f"params.{k}": v for k, v in run.data.params.items()})
    if include_tags:
        row.update({f"tags.{k}": v for k, v in tags.items()})
    return row
