"""Role-wise GRPO updates of the local engine (docs/method.md §7, §8).

Per step: every output y (one ACT or one REHEARSE generation) inherits its trajectory's reward R and
gets A(y) = R − μ_{x, role(y)} (``compute_rolewise_advantages``; ``compute_grpo_advantages`` — one
baseline per prompt, with conf/algo/grpo.yaml's ``trajectory_mean`` the mean of its K trajectory rewards —
for the ``grpo`` variant). A(y) is applied to every generated
token of y in the clipped objective of ``envace.engines.losses.compute_policy_loss`` (token-mean over the
mini-batch, optional low_var_kl to a frozen reference), then AdamW with constant LR and grad-norm
clipping at 1.0; ``ppo_epochs`` passes over mini-batches (``mini_batch_streams`` rows each, or the step's rows
in ``mini_batches`` parts), one optimiser step per mini-batch.

Choices (documented deviations):
- Old log-probs are *recomputed* with the current model before the update (default
  ``old_logprobs="recompute"``): the first PPO epoch then starts at ratio 1 exactly as in verl, and
  tiny numerical differences between the cached rollout forward and the training forward do not
  masquerade as policy change. When the update is a single on-policy pass (``ppo_epochs=1``, one
  mini-batch) the recomputed values *are* the update forward's own, detached: no extra forward runs.
  ``"sampling"`` reuses the rollout's log-probs instead. The mean |sampling − training| log-prob is
  logged as ``rollout/logprob_diff`` (free from the update forward on a single pass; otherwise from
  the recompute forward, or from the opt-in ``logprob_check`` forward).
- Speed (``envace.engines.local.packing``): rows sharing a prompt prefix are packed behind one copy
  of it, and their tails share their own common starts (a token trie; exact tree-causal masks;
  ``update/encoded_tokens`` counts what the forwards encode), micro-batches are length-bucketed by a
  token budget, the LM head runs only at trained positions, gradient checkpointing switches on where
  activations would exceed ~1 GB, gradients accumulate into one flat buffer (``flat_gradients``);
  ``precision="bf16"`` runs forwards under bf16 autocast with float32 master weights.
- Trajectories whose reward has status JUDGE_FAILED are excluded from baselines (``exclude=``) and
  from the loss (no rows), and counted in ``judge_failures``.
- A model trains only on the outputs of its roles (``Slot.roles``): frozen roles' outputs are not in
  its rows, so they carry no gradient even though weights are shared.
- Per-role gradient norms (``track_role_grad_norms``) cost one extra backward per micro-batch: each
  role's share of the token-mean loss is differentiated separately and the sums are applied.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from envace.core.advantages import compute_grpo_advantages, compute_rolewise_advantages
from envace.core.records import Role, Trajectory, TrajectoryStatus
from envace.core.seeds import derive_seed
from envace.engines.base import Variant
from envace.engines.local.batching import (
    PaddedBatch,
    TrainRow,
    collate,
)
from envace.engines.local.config import OptimConfig
from envace.engines.local.packing import attention_cost_ratio, collate_packs, plan_packs
from envace.engines.local.packing import micro_batches as pack_micro_batches
from envace.engines.losses import compute_policy_loss
from envace.runtime.attention import GQA_SDPA
from envace.runtime.precision import autocast, mark_weights_changed, release_inference_copy

logger = logging.getLogger(__name__)

SEGMENTED_BATCH_TOKENS = 2048  # padded tokens per forward when the attention runs segment by segment (SmolLM2)
# activation floats per token, roughly: the logits, one hidden state per layer, one MLP intermediate; SmolLM2's
SMOLLM2_ACTIVATION_WIDTH = 49152 + 30 * 576 + 1536


def segmented_batch_tokens(model: torch.nn.Module) -> int:
    """Padded tokens per segment-wise forward: ``SEGMENTED_BATCH_TOKENS`` for SmolLM2-sized activations and
    wider; a model with narrower activations per token takes proportionally more tokens, for the same
    activation memory in fewer, larger calls. Measured (``scripts/bench_peer_trl.py``'s 0.7M-parameter
    Llama, 8 packs of 320 tokens, no-bf16 AMD EPYC): one forward instead of two, update 1.05x faster at 1
    thread and 1.12x at 2."""
    cfg = getattr(model, "config", None)
    try:
        width = int(cfg.vocab_size) + int(cfg.num_hidden_layers) * int(cfg.hidden_size) + int(cfg.intermediate_size)
    except (AttributeError, TypeError):
        return SEGMENTED_BATCH_TOKENS
    return max(SEGMENTED_BATCH_TOKENS, SEGMENTED_BATCH_TOKENS * SMOLLM2_ACTIVATION_WIDTH // max(width, 1))


@dataclass
class Slot:
    """One trained model: which roles' outputs train it, its optimiser and optional frozen reference."""

    name: str
    model: torch.nn.Module
    roles: frozenset[Role]
    optimizer: torch.optim.Optimizer
    ref: torch.nn.Module | None = None


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, lr: float | None = None) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, fused (one kernel over all tensors) where torch supports it.

    On a CPU torch otherwise runs AdamW tensor by tensor: SmolLM2-135M measured 3.2-6.3 s per step
    that way vs 0.3-0.8 s fused (1 thread, AMD EPYC), with no extra state or temporaries.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16) for p in params
    )
    opt = torch.optim.AdamW(
        params,
        lr=cfg.lr if lr is None else lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )
    opt.register_step_post_hook(lambda *_: mark_weights_changed(model))  # the bf16 decoding copy is stale now
    return opt


@contextlib.contextmanager
def flat_gradients(model: torch.nn.Module) -> Iterator[None]:
    """Backward passes inside the block accumulate into one flat gradient buffer (per dtype and device).

    Each trainable parameter gets a zeroed ``.grad`` viewing that buffer, and backward adds into it in
    place: gradients are one allocation — on a CPU a mapping of its own (far above glibc's mmap
    threshold), returned to the OS when ``zero_grad(set_to_none=True)`` drops the views — instead of
    hundreds of few-MB heap blocks allocated between the activations of the same backward, where
    they pin freed memory (SmolLM2 update, bf16, one AMD EPYC core: peak RSS ~4.85 -> ~4.55 GB,
    ``scripts/bench_step.py``). The values equal the gradients torch allocates itself (a first
    contribution is added to exact zeros; only an entry that is exactly zero may differ, in its
    sign). On exit, a parameter no backward reached gets ``None`` again, so the optimiser skips it
    as before (no weight decay, no step count for it).
    """
    groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            groups.setdefault((p.dtype, p.device), []).append(p)
    reached: set[int] = set()
    handles = []
    for (dtype, device), params in groups.items():
        flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=device)
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            handles.append(p.register_post_accumulate_grad_hook(lambda q: reached.add(id(q))))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for params in groups.values():
            for p in params:
                if id(p) not in reached:
                    p.grad = None


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


def abs_gap(log_probs: torch.Tensor, batch: Any) -> tuple[float, int]:
    """(sum of |log_probs − sampling log-probs| over the batch's tokens, their count)."""
    gap = ((log_probs.detach() - batch.values["sampling_logprobs"]).abs() * batch.mask).sum()
    return float(gap), int(batch.mask.sum())


def needs_checkpointing(model: torch.nn.Module, padded_tokens: int, precision: str, mode: str) -> bool:
    """Gradient checkpointing for one forward: ``mode`` on/off, or auto = estimated activations > 1 GB.

    The estimate: padded tokens × layers × hidden × 34 saved values per token and layer (a Llama
    block's attention and MLP inputs/outputs with a 2.7× MLP) × bytes per value.
    """
    if mode in ("on", "off"):
        return mode == "on"
    if mode != "auto":
        raise ValueError(f"OptimConfig.grad_checkpointing={mode!r}; valid: 'auto', 'on', 'off'")
    cfg = getattr(model, "config", None)
    layers, hidden = getattr(cfg, "num_hidden_layers", 0) or 0, getattr(cfg, "hidden_size", 0) or 0
    bytes_per = 2 if precision == "bf16" else 4
    return padded_tokens * layers * hidden * 34 * bytes_per > (1 << 30)


def set_checkpointing(model: Any, on: bool) -> None:
    """Switch HF gradient checkpointing on or off (non-reentrant; no-op when already in that state).

    HF's ``gradient_checkpointing_enable`` also hooks the input embeddings so that their output requires
    grad (needed by reentrant checkpointing only) and ``gradient_checkpointing_disable`` leaves that hook
    in place; a hooked model no longer qualifies for ``LeanLlama``, so every float32 rollout after the first
    update decoded through HF's slower forward. The hook is removed: with non-reentrant checkpointing it
    changes no gradient.
    """
    if bool(getattr(model, "is_gradient_checkpointing", False)) == on:
        return
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "disable_input_require_grads"):
            model.disable_input_require_grads()
    else:
        model.gradient_checkpointing_disable()


class PolicyUpdater:
    """Clipped role-wise updates of one ``Slot`` over its rows.

    ``precision`` is resolved ("bf16" | "fp32", ``envace.runtime.precision``): forwards run under
    bf16 autocast, weights, gradients and optimiser state stay float32.
    """

    def __init__(
        self,
        slot: Slot,
        cfg: OptimConfig,
        seed: int,
        pad_id: int,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
    ):
        self.slot, self.cfg, self.seed, self.pad_id, self.device = slot, cfg, seed, pad_id, device
        self.precision = precision
        self._old_from_forward = False  # old log-probs = the update forward's own (detached) values
        self._measured = False  # prepare measured the sampling/training log-prob gap
        self._gap = [0.0, 0]  # on-the-fly gap sums (single pass): |diff| sum, tokens
        self._gap_on_the_fly = False

    def batches(self, rows: Sequence[TrainRow]) -> list[Any]:
        """Micro-batches over ``rows``: shared-prefix packs, or the legacy padded layout."""
        if self.cfg.share_prefix:
            # our attention runs a pack segment by segment: packing never adds attention pairs there; other
            # attention implementations run the masked pack as one L x L attention (packing can cost more)
            segmented = getattr(self.slot.model.config, "_attn_implementation", None) == GQA_SDPA
            packs = plan_packs(
                rows,
                max_tokens=self.cfg.micro_batch_tokens,
                pair_cost=0.0 if segmented else attention_cost_ratio(self.slot.model),
                tree=self.cfg.share_tails,
            )
            # segment-wise, putting packs side by side saves only Python calls: past segmented_batch_tokens a
            # pack runs alone (no padding, half the activations; SmolLM2 update: peak RSS -260 MB, no slower)
            budget = self.cfg.micro_batch_tokens
            budget = min(budget, segmented_batch_tokens(self.slot.model)) if segmented else budget
            return [collate_packs(rows, group, self.pad_id, self.device) for group in pack_micro_batches(packs, budget)]
        size = max(1, self.cfg.micro_batch_streams)
        out = []
        for i in range(0, len(rows), size):
            index = tuple(range(i, min(i + size, len(rows))))
            out.append(PaddedBatch(index, collate([rows[j] for j in index], self.pad_id, self.device)))
        return out

    def logprobs(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """``[R, P]`` log-probs of a micro-batch's targets under ``model`` (autocast per precision)."""
        with autocast(self.precision, self.device):
            return batch.logprobs(model).float()

    def grad_logprobs(self, batch: Any) -> torch.Tensor:
        """``logprobs`` of the trained model for a backward pass, checkpointed where it pays."""
        model = self.slot.model
        set_checkpointing(
            model, needs_checkpointing(model, batch.padded_tokens, self.precision, self.cfg.grad_checkpointing)
        )
        return self.logprobs(model, batch)

    def mini_batch_size(self, n_rows: int) -> int:
        """Rows per optimiser step: ``mini_batch_streams``, else the step's rows split into ``mini_batches``
        near-equal parts (at least one row each)."""
        if self.cfg.mini_batch_streams > 0:
            return self.cfg.mini_batch_streams
        return max(1, math.ceil(n_rows / max(1, self.cfg.mini_batches)))

    def single_pass(self, rows: Sequence[TrainRow]) -> bool:
        """One epoch, one mini-batch: every forward of the update sees the pre-update weights."""
        return self.cfg.ppo_epochs == 1 and self.mini_batch_size(len(rows)) >= len(rows)

    @torch.no_grad()
    def prepare(self, rows: Sequence[TrainRow]) -> float | None:
        """Set old (and reference) log-probs; returns mean |sampling − current| log-prob when measured.

        No forward runs for old log-probs when the update is a single on-policy pass: they are the
        update forward's own (detached) values, so the ratio is exactly 1. ``logprob_check`` adds a
        no-grad forward measuring the sampling/training log-prob gap before the update.
        """
        if self.cfg.old_logprobs not in ("recompute", "sampling"):
            raise ValueError(f"OptimConfig.old_logprobs={self.cfg.old_logprobs!r}; valid: 'recompute', 'sampling'")
        recompute = self.cfg.old_logprobs == "recompute"
        self._old_from_forward = recompute and self.single_pass(rows)
        measure = self.cfg.logprob_check or (recompute and not self._old_from_forward)
        self._measured = measure
        if not (measure or self.slot.ref is not None) or not rows:
            self._copy_sampling(rows)
            return None
        self.slot.model.eval()
        diffs, n = 0.0, 0
        for batch in self.batches(rows):
            if measure:
                current = self.logprobs(self.slot.model, batch)
                gap, tokens = abs_gap(current, batch)
                diffs, n = diffs + gap, n + tokens
                if recompute and not self._old_from_forward:
                    batch.store(rows, current, "old_logprobs")
            if self.slot.ref is not None:
                batch.store(rows, self.logprobs(self.slot.ref, batch), "ref_logprobs")
        self._copy_sampling(rows)
        return diffs / max(n, 1) if measure else None

    def _copy_sampling(self, rows: Sequence[TrainRow]) -> None:
        if self.cfg.old_logprobs == "sampling":
            for r in rows:
                r.old_logprobs = r.sampling_logprobs.clone()

    def update(self, rows: Sequence[TrainRow], step: int) -> dict[str, float]:
        """``ppo_epochs`` × mini-batches of optimiser steps; returns mean metrics (prefix-free)."""
        stats = UpdateStats()
        if not rows:
            return {}
        release_inference_copy(self.slot.model)  # stale after the first optimiser step; frees its memory now
        self.slot.model.train()
        size = self.mini_batch_size(len(rows))
        self._gap_on_the_fly = self.single_pass(rows) and not self._measured
        self._gap = [0.0, 0]
        try:
            for epoch in range(self.cfg.ppo_epochs):
                order = list(range(len(rows)))
                random.Random(derive_seed(self.seed, step, "minibatch", self.slot.name, epoch)).shuffle(order)
                for start in range(0, len(order), size):
                    self._optimizer_step([rows[i] for i in order[start : start + size]], stats)
        finally:
            set_checkpointing(self.slot.model, False)
            self.slot.model.eval()
        if self._gap[1]:
            stats.add("rollout/logprob_diff", self._gap[0] / self._gap[1])
        return stats.metrics()

    def _losses(self, batch: Any, n_tokens: int, n_rows: int) -> dict[Role, Any]:
        """Each trained role's share of the mini-batch token-mean loss (they sum to the full loss)."""
        log_probs = self.grad_logprobs(batch)
        old = log_probs.detach() if self._old_from_forward else batch.values["old_logprobs"]
        if self._gap_on_the_fly:
            gap, tokens = abs_gap(log_probs, batch)
            self._gap[0] += gap
            self._gap[1] += tokens
        info = {"dp_size": 1, "batch_num_tokens": n_tokens, "global_batch_size": n_rows}
        out = {}
        for role in sorted(self.slot.roles):
            mask = batch.mask & (batch.values["roles"] == int(role))
            if not bool(mask.any()):
                continue
            out[role] = compute_policy_loss(
                log_probs,
                old,
                batch.values["advantages"] * mask,
                mask,
                clip_ratio=self.cfg.clip_ratio,
                kl_coef=self.cfg.kl_coef,
                ref_log_probs=batch.values.get("ref_logprobs"),
                loss_agg_mode=self.cfg.loss_agg_mode,
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
        # per-role tracking sets each .grad itself (``_apply_role_grads``)
        grads = contextlib.nullcontext() if self.cfg.track_role_grad_norms else flat_gradients(model)
        with grads:
            self._accumulate(rows, n_tokens, role_grads, acc)
        for key, value in acc.items():
            stats.add(key, value)
        if role_grads:
            self._apply_role_grads(role_grads, stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_clip)
        stats.add("grad_norm", float(grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)  # free the gradients (one model's worth) before the next rollout

    def _accumulate(
        self, rows: list[TrainRow], n_tokens: int, role_grads: dict[Role, list[torch.Tensor]], acc: dict[str, float]
    ) -> None:
        """Backward over every micro-batch of ``rows``, summing the loss metrics into ``acc``."""
        for batch in self.batches(rows):
            acc["update/encoded_tokens"] = acc.get("update/encoded_tokens", 0.0) + batch.encoded_tokens
            losses = self._losses(batch, n_tokens, len(rows))
            if not losses:
                continue
            self._backward(losses, role_grads)
            for role, lo in losses.items():  # micro-batch losses are partial sums of the mini-batch mean
                tag = role.name.lower()
                for key, value in (
                    (f"loss/{tag}", lo.loss),
                    (f"tokens_in_loss/{tag}", lo.n_tokens),
                    ("loss", lo.loss),
                    ("pg_loss", lo.pg_loss),
                    ("kl", lo.kl),
                    ("clipfrac", lo.clipfrac * lo.n_tokens / n_tokens),
                ):
                    acc[key] = acc.get(key, 0.0) + float(value.detach() if torch.is_tensor(value) else value)

    def _apply_role_grads(self, role_grads: dict[Role, list[torch.Tensor]], stats: UpdateStats) -> None:
        params = [p for p in self.slot.model.parameters() if p.requires_grad]
        for role, grads in role_grads.items():
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            stats.add(f"grad_norm/{role.name.lower()}", float(norm))
        for j, p in enumerate(params):
            p.grad = sum(grads[j] for grads in role_grads.values())
