"""Experiment tracking: the ``Tracker`` interface and names (``tracker``), the MLflow store (``store``), the
runs a stage logs into (``runs``), which keys a run logs as params (``params``), and what training and
evaluation log beyond metrics (``mlflow_logging``, ``traces``)."""

import os

# MLflow reads this once, when it is first imported (its telemetry client): the modules of this package
# import mlflow at their top, so it is set here, before any of them loads (an explicit value is kept)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
