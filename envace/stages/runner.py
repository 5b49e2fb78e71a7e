"""What every stage shares: load params.yaml (+ CLI ``key=value`` overrides), open the stage's nested
MLflow run, time it, write its metrics file atomically, and turn an exception into a FAILED run.

A stage module is then ``run(cfg, tracker) -> dict`` plus ``main = stage_main("name", run)``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from envace.config import PARAMS_FILE, ConfigError, flatten, load_params, to_plain
from envace.tracking import NULL_TRACKER, NullTracker, Tracker, stage_run
from envace.utils.io import write_json
from envace.utils.seeds import seed_everything
from envace.utils.telemetry import telemetry_off

logger = logging.getLogger(__name__)

RunFn = Callable[[DictConfig, Tracker], dict[str, Any]]
MetricsPathFn = Callable[[DictConfig], Path]


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for noisy in ("alembic", "mlflow.store", "urllib3", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def default_metrics_path(name: str) -> MetricsPathFn:
    return lambda cfg: Path(cfg.paths.metrics) / f"{name}.json"


def configure_torch(cfg: DictConfig) -> None:
    """Thread count from ``engine.num_threads`` (an int, or ``auto``: see ``resolve_threads``)."""
    import torch

    from envace.engines.local.precision import resolve_threads

    torch.set_num_threads(resolve_threads(cfg.engine.num_threads))


def execute(
    name: str, run_fn: RunFn, cfg: DictConfig, metrics_path: Path, *, tracking_uri: str | None = None
) -> dict[str, Any]:
    """Run one stage under its MLflow run; returns the metrics (also written to ``metrics_path``)."""
    seed_everything(int(cfg.seed))
    started = time.perf_counter()
    with stage_run(
        name, flatten(cfg), profile=to_plain(cfg.profile), backend=to_plain(cfg.tracking.backend),
        experiment=cfg.tracking.experiment, tracking_uri=tracking_uri,
    ) as tracker:
        metrics = run_fn(cfg, tracker)
        write_json(metrics_path, metrics)
        seconds = time.perf_counter() - started
        tracker.log_metrics({**flatten(metrics), "stage_seconds": seconds})
        tracker.log_artifact(metrics_path, "metrics")
    logger.info("stage %s done in %.1f s -> %s", name, seconds, metrics_path)
    return metrics


def stage_main(name: str, run_fn: RunFn, metrics_path: MetricsPathFn | None = None) -> Callable[..., int]:
    """Build the ``main(argv)`` of a stage module (``python -m envace.stages.<name> [key=value…]``)."""

    def main(argv: list[str] | None = None) -> int:
        telemetry_off()
        configure_logging()
        overrides = list(sys.argv[1:] if argv is None else argv)
        try:
            cfg = load_params(PARAMS_FILE, overrides)
        except ConfigError as exc:
            logger.error("%s: bad configuration: %s", name, exc)
            return 2
        stage_id = os.environ.get("DVC_STAGE") or name
        path = (metrics_path or default_metrics_path(name))(cfg)
        execute(stage_id, run_fn, cfg, path)
        return 0

    return main


__all__ = ["NULL_TRACKER", "NullTracker", "Tracker", "configure_torch", "execute", "stage_main"]
