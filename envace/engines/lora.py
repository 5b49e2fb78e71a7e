"""LoRA as an option of every engine: the typed ``LoraSpec`` built once from ``algo.lora_*``.

``algo.lora_rank`` = 0 (the default, in ``conf/config.yaml``) is full fine-tuning. r > 0 freezes the
base weights and trains rank-r adapters ``W + (lora_alpha / r) · B A`` on the linear layers named in
``algo.lora_target_modules`` (module-name suffixes, peft's matching), with ``A`` random and ``B`` zero
at the start so that the adapted model starts as the base model. Convention: ``lora_alpha`` is an
absolute value (default 16, verl's default), not a multiple of the rank — raising the rank at fixed
alpha lowers the scale alpha / r. The local engine applies it with peft
(``envace.engines.local.lora``); the verl engine maps it to ``actor_rollout_ref.model.lora_*``
(``envace.engines.verl.config_builder``). This module is pure (no peft, no torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoraSpec:
    """Rank-``rank`` adapters scaled by ``alpha / rank`` on ``target_modules``; ``dropout`` on their input."""

    rank: int
    alpha: int
    target_modules: tuple[str, ...]
    dropout: float

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"algo.lora_rank={self.rank}: a LoRA spec needs rank >= 1 (0 = full fine-tuning, no spec)")
        if self.alpha <= 0:
            raise ValueError(f"algo.lora_alpha={self.alpha}: must be > 0 (the adapter scale is alpha / rank)")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(
                f"algo.lora_target_modules={list(self.target_modules)}: give the names of the linear "
                "layers to adapt, e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"algo.lora_dropout={self.dropout}: must be in [0, 1)")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_spec(algo: Any) -> LoraSpec | None:
    """The ``LoraSpec`` of an ``algo`` node (the typed ``AlgoConfig``, a DictConfig or a plain mapping); None for
    full fine-tuning (rank 0)."""
    if not isinstance(algo, Mapping):
        algo = {
            name: getattr(algo, name) for name in ("lora_rank", "lora_alpha", "lora_target_modules", "lora_dropout")
        }
    rank = int(algo["lora_rank"])
    if rank < 0:
        raise ValueError(f"algo.lora_rank={rank}: must be >= 0 (0 = full fine-tuning)")
    if rank == 0:
        return None
    return LoraSpec(
        rank=rank,
        alpha=int(algo["lora_alpha"]),
        target_modules=tuple(algo["lora_target_modules"]),
        dropout=float(algo["lora_dropout"]),
    )
