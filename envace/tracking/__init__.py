"""Experiment tracking: the ``Tracker`` interface and names (``tracker``), the MLflow store (``store``), the
runs a stage logs into (``runs``), which keys a run logs as params (``params``), and what training and
evaluation log beyond metrics (``mlflow_logging``, ``traces``)."""
