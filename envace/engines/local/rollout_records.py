"""The records a local rollout takes and gives: who answers the tool calls (``ResponseSource``) and the
played trajectories with their cost counters (``RolloutBatch``); ``envace.engines.local.rollout`` plays them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace.core.env import Executor
from envace.core.records import Role, Trajectory
from envace.engines.base import EpisodeSpec

ExecutorFactory = Callable[[EpisodeSpec], Executor]


@dataclass(frozen=True)
class ResponseSource:
    """Who answers tool calls: a model playing REHEARSE (trainable or a frozen simulator) or executors."""

    model: Any = None
    trainable: bool = True
    executor_factory: ExecutorFactory | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.executor_factory is None):
            raise ValueError("ResponseSource: give exactly one of a REHEARSE model or an executor factory")


@dataclass(frozen=True)
class RolloutBatch:
    """The trajectories of one rollout (rewards not yet assigned) and its cost counters."""

    trajectories: tuple[Trajectory, ...]
    seconds: float
    generated_tokens: dict[Role, int]
    fed_tokens: int
    forwards: int
