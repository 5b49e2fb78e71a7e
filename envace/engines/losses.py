"""The policy loss shared by both roles (docs/method.md §8), in plain torch, equal to verl's ``core_algos``.

What it computes, per generated token t of output y with advantage A(y) (constant over y):

    ρ_t = exp(log π_θ(t) − log π_old(t))    (the log-ratio clamped to ±20 first)
    ℓ_t = max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high))          (PPO clip, ε = 0.2)
          and, for A < 0, min(ℓ_t, −A·c), c = 3 (dual clip; inert unless ρ > 3)
    L   = agg(ℓ) + β · agg(KL_t),   KL_t = low_var_kl = e^{r} − r − 1,   r = log π_ref − log π_θ

``agg`` is token-mean by default (every generated token of the batch weighs the same, ACT and
REHEARSE alike). Entropy bonus is 0 (docs/method.md §8).

These are the formulas of verl 0.9.1's "vanilla" policy loss, ``agg_loss`` and ``kl_penalty`` (the GPU
engine trains with those), written here so that CPU training never imports verl (importing it loads Ray
and prints warnings). ``tests/unit/engines/test_losses.py`` checks the two agree on random batches (bitwise for
the local trainer's call, in fp32), and ``tests/integration/test_cpu_training_no_verl.py`` that a CPU
training step loads neither verl nor Ray.

Deviation: verl's token-mean divides by the number of masked tokens and returns NaN for a batch with
none; without ``global_batch_info`` we return an exact 0 (still attached to the graph) instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from envace.engines.update import KL_TYPE, LOSS_AGG_MODE

DEFAULT_CLIP_RATIO = 0.2
LOG_RATIO_LIMIT = 20.0  # log-ratios are clamped to ±this before exp, so that e^x never overflows
KL_LIMIT = 10.0  # low_var_kl values are clamped to ±this
MEAN_EPS = 1e-8  # added to token counts in means, so that an empty mask gives 0, not NaN
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")
_KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# name+ (e.g. "k3+"): the value of the named estimator, the gradient of k2 (unbiased for the KL's gradient)
KL_TYPES = _KL_ESTIMATORS + tuple(f"{name}+" for name in _KL_ESTIMATORS)
BATCH_INFO_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


@dataclass(frozen=True)
class LossOutput:
    """Scalar loss pieces (tensors keep their graph) and detached diagnostics."""

    loss: torch.Tensor  # () pg_loss + kl_coef * kl — call .backward() on this
    pg_loss: torch.Tensor  # () aggregated clipped policy-gradient loss
    kl: torch.Tensor  # () aggregated KL to the reference policy (0 without one)
    clipfrac: float  # share of masked tokens where the clip bound was active
    clipfrac_lower: float  # share where the dual-clip bound (A < 0, ratio > c) was active
    ppo_kl: float  # mean (log π_old − log π_θ) over masked tokens
    n_tokens: int  # masked (generated) tokens in this batch

    def metrics(self, prefix: str = "actor/") -> dict[str, float]:
        """Plain floats for logging."""
        return {
            f"{prefix}loss": float(self.loss.detach()),
            f"{prefix}pg_loss": float(self.pg_loss.detach()),
            f"{prefix}kl_loss": float(self.kl.detach()),
            f"{prefix}pg_clipfrac": self.clipfrac,
            f"{prefix}pg_clipfrac_lower": self.clipfrac_lower,
            f"{prefix}ppo_kl": self.ppo_kl,
            f"{prefix}n_tokens": float(self.n_tokens),
        }


@dataclass(frozen=True)
class BatchInfo:
    """How a micro-batch's loss is normalised over the global batch it belongs to (None: this batch alone).

    ``dp_size`` data-parallel ranks; ``batch_num_tokens`` masked tokens and ``global_batch_size`` rows of
    the global batch (token-mean and the seq-mean modes divide by them); ``loss_scale_factor`` the divisor
    of seq-mean-token-sum-norm (None: the response length).
    """

    dp_size: int = 1
    batch_num_tokens: int | None = None
    global_batch_size: int | None = None
    loss_scale_factor: int | None = None

    @classmethod
    def parse(cls, info: Mapping[str, Any] | None) -> BatchInfo:
        """From the trainer's ``{key: int}`` mapping; unknown keys raise listing the valid ones."""
        for key in info or {}:
            if key not in BATCH_INFO_KEYS:
                raise ValueError(f"global_batch_info key {key!r} is not one of {', '.join(BATCH_INFO_KEYS)}")
        return cls(**{k: int(v) for k, v in (info or {}).items() if v is not None})

    def required(self, name: str, mode: str) -> int | None:
        """``name``'s value; when missing, None on one rank (use this batch's own count), an error on several."""
        value = getattr(self, name)
        if value is None and self.dp_size > 1:
            raise ValueError(f"loss_agg_mode {mode!r} with dp_size={self.dp_size} needs global_batch_info[{name!r}]")
        return value


def _check_settings(loss_agg_mode: str, kl_type: str, clip_ratio_c: float) -> None:
    """Refuse an unknown aggregation mode or KL estimator and a dual-clip bound c ≤ 1."""
    if loss_agg_mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode {loss_agg_mode!r} is not one of {', '.join(AGG_MODES)}")
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type {kl_type!r} is not one of {', '.join(KL_TYPES)}")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must exceed 1 (the dual clip bounds −A·ρ by −A·c for A < 0)")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where the boolean ``mask`` is set (values elsewhere, NaN included, are ignored)."""
    kept = torch.where(mask, values, 0.0)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where the boolean ``mask`` is set; 0 for an empty mask."""
    return masked_sum(values, mask) / (mask.sum() + MEAN_EPS)


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, info: BatchInfo) -> torch.Tensor:
    """One scalar from (B, L) per-token ``values`` under the boolean ``mask``, by ``mode`` (one of AGG_MODES).

    token-mean: sum / tokens; token-sum: sum; seq-mean-*: each row's token sum (token-mean: its sum / its
    tokens) averaged over the rows with tokens, -norm also divided by ``loss_scale_factor``. Every mode is
    multiplied by ``dp_size``: data-parallel ranks average their gradients, which undoes it.
    """
    if mode == "token-mean":
        tokens = info.required("batch_num_tokens", mode)
        return masked_sum(values, mask) / (mask.sum() if tokens is None else tokens) * info.dp_size
    if mode == "token-sum":
        return masked_sum(values, mask) * info.dp_size
    row_tokens = mask.sum(-1)
    row_losses = masked_sum(values, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        row_losses = row_losses / (row_tokens + MEAN_EPS)
    # rows are averaged in at least fp32 (bf16 row sums are widened first, as verl does)
    row_losses = row_losses.to(torch.promote_types(row_losses.dtype, torch.float32))
    has_tokens = row_tokens > 0
    rows = info.required("global_batch_size", mode)
    loss = masked_sum(row_losses, has_tokens) / (has_tokens.sum() if rows is None else rows) * info.dp_size
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (mask.shape[-1] if info.loss_scale_factor is None else info.loss_scale_factor)
    return loss


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from the sampled tokens' log-probs (kl_type: one of KL_TYPES)."""
    name = kl_type.removesuffix("+")
    diff = log_probs - ref_log_probs
    if name in ("kl", "k1"):
        value = diff
    elif name == "abs":
        value = diff.abs()
    elif name in ("mse", "k2"):
        return 0.5 * diff.square()
    else:  # low_var_kl / k3: e^r − r − 1 with r = log π_ref − log π_θ, both r and the result clamped
        r = (ref_log_probs - log_probs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        value = (r.exp() - r - 1).clamp(-KL_LIMIT, KL_LIMIT)
    if not kl_type.endswith("+"):
        return value
    k2 = 0.5 * diff.square()
    return k2 - k2.detach() + value.detach()  # forward: the named estimate; backward: k2's gradient


@dataclass(frozen=True)
class _ClippedTokens:
    """Per-token pieces of the clipped objective (all (B, L))."""

    log_ratio: torch.Tensor  # log π_θ − log π_old, clamped
    losses: torch.Tensor  # ℓ_t
    clipped: torch.Tensor  # bool: the PPO clip bound was active
    dual_clipped: torch.Tensor  # bool: A < 0 and the dual-clip bound −A·c was active


def _clipped_token_losses(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, low: float, high: float, c: float
) -> _ClippedTokens:
    """ℓ_t for every token (masked or not) with the flags the clip metrics count."""
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    plain = -advantages * ratio
    bounded = -advantages * ratio.clamp(1 - low, 1 + high)
    ppo = torch.maximum(plain, bounded)
    floor = -advantages * c
    negative = advantages < 0
    return _ClippedTokens(
        log_ratio=log_ratio,
        losses=torch.where(negative, torch.minimum(ppo, floor), ppo),
        clipped=bounded > plain,
        dual_clipped=(ppo > floor) & negative,
    )


def _check_shapes(log_probs: torch.Tensor, **others: torch.Tensor | None) -> None:
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be (batch, response_length), got shape {tuple(log_probs.shape)}")
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != log_probs.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, log_probs {tuple(log_probs.shape)}; they "
                "must match (broadcast per-output advantages with token_advantages)"
            )


def _empty_output(log_probs: torch.Tensor) -> LossOutput:
    zero = (log_probs * 0.0).sum()  # exact 0 that keeps the graph (backward gives zero grads)
    return LossOutput(
        loss=zero, pg_loss=zero, kl=zero.detach(), clipfrac=0.0, clipfrac_lower=0.0, ppo_kl=0.0, n_tokens=0
    )


def compute_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio: float = DEFAULT_CLIP_RATIO,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    kl_coef: float = 0.0,
    ref_log_probs: torch.Tensor | None = None,
    kl_type: str = KL_TYPE,
    loss_agg_mode: str = LOSS_AGG_MODE,
    global_batch_info: Mapping[str, Any] | None = None,
) -> LossOutput:
    """Clipped PPO/GRPO loss with optional KL to a reference policy (verl's formulas, see the module doc).

    Args:
        log_probs: (B, L) log π_θ of the sampled tokens (requires grad).
        old_log_probs: (B, L) log-probs of the policy that sampled (detached).
        advantages: (B, L) per-token advantages (0 off-mask), e.g. from ``token_advantages``.
        response_mask: (B, L) 1/True on generated tokens; only these enter the loss.
        clip_ratio: ε; ``clip_ratio_low``/``clip_ratio_high`` override each side (default ε).
        kl_coef: β; > 0 requires ``ref_log_probs`` (B, L). KL is reported whenever refs are given.
        clip_ratio_c: the dual-clip bound c (> 1) for tokens with A < 0.
        kl_type: KL estimator, one of ``KL_TYPES`` (verl's ``kl_penalty`` names; default ``low_var_kl``).
        loss_agg_mode: one of ``AGG_MODES`` (verl's ``agg_loss`` modes; default ``token-mean``).
        global_batch_info: {dp_size, batch_num_tokens, global_batch_size, loss_scale_factor} ints (``BatchInfo``),
            for normalising over a global batch split into micro-batches; None = this batch alone.
    """
    _check_shapes(
        log_probs,
        old_log_probs=old_log_probs,
        advantages=advantages,
        response_mask=response_mask,
        ref_log_probs=ref_log_probs,
    )
    if kl_coef > 0 and ref_log_probs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_log_probs (reference-policy log-probs); pass them or set 0")
    _check_settings(loss_agg_mode, kl_type, clip_ratio_c)
    info = BatchInfo.parse(global_batch_info)
    mask = response_mask.to(torch.bool)
    n_tokens = int(mask.sum())
    if n_tokens == 0 and not global_batch_info:
        return _empty_output(log_probs)
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    tokens = _clipped_token_losses(log_probs, old_log_probs.detach(), advantages.detach(), low, high, clip_ratio_c)
    pg_loss = aggregate(tokens.losses, mask, loss_agg_mode, info)
    if ref_log_probs is not None:
        kl = aggregate(kl_estimate(log_probs, ref_log_probs.detach(), kl_type), mask, loss_agg_mode, info)
    else:
        kl = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return LossOutput(
        loss=pg_loss + kl_coef * kl,
        pg_loss=pg_loss,
        kl=kl,
        clipfrac=float(masked_mean(tokens.clipped.float(), mask)),
        clipfrac_lower=float(masked_mean(tokens.dual_clipped.float(), mask)),
        ppo_kl=float(masked_mean(-tokens.log_ratio.detach(), mask)),
        n_tokens=n_tokens,
    )
