"""A verl run that must stop: the judge's failure budget inside the agent loop, the MLflow run when the trainer dies.

Why the agent loop does not simply raise. In verl 0.9.1 an exception in ``AgentLoopBase.run`` fails only its agent
session: ``AgentLoopWorkerTQ._run_prompt`` (``verl/trainer/ppo/v1/agent_loop_tq.py``) logs it and tags the prompt
``failure``; the sync replay buffer (``verl/trainer/ppo/v1/replay_buffer.py``: ``ReplayBuffer.sample``) keeps the
group's other sessions and pads the missing rows, and the trainer errors out only when a batch has no trajectory at
all. So ``JudgeFailureBudgetExceeded`` raised in a worker would leave the run training on exclusions.

Instead (``score_or_stop``) the loop catches it, scores the trajectory as a judge failure (excluded) and writes the
budget's message into every row's ``extra_fields[FATAL_KEY]``. The rows reach TransferQueue like any other, and the
``envace`` trainer reads that field of the step's batch right after sampling (``raise_on_fatal``, from its
``_balance_batch``, before the step's log-prob passes and update) and raises ``JudgeFailureBudgetExceeded`` with the
worker's message: the run stops within the step in which the budget ran out. The budget raises at every later call,
so every later trajectory carries the flag as well. Validation batches are not checked (verl's ``_validate`` has no
hook between sampling and its metrics): a budget spent during validation stops the next training step, and only one
spent in the very last validation ends the run without this error (its validation metrics then count exclusions).

MLflow: verl's ``TaskRunnerV1.run`` (``verl/trainer/main_ppo.py``) ends its tracking in a ``finally``, and verl's
MLflow adapter ends the active run FINISHED whatever the exit code. ``end_mlflow_run_failed``, called by the
trainer's ``fit`` on any exception, ends the active run FAILED first (with the cause as the tag
``envace.failure``), so the run reads FAILED however it was created: the launcher's child run (single node and the
multi-node ``submit.sh``, both through ``MLFLOW_RUN_ID``) or a run verl created itself.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envace.core.records import TrajectoryStatus
from envace.core.reward import RewardOutcome
from envace.judges.budget import JudgeFailureBudgetExceeded

logger = logging.getLogger(__name__)

FATAL_KEY = "envace_fatal"  # extra_fields: the message of the error that must stop the run ("" / absent: none)
FAILURE_TAG = "envace.failure"
MLFLOW_TAG_LIMIT = 5000  # MLflow's longest tag value


def score_or_stop(score: Any, *args: Any) -> tuple[RewardOutcome, str | None]:
    """``score(*args)`` (``sources.score_trajectory``); when the judge's failure budget is exhausted, a
    JUDGE_FAILED outcome (the trajectory is excluded) and the budget's message, else (outcome, None)."""
    try:
        return score(*args), None
    except JudgeFailureBudgetExceeded as exc:
        message = str(exc)
        logger.error("judge failure budget exhausted in the agent loop; the trainer stops at this step: %s", message)
        return RewardOutcome(0.0, TrajectoryStatus.JUDGE_FAILED, {"error": message[:500]}), message


def mark_fatal(rows: Sequence[Any], message: str | None) -> Sequence[Any]:
    """Write ``message`` into every row's ``extra_fields[FATAL_KEY]`` (a no-op for None)."""
    if message:
        for row in rows:
            row.extra_fields[FATAL_KEY] = message
    return rows


def fatal_causes(extra_fields: Iterable[Mapping[str, Any] | None]) -> list[str]:
    """The distinct fatal messages of a batch's rows, in row order."""
    causes: dict[str, None] = {}
    for extra in extra_fields:
        message = (extra or {}).get(FATAL_KEY)
        if message:
            causes[str(message)] = None
    return list(causes)


def raise_on_fatal(extra_fields: Iterable[Mapping[str, Any] | None], step: int | None = None) -> None:
    """Raise ``JudgeFailureBudgetExceeded`` with the first row's message when any row carries one."""
    causes = fatal_causes(extra_fields)
    if not causes:
        return
    where = f" (training step {step})" if step is not None else ""
    raise JudgeFailureBudgetExceeded(f"{causes[0]}{where}; stopped by the envace trainer after generation")


def end_mlflow_run_failed(exc: BaseException) -> str | None:
    """End this process's active MLflow run with status FAILED and the cause as a tag; returns its id (None when
    there is no active run, e.g. mlflow not in ``trainer.logger``). Never raises: the original error matters."""
    mlflow = sys.modules.get("mlflow")  # verl's MLflow logger imported it; not imported means no run to end
    if mlflow is None:
        return None
    try:
        run = mlflow.active_run()
        if run is None:
            return None
        cause = f"{type(exc).__name__}: {exc}"
        mlflow.set_tag(FAILURE_TAG, cause[:MLFLOW_TAG_LIMIT])
        mlflow.end_run(status="FAILED")
        logger.error("MLflow run %s ended FAILED: %s", run.info.run_id, cause[:500])
        return run.info.run_id
    except Exception:  # noqa: BLE001 - a tracking error must not hide the training error
        logger.exception("could not mark the MLflow run FAILED")
        return None
