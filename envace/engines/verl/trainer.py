"""verl's synchronous v1 trainer with role-wise advantages (``trainer.v1.trainer_mode=envace``).

verl's stock ``_compute_advantage`` fetches a fixed list of fields (uid, mask, scores, log-probs) and
calls the registered estimator with ``token_level_rewards``, ``response_mask``, ``index`` and ``config``
only: per-token role ids, trajectory ids, exclusion flags and output counts never reach it. This
subclass fetches the rows' ``extra_fields`` written by the act/rehearse agent loop as well, turns them
into those tensors (``envace.engines.verl.rows``) and calls the ``envace_rolewise`` / ``envace_grpo``
estimator with all of them. Everything else is verl's synchronous trainer (``sync`` mode): same replay
buffer, checkpointing, weight sync. Other estimators fall through to verl's own code path.

Like the stock step, and in the same order: KL-in-reward is refused (use the actor's KL loss instead,
docs/method.md §8), rollout correction runs first when configured (its rejection mask then defines the outputs),
advantages and returns are written back to TransferQueue as nested tensors. Metrics under ``envace/``:
rows, outputs, tokens and mean |advantage| per role, excluded rows.

Stopping: right after each step's sampling (``_balance_batch``) the trainer raises ``JudgeFailureBudgetExceeded``
when the agent loop flagged a row (``run_failure``: the judge's failure budget ran out in a worker, where verl would
only log it); ``fit`` ends the active MLflow run FAILED on any error before it propagates.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from envace.engines.verl.advantages import VERL_GRPO_NAME, VERL_ROLEWISE_NAME
from envace.engines.verl.rows import role_metrics, row_inputs
from envace.engines.verl.run_failure import end_mlflow_run_failed, raise_on_fatal
from envace.engines.verl.settings import TRAINER_MODE

logger = logging.getLogger(__name__)

ENVACE_ESTIMATORS = (VERL_ROLEWISE_NAME, VERL_GRPO_NAME)
_FIELDS = ["uid", "response_mask", "rm_scores", "extra_fields", "rollout_log_probs", "old_log_probs"]


def envace_advantages(
    data: DataProto, extra_fields: list[Any], keys: list[str], config: Any
) -> tuple[torch.Tensor, dict[str, float]]:
    """Role-wise (or envace GRPO) advantages of a padded batch, with the inputs verl's stock path drops.

    Args:
        data: padded rows with ``token_level_rewards``, ``response_mask`` and ``non_tensor_batch["uid"]``.
        extra_fields: the agent loop's ``extra_fields`` of every row.
        keys: verl row keys ``{uid}_{session}_{index}``.
        config: verl's full config (``algorithm`` and the ``envace`` node are read).
    Returns:
        ((bs, L) advantages, metrics).
    """
    algorithm = config.algorithm
    mask = data.batch["response_mask"]
    inputs = row_inputs(extra_fields, keys, mask)
    envace = config.get("envace") or {}
    estimator = core_algos.get_adv_estimator_fn(algorithm.adv_estimator)
    advantages, _ = estimator(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=mask,
        index=data.non_tensor_batch["uid"],
        config=algorithm,
        role_ids=inputs.role_ids,
        trajectory_ids=inputs.trajectory_ids,
        exclude=inputs.exclude,
        outputs_per_row=inputs.outputs_per_row,
        baseline=envace.get("baseline", None),
        norm_adv_by_std_in_grpo=bool(algorithm.get("norm_adv_by_std_in_grpo", False)),
    )
    return advantages, role_metrics(inputs, advantages, mask)


@register_trainer(TRAINER_MODE)
class EnvacePPOTrainer(PPOTrainerSync):
    """verl's synchronous trainer that feeds role ids etc. to the role-wise estimator (module docstring)."""

    def _build_replay_buffer(self) -> Any:
        # verl branches on the mode *name* ("sync" vs async modes) for its sampler, data loader and
        # checkpoint layout; this trainer is the synchronous one under another registry name.
        self.trainer_mode = "sync"
        return super()._build_replay_buffer()

    def fit(self, agent_loop_manager: Any) -> Any:
        """verl's training loop; on any error the active MLflow run ends FAILED with the cause (verl's own
        clean-up would end it FINISHED), then the error propagates and ``main_ppo`` exits non-zero."""
        try:
            return super().fit(agent_loop_manager)
        except Exception as exc:
            end_mlflow_run_failed(exc)
            raise

    def _balance_batch(self, batch: Any, metrics: dict, *args: Any, **kwargs: Any) -> Any:
        # the first hook after the step's sampling (verl's _step_once): stop before any log-prob pass or update
        self._stop_on_fatal_rows(batch)
        return super()._balance_batch(batch, metrics, *args, **kwargs)

    def _stop_on_fatal_rows(self, batch: Any) -> None:
        """Raise ``JudgeFailureBudgetExceeded`` with the agent loop's message when a row of the batch carries one
        (``envace.engines.verl.run_failure``)."""
        if not batch.keys:
            return
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        values = data.get("extra_fields").tolist()  # a NonTensorStack: one dict per row
        raise_on_fatal([values] if isinstance(values, dict) else values, getattr(self, "global_steps", None))

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        algorithm = self.config.algorithm
        if algorithm.adv_estimator not in ENVACE_ESTIMATORS:
            return super()._compute_advantage(batch, metrics)
        if algorithm.use_kl_in_reward:
            raise ValueError(
                "algorithm.use_kl_in_reward=True is not supported with the envace estimators; use "
                "actor_rollout_ref.actor.use_kl_loss=True (docs/method.md §8: KL as a loss term)"
            )
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=_FIELDS)
        nested_mask = data["response_mask"]
        padded = data.to_padded_tensor()
        uids = np.array(padded.pop("uid").tolist(), dtype=object)
        extra_fields = list(padded.pop("extra_fields").tolist())
        raise_on_fatal(extra_fields, getattr(self, "global_steps", None))  # also when _balance_batch was skipped
        proto = DataProto(batch=padded, non_tensor_batch={"uid": uids})
        proto.batch["token_level_scores"] = proto.batch["rm_scores"]
        proto.batch["token_level_rewards"] = proto.batch["rm_scores"]
        proto, corrected = self._rollout_correction(proto, metrics)
        advantages, role_stats = envace_advantages(proto, extra_fields, list(batch.keys), self.config)
        metrics.update(role_stats)
        output = {
            "advantages": response_to_nested(advantages, nested_mask),
            "returns": response_to_nested(advantages, nested_mask),
        }
        if corrected:
            output["response_mask"] = response_to_nested(proto.batch["response_mask"], nested_mask)
            if "rollout_is_weights" in proto.batch:
                output["rollout_is_weights"] = response_to_nested(proto.batch["rollout_is_weights"], nested_mask)
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(output, batch_size=len(batch))
        )

    def _rollout_correction(self, proto: DataProto, metrics: dict) -> tuple[DataProto, bool]:
        """verl's decoupled-mode rollout correction (IS weights / rejection), when configured."""
        config = self.config.algorithm.get("rollout_correction", None)
        if config is None or config.get("bypass_mode", False) or "rollout_log_probs" not in proto.batch:
            return proto, False
        proto, corr_metrics = compute_rollout_correction_and_add_to_batch(proto, config)
        metrics.update(corr_metrics)
        return proto, True
