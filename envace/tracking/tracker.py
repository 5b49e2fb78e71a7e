"""Experiment tracking behind one small interface: what a stage may log (``Tracker``), and the names.

``Tracker`` is implemented by ``envace.tracking.store.MlflowTracker`` (one MLflow run) and by
``NullTracker`` (``tracking=none``, tests). ``envace.tracking.runs`` opens the runs a stage logs into
(pipeline run, stage run, orphan clean-up); ``envace.tracking.store`` is the MLflow store and reads runs
back for comparison (``runs_table``, ``compare_runs``); rollout tables, data-set inputs, the model and system
metrics are ``envace.tracking.mlflow_logging``'s, episode traces ``envace.tracking.traces``'s.

Metric names are stable: ``stable_metric_key`` renames keys with spaces, parentheses or other display
characters (with a warning); labels and model names belong in params/tags. Every run is tagged with its
kind (``KIND_TAG``: pipeline, stage or cell) and, below a pipeline run, its stage (``STAGE_TAG``).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import os
import re
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

from envace.utils.secrets import redact

logger = logging.getLogger(__name__)

STAGE_TAG = "envace.stage"
KIND_TAG = "envace.kind"  # "pipeline" | "stage" | "cell" (a sweep cell under a stage)


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


def metric_key(key: str) -> str:
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
        logger.warning(
            "MLflow metric key %r is not a stable name (spaces/parentheses/labels); logged as %r. "
            "Put display labels and model names in params or tags.",
            key,
            fixed,
        )
    return fixed


def numeric_items(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric (incl. bool) entries of a mapping, as floats, with stable keys
    (``stable_metric_key``)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[stable_metric_key(key)] = float(value)
    return out


def record_failure(run: Tracker, exc: BaseException) -> str:
    """Record ``exc`` on ``run`` (tags + ``error.txt``, API keys redacted); returns the status to end it with."""
    try:
        run.set_tags({"error": redact(f"{type(exc).__name__}: {exc}"), "error.type": type(exc).__name__})
        run.log_text(redact("".join(traceback.format_exception(exc))), "error.txt")
    except Exception:  # never mask the stage's own error
        logger.exception("could not record the failure in MLflow")
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
