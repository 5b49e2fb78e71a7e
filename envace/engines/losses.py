"""The policy loss shared by both roles (SPEC §3), built on verl's ``core_algos`` (not re-implemented).

What it computes, per generated token t of output y with advantage A(y) (constant over y):

    ρ_t = exp(log π_θ(t) − log π_old(t))
    ℓ_t = max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high))          (PPO clip, ε = 0.2)
          and, for A < 0, min(ℓ_t, −A·c), c = 3 (verl's dual clip; inert unless ρ > 3)
    L   = agg(ℓ) + β · agg(KL_t),   KL_t = low_var_kl = e^{r} − r − 1,   r = log π_ref − log π_θ

``agg`` is token-mean by default (every generated token of the batch weighs the same, ACT and
REHEARSE alike). Entropy bonus is 0 (SPEC). Pieces used from verl 0.9.1:
``get_policy_loss_fn("vanilla")`` for ℓ and its clip metrics, ``agg_loss`` for aggregation,
``kl_penalty`` for the KL estimator; the sum pg + β·KL mirrors verl's own actor loss.

verl's policy-loss functions take a config object. Its ``ActorConfig`` lives in ``verl.workers.config``,
and importing anything under ``verl`` loads ``verl.protocol`` and with it ray, so no verl config class
is avoidable or cheaper than another. We pass an OmegaConf ``DictConfig`` (a type verl's
``PolicyLossFn`` signature accepts; omegaconf itself imports neither hydra nor ray) holding exactly
what the vanilla loss reads: ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``
and ``global_batch_info``. verl (and thus ray) is imported lazily on the first call, so importing this
module stays light; ``tests/unit/test_core_boundary.py`` checks the import side.

Deviation: verl's token-mean divides by the number of masked tokens and returns NaN for a batch with
none; without ``global_batch_info`` we return an exact 0 (still attached to the graph) instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_CLIP_RATIO = 0.2
DEFAULT_KL_TYPE = "low_var_kl"


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


def _verl_loss_config(
    clip_ratio: float,
    clip_ratio_low: float | None,
    clip_ratio_high: float | None,
    clip_ratio_c: float,
    global_batch_info: Mapping[str, Any] | None,
) -> Any:
    """The minimal config verl's vanilla policy loss reads, as an OmegaConf DictConfig."""
    from omegaconf import OmegaConf

    info = {k: (None if v is None else int(v)) for k, v in (global_batch_info or {}).items()}
    return OmegaConf.create(
        {
            "clip_ratio": float(clip_ratio),
            "clip_ratio_low": None if clip_ratio_low is None else float(clip_ratio_low),
            "clip_ratio_high": None if clip_ratio_high is None else float(clip_ratio_high),
            "clip_ratio_c": float(clip_ratio_c),
            "global_batch_info": info,
        }
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
    kl_type: str = DEFAULT_KL_TYPE,
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> LossOutput:
    """Clipped PPO/GRPO loss with optional KL to a reference policy (verl's functions underneath).

    Args:
        log_probs: (B, L) log π_θ of the sampled tokens (requires grad).
        old_log_probs: (B, L) log-probs of the policy that sampled (detached).
        advantages: (B, L) per-token advantages (0 off-mask), e.g. from ``token_advantages``.
        response_mask: (B, L) 1/True on generated tokens; only these enter the loss.
        clip_ratio: ε; ``clip_ratio_low``/``clip_ratio_high`` override each side (default ε).
        kl_coef: β; > 0 requires ``ref_log_probs`` (B, L). KL is reported whenever refs are given.
        kl_type: verl ``kl_penalty`` estimator name (default ``low_var_kl``).
        loss_agg_mode: verl ``agg_loss`` mode (default ``token-mean``).
        global_batch_info: verl's {dp_size, batch_num_tokens, global_batch_size, loss_scale_factor} ints,
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
    mask = response_mask.to(torch.bool)
    n_tokens = int(mask.sum())
    if n_tokens == 0 and not global_batch_info:
        return _empty_output(log_probs)
    from verl.trainer.ppo import core_algos

    config = _verl_loss_config(clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, global_batch_info)
    pg_loss, pg_metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old_log_probs.detach(),
        log_prob=log_probs,
        advantages=advantages.detach(),
        response_mask=mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
    )
    if ref_log_probs is not None:
        kl_mat = core_algos.kl_penalty(log_probs, ref_log_probs.detach(), kl_penalty=kl_type)
        kl = core_algos.agg_loss(kl_mat, mask, loss_agg_mode, **config.global_batch_info)
    else:
        kl = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return LossOutput(
        loss=pg_loss + kl_coef * kl,
        pg_loss=pg_loss,
        kl=kl,
        clipfrac=float(pg_metrics["actor/pg_clipfrac"]),
        clipfrac_lower=float(pg_metrics["actor/pg_clipfrac_lower"]),
        ppo_kl=float(pg_metrics["actor/ppo_kl"]),
        n_tokens=n_tokens,
    )
