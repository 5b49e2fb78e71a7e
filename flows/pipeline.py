"""The Prefect flow ``envace``: the DVC pipeline, one task per stage.

One DAG, one cache: the flow writes params.yaml from conf/ + ``overrides`` (exactly what
``dvc exp run -S`` would write), asks DVC for the stage order, and runs ``dvc repro <stage>`` per stage.
DVC decides what is up to date; Prefect adds retries, parameters and a UI. The flow owns the MLflow
parent run (named by profile, variant, seed and time; the composed config logged on it once) and hands
its id to every stage through ``ENVACE_PARENT_RUN_ID``.

Note: like ``dvc exp run -S`` in the workspace, a run with overrides leaves params.yaml changed;
``make params`` restores the default. Two runs at once in one workspace would both rewrite params.yaml,
so the deployment admits one run at a time (``DEPLOYMENT_CONCURRENCY``: a Prefect deployment concurrency
limit of 1 with the ENQUEUE strategy): a second run waits in ``AwaitingConcurrencySlot`` until the first
ends, then runs.

After the report stage the flow publishes the report as artifacts of the run (``tasks.stages.publish_report``:
``report.md`` as markdown, the main tables as tables). Each stage task has a timeout
(``tasks.stages.TIMEOUT_SECONDS``); ``timeouts={"train": 7200}`` sets others per stage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.runtime import flow_run

from envace.config.load import PARAMS_FILE, flatten, load_params, to_plain
from envace.tracking.runs import ENV_FLOW_RUN_ID, ENV_OVERRIDES, ENV_PARENT_RUN_ID, start_pipeline_run
from envace.tracking.store import MlflowStore, default_tracking_uri
from tasks.stages import STAGE_TASKS, compose_params, publish_report, stage_order, with_timeout

DEPLOYMENT_NAME = "full-pipeline"
# one run of the deployment at a time (a workspace has one params.yaml); later runs queue, none is dropped
DEPLOYMENT_CONCURRENCY = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)


def project_root() -> Path:
    """The repo the flow works in: ``ENVACE_ROOT`` or the working directory of the serving process."""
    return Path(os.environ.get("ENVACE_ROOT") or os.getcwd()).resolve()


def select_stages(order: list[str], only: list[str] | None) -> list[str]:
    """Stages in DAG order, restricted to ``only`` (names like ``train`` or ``evaluate@toolworld``)."""
    unknown = [s for s in order if s.split("@")[0] not in STAGE_TASKS]
    if unknown:
        raise ValueError(f"dvc.yaml stages {unknown} have no Prefect task; add them to tasks.stages.STAGE_TASKS")
    if not only:
        return list(order)
    picked = [s for s in order if s in only or s.split("@")[0] in only]
    missing = [s for s in only if not any(p == s or p.split("@")[0] == s for p in picked)]
    if missing:
        raise ValueError(f"unknown stages {missing}; dvc.yaml has {order}")
    return picked


def stage_task(stage: str, timeouts: dict[str, float] | None):
    """The Prefect task of a dvc.yaml stage, with its timeout from ``timeouts`` (``evaluate@bfcl`` or
    ``evaluate``) when given there."""
    name = stage.split("@")[0]
    task = STAGE_TASKS[name]
    for key in (stage, name):
        if timeouts and key in timeouts:
            return with_timeout(task, timeouts[key])
    return task


@flow(name="envace", log_prints=True)
def envace_flow(
    overrides: list[str] | None = None, stages: list[str] | None = None, timeouts: dict[str, float] | None = None
) -> dict:
    """Run the pipeline. ``overrides`` mean what ``dvc exp run -S`` means (``["profile=smoke"]``);
    ``stages`` optionally limits the run to some stages (upstream stages DVC finds stale still run);
    ``timeouts`` sets per-stage task timeouts in seconds (``{"train": 7200}``; default TIMEOUT_SECONDS)."""
    logger = get_run_logger()
    root = project_root()
    overrides = list(overrides or [])
    compose_params(overrides, str(root))
    order = select_stages(stage_order(str(root)), stages)
    cfg = load_params(root / PARAMS_FILE)
    env = {ENV_OVERRIDES: json.dumps(overrides), ENV_FLOW_RUN_ID: str(flow_run.id or "")}
    store = None
    if to_plain(cfg.tracking.backend) == "mlflow":
        store = MlflowStore(cfg.tracking.experiment, default_tracking_uri(root))
        env[ENV_PARENT_RUN_ID] = start_pipeline_run(
            store, to_plain(cfg.profile), overrides, env[ENV_FLOW_RUN_ID], config=flatten(cfg)
        )
        logger.info("MLflow parent run %s in %s", env[ENV_PARENT_RUN_ID], store.tracking_uri)
    status = "FAILED"
    try:
        for stage in order:
            stage_task(stage, timeouts)(stage, str(root), env)
        if "report" in order:
            publish_report(str(root), str(cfg.paths.reports))
        status = "FINISHED"
    finally:
        if store is not None:
            store.set_status(env[ENV_PARENT_RUN_ID], status)
    return {"stages": order, "parent_run_id": env.get(ENV_PARENT_RUN_ID), "overrides": overrides}


def serve(name: str = DEPLOYMENT_NAME) -> None:
    """Serve the flow as deployment ``envace/<name>``, one run at a time (``DEPLOYMENT_CONCURRENCY``)."""
    envace_flow.serve(name=name, global_limit=DEPLOYMENT_CONCURRENCY)
