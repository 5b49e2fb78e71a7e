"""The rollout budget: per-role sampling temperatures and the turn and token limits of one trajectory.

Every sampler of act/rehearse trajectories reads the same eight values: the local engine's rollout
(``envace.engines.local.config.RolloutConfig``), verl's agent loop (``envace.engines.verl.settings.LoopSettings``)
and the config schema's ``rollout`` section (``envace.config.schema.RolloutSection``). They are declared here
once; the first two subclass ``RolloutBudget`` and the schema builds its section from ``BUDGET_FIELDS``.

The defaults equal ``conf/rollout/default.yaml`` (the composed config always sets every one of them), and
the range rules live in ``__post_init__`` only: ``envace.config.load.validate_config`` builds a budget from the
composed config, so a bad value fails there with the same message the engines would give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from envace.core.records import Role

# counts that must be positive: a turn needs a step, a generation a token, a stream room for one
_AT_LEAST_ONE = ("max_steps_per_turn", "max_act_tokens", "max_rehearse_tokens", "max_stream_tokens")


@dataclass(frozen=True)
class RolloutBudget:
    """Temperatures, limits and the required-items rule shared by every trajectory sampler."""

    act_temperature: float = 1.0
    rehearse_temperature: float = 1.0
    max_steps_per_turn: int = 4  # ACT generations per user turn before the turn is cut
    max_act_tokens: int = 64  # new tokens per ACT generation
    max_rehearse_tokens: int = 64  # new tokens per REHEARSE generation
    max_stream_tokens: int = 2048  # length of one role's stream (prompt included); past it the episode ends
    # conversation shown per REHEARSE call message (envace.core.rehearse_context; ~4 characters a token)
    rehearse_context_tokens: int = 512
    # end a trajectory after a user turn whose required checklist item failed
    enforce_required_items: bool = True

    def __post_init__(self) -> None:
        for name in ("act_temperature", "rehearse_temperature"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"rollout.{name}={value}: must be a finite number >= 0 (0 = greedy)")
        for name in _AT_LEAST_ONE:
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name}={getattr(self, name)}: must be >= 1")
        if self.rehearse_context_tokens < 0:
            raise ValueError(
                f"rollout.rehearse_context_tokens={self.rehearse_context_tokens}: must be >= 0 "
                "(0 = no conversation in REHEARSE call messages)"
            )

    def temperature(self, role: Role) -> float:
        return self.act_temperature if role is Role.ACT else self.rehearse_temperature

    def max_new_tokens(self, role: Role) -> int:
        return self.max_act_tokens if role is Role.ACT else self.max_rehearse_tokens


BUDGET_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RolloutBudget))


def budget_values(obj: Any) -> dict[str, Any]:
    """The budget's fields read from ``obj`` (a mapping such as a config node, or any object with those
    attributes), in declaration order."""
    if isinstance(obj, Mapping):
        return {name: obj[name] for name in BUDGET_FIELDS}
    return {name: getattr(obj, name) for name in BUDGET_FIELDS}
