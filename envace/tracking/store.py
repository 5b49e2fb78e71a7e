"""The MLflow store: where runs live, ``MlflowTracker`` (a ``Tracker`` logging into one run), and reading
runs back to compare them.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<root>/mlflow.db`` with artifacts under
``<root>/mlartifacts``, where root is ``DVC_ROOT`` (queued DVC experiments run in a temp copy but log
to the main repo) or the working directory. The experiment is tagged
``mlflow.experimentKind=custom_model_development`` so the UI opens on its runs, not the GenAI overview.

A stage run's summary (what it logs without a step: the runner's flattened metrics) is mirrored on the
pipeline run as ``<stage>/<key>`` (``evaluate@toolworld`` -> ``evaluate.toolworld/…``).
``runs_table(group_by=…)`` / ``compare_runs`` put variants or seeds side by side on the same metric names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from envace.tracking.tracker import KIND_TAG, STAGE_TAG, Tracker, metric_key, numeric_items, record_failure

logger = logging.getLogger(__name__)

_MAX_PARAM_CHARS = 6000
_BATCH = 100
_MAX_SUMMARY = 1000  # metrics one stage mirrors on the pipeline run
# the MLflow UI opens an experiment on its runs (not the GenAI overview) for this kind
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


class MlflowTracker(Tracker):
    """Logs into one existing MLflow run through an explicit client (no global fluent state)."""

    def __init__(self, client: Any, run_id: str, parent_run_id: str | None = None, summary_prefix: str = "") -> None:
        self.client = client
        self.run_id = run_id
        # a stage run mirrors its summary (metrics logged without a step) on the pipeline run, prefixed
        self.parent_run_id = parent_run_id
        self.summary_prefix = summary_prefix

    def log_params(self, params: Mapping[str, Any]) -> None:
        # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
        from mlflow.entities import Param

        items = [Param(metric_key(k), _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
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
        all_tags = {
            **inherited,
            KIND_TAG: "cell",
            "mlflow.runName": name,
            "mlflow.parentRunId": self.run_id,
            **{k: str(v)[:_MAX_PARAM_CHARS] for k, v in (tags or {}).items()},
        }
        run = self.client.create_run(parent.info.experiment_id, tags=all_tags, run_name=name)
        child = MlflowTracker(self.client, run.info.run_id)
        try:
            yield child
        except BaseException as exc:
            self.client.set_terminated(child.run_id, status=record_failure(child, exc))
            raise
        self.client.set_terminated(child.run_id, status="FINISHED")


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:_MAX_PARAM_CHARS]


# ---- the store ---------------------------------------------------------------------------------------
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
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # MLflow reads it once, on its first import
        # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
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

    def start_run(
        self, name: str, tags: Mapping[str, Any], parent_run_id: str | None = None, summary_prefix: str | None = None
    ) -> MlflowTracker:
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


# ---- comparing runs ------------------------------------------------------------------------------------
def runs_table(
    experiment: str = "envace",
    *,
    parent_run_id: str | None = None,
    stage: str | None = None,
    kind: str | None = None,
    filter_string: str = "",
    tracking_uri: str | None = None,
    include_params: bool = False,
    max_results: int = 1000,
    group_by: str | Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
):
    """One row per run (newest first): ids, names, status, stage, parent, times, ``metrics.*`` and
    optionally ``params.*`` columns (also ``tags.*`` when grouping by a tag). Filters combine with AND.

    ``group_by`` (columns such as ``"params.algo.name"``, ``"params.seed"``, ``"stage"``; params/tags
    columns are added for it) turns it into a comparison: one row per group, for each metric (``metrics``,
    default: all) ``<metric>.mean``, ``<metric>.std`` and ``<metric>.n`` side by side, plus ``n_runs``.
    E.g. ``runs_table(stage="train", group_by="params.algo.name", metrics=["final/reward_mean"])``."""
    # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
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
    missing = [k for k in by if k not in table.columns]
    if table.empty or missing:
        if missing and not table.empty:
            logger.warning(
                "runs_table: no column %s to group by (runs have columns %s)",
                missing,
                sorted(c for c in table.columns if not c.startswith("metrics."))[:40],
            )
        return pd.DataFrame(columns=[*by, "n_runs"])
    names = (
        [m if m.startswith("metrics.") else f"metrics.{m}" for m in metrics]
        if metrics
        else sorted(c for c in table.columns if c.startswith("metrics."))
    )
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
