"""Role-wise GRPO updates of the local engine (SPEC §3).

Per step: every output y (one ACT or one REHEARSE generation) inherits its trajectory's reward R and
gets A(y) = R − μ_{x, role(y)} (``compute_rolewise_advantages``; ``compute_grpo_advantages`` — one
baseline per prompt over ACT outputs — for the ``grpo`` variant). A(y) is applied to every generated
token of y in the clipped objective of ``envace.core.losses.compute_policy_loss`` (token-mean over the
mini-batch, optional low_var_kl to a frozen reference), then AdamW with constant LR and grad-norm
clipping at 1.0; ``ppo_epochs`` passes over ``mini_batch_streams``-sized mini-batches.

Choices (documented deviations):
- Old log-probs are *recomputed* with the current model in eval mode before the update (default
  ``old_logprobs="recompute"``): the first PPO epoch then starts at ratio 1 exactly as in verl, and
  tiny numerical differences between the batched-with-holes rollout forward and the padded training
  forward do not masquerade as policy change. ``"sampling"`` reuses the rollout's log-probs instead.
  The mean |sampling − recomputed| is logged as ``rollout/logprob_diff`` either way (a health check).
- Trajectories whose reward has status JUDGE_FAILED are excluded from baselines (``exclude=``) and
  from the loss (no rows), and counted in ``judge_failures``.
- A model trains only on the outputs of its roles (``Slot.roles``): frozen roles' outputs are not in
  its rows, so they carry no gradient even though weights are shared.
- Per-role gradient norms (``track_role_grad_norms``) cost one extra backward per micro-batch: each
  role's share of the token-mean loss is differentiated separately and the sums are applied.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from envace.core.advantages import compute_grpo_advantages, compute_rolewise_advantages
from envace.core.losses import compute_policy_loss
from envace.core.records import Role, Trajectory, TrajectoryStatus
from envace.engines.base import Variant
from envace.engines.local.batching import (
    TrainRow,
    collate,
    scatter_back,
    token_logprobs,
)
from envace.engines.local.config import OptimConfig
from envace.core.seeds import derive_seed

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """One trained model: which roles' outputs train it, its optimiser and optional frozen reference."""

    name: str
    model: torch.nn.Module
    roles: frozenset[Role]
    optimizer: torch.optim.Optimizer
    ref: torch.nn.Module | None = None


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, lr: float | None = None) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr if lr is None else lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
    )


@dataclass(frozen=True)
class OutputAdvantages:
    """Advantages per output in ``batching.output_index`` order, with each output's role."""

    values: torch.Tensor
    roles: tuple[Role, ...]
    excluded: tuple[bool, ...]  # per trajectory


def compute_output_advantages(
    trajectories: Sequence[Trajectory], groups: Sequence[Any], variant: Variant, cfg: OptimConfig
) -> OutputAdvantages:
    """Per-output advantages: role-wise baselines, or one baseline per prompt (grpo, trainable roles only)."""
    excluded = tuple(t.status is not TrajectoryStatus.OK for t in trajectories)
    rewards, group_ids, roles, traj_ids, skip = [], [], [], [], []
    for i, traj in enumerate(trajectories):
        for role, _ in traj.outputs():
            rewards.append(traj.reward if not excluded[i] else 0.0)
            group_ids.append(groups[i])
            roles.append(role)
            traj_ids.append(i)
            skip.append(excluded[i] or (not variant.rolewise_baseline and role not in variant.trainable_roles))
    if not rewards:
        return OutputAdvantages(torch.zeros(0), (), excluded)
    reward_t = torch.tensor(rewards, dtype=torch.float32)
    kwargs = {"baseline": cfg.baseline, "norm_by_std": cfg.norm_by_std, "trajectory_ids": traj_ids, "exclude": skip}
    if variant.rolewise_baseline:
        values = compute_rolewise_advantages(reward_t, group_ids, [int(r) for r in roles], **kwargs)
    else:
        values = compute_grpo_advantages(reward_t, group_ids, **kwargs)
    return OutputAdvantages(values, tuple(roles), excluded)


@dataclass
class UpdateStats:
    """Running sums over the optimiser steps of one update (turned into means by ``metrics``)."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.counts[key] = self.counts.get(key, 0) + 1

    def metrics(self, prefix: str = "") -> dict[str, float]:
        return {prefix + k: self.sums[k] / self.counts[k] for k in self.sums}


class PolicyUpdater:
    """Clipped role-wise updates of one ``Slot`` over its rows."""

    def __init__(self, slot: Slot, cfg: OptimConfig, seed: int, pad_id: int, device: str | torch.device = "cpu"):
        self.slot, self.cfg, self.seed, self.pad_id, self.device = slot, cfg, seed, pad_id, device

    def _micro_batches(self, rows: Sequence[TrainRow]) -> list[list[TrainRow]]:
        size = max(1, self.cfg.micro_batch_streams)
        return [list(rows[i : i + size]) for i in range(0, len(rows), size)]

    @torch.no_grad()
    def prepare(self, rows: Sequence[TrainRow]) -> float:
        """Set old (and reference) log-probs on every row; returns mean |sampling − recomputed| log-prob."""
        if self.cfg.old_logprobs not in ("recompute", "sampling"):
            raise ValueError(f"OptimConfig.old_logprobs={self.cfg.old_logprobs!r}; valid: 'recompute', 'sampling'")
        self.slot.model.eval()
        diffs, n = 0.0, 0
        for mb_rows in self._micro_batches(rows):
            batch = collate(mb_rows, self.pad_id, self.device)
            current = token_logprobs(self.slot.model, batch)
            diffs += float(((current - batch.values["sampling_logprobs"]).abs() * batch.mask).sum())
            n += int(batch.mask.sum())
            if self.cfg.old_logprobs == "recompute":
                scatter_back(mb_rows, batch, current, "old_logprobs")
            if self.slot.ref is not None:
                scatter_back(mb_rows, batch, token_logprobs(self.slot.ref, batch), "ref_logprobs")
        if self.cfg.old_logprobs == "sampling":
            for r in rows:
                r.old_logprobs = r.sampling_logprobs.clone()
        return diffs / max(n, 1)

    def update(self, rows: Sequence[TrainRow], step: int) -> dict[str, float]:
        """``ppo_epochs`` × mini-batches of optimiser steps; returns mean metrics (prefix-free)."""
        stats = UpdateStats()
        if not rows:
            return {}
        self.slot.model.train()
        size = self.cfg.mini_batch_streams or len(rows)
        for epoch in range(self.cfg.ppo_epochs):
            order = list(range(len(rows)))
            random.Random(derive_seed(self.seed, step, "minibatch", self.slot.name, epoch)).shuffle(order)
            for start in range(0, len(order), size):
                self._optimizer_step([rows[i] for i in order[start : start + size]], stats)
        self.slot.model.eval()
        return stats.metrics()

    def _losses(self, batch: Any, n_tokens: int, n_rows: int) -> dict[Role, Any]:
        """Each trained role's share of the mini-batch token-mean loss (they sum to the full loss)."""
        log_probs = token_logprobs(self.slot.model, batch)
        info = {"dp_size": 1, "batch_num_tokens": n_tokens, "global_batch_size": n_rows}
        out = {}
        for role in sorted(self.slot.roles):
            mask = batch.mask & (batch.values["roles"] == int(role))
            if not bool(mask.any()):
                continue
            out[role] = compute_policy_loss(
                log_probs, batch.values["old_logprobs"], batch.values["advantages"] * mask, mask,
                clip_ratio=self.cfg.clip_ratio, kl_coef=self.cfg.kl_coef,
                ref_log_probs=batch.values.get("ref_logprobs"), loss_agg_mode=self.cfg.loss_agg_mode,
                global_batch_info=info,
            )
        return out

    def _backward(self, losses: dict[Role, Any], role_grads: dict[Role, list[torch.Tensor]]) -> None:
        params = [p for p in self.slot.model.parameters() if p.requires_grad]
        if not self.cfg.track_role_grad_norms:
            sum(lo.loss for lo in losses.values()).backward()
            return
        roles = list(losses)
        for j, role in enumerate(roles):
            grads = torch.autograd.grad(losses[role].loss, params, retain_graph=j < len(roles) - 1, allow_unused=True)
            acc = role_grads.setdefault(role, [torch.zeros_like(p) for p in params])
            for a, g in zip(acc, grads):
                if g is not None:
                    a.add_(g)

    def _optimizer_step(self, rows: list[TrainRow], stats: UpdateStats) -> None:
        opt, model = self.slot.optimizer, self.slot.model
        opt.zero_grad(set_to_none=True)
        n_tokens = sum(r.n_tokens for r in rows)
        role_grads: dict[Role, list[torch.Tensor]] = {}
        acc: dict[str, float] = {}
        for mb_rows in self._micro_batches(rows):
            batch = collate(mb_rows, self.pad_id, self.device)
            losses = self._losses(batch, n_tokens, len(rows))
            if not losses:
                continue
            self._backward(losses, role_grads)
            for role, lo in losses.items():  # micro-batch losses are partial sums of the mini-batch mean
                tag = role.name.lower()
                for key, value in (
                    (f"loss/{tag}", lo.loss), (f"tokens_in_loss/{tag}", lo.n_tokens), ("loss", lo.loss),
                    ("pg_loss", lo.pg_loss), ("kl", lo.kl), ("clipfrac", lo.clipfrac * lo.n_tokens / n_tokens),
                ):
                    acc[key] = acc.get(key, 0.0) + float(value.detach() if torch.is_tensor(value) else value)
        for key, value in acc.items():
            stats.add(key, value)
        if role_grads:
            self._apply_role_grads(role_grads, stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
        stats.add("grad_norm", float(grad_norm))
        opt.step()

    def _apply_role_grads(self, role_grads: dict[Role, list[torch.Tensor]], stats: UpdateStats) -> None:
        params = [p for p in self.slot.model.parameters() if p.requires_grad]
        for role, grads in role_grads.items():
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            stats.add(f"grad_norm/{role.name.lower()}", float(norm))
        for j, p in enumerate(params):
            p.grad = sum(grads[j] for grads in role_grads.values())
