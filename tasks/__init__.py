"""Prefect tasks: one per DVC stage, each a thin ``dvc repro <stage>`` (DVC owns caching)."""

from tasks.stages import STAGE_TASKS, compose_params, stage_order

__all__ = ["STAGE_TASKS", "compose_params", "stage_order"]
