"""The reward contract every engine and judge shares: a ``RewardFn`` scores one finished trajectory and
returns a ``RewardOutcome`` (reward, status, info)."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from envace.core.records import EpisodeSpec, Trajectory, TrajectoryStatus


class RewardOutcome(NamedTuple):
    reward: float
    status: TrajectoryStatus
    info: dict[str, Any]


@runtime_checkable
class RewardFn(Protocol):
    """Scores one finished trajectory: ``(spec, trajectory) -> (reward, status, info)``.

    Return ``TrajectoryStatus.JUDGE_FAILED`` when the reward could not be computed (the engine then
    excludes the trajectory from the loss and counts it); ``reward`` is ignored in that case.
    """

    def __call__(self, spec: EpisodeSpec, trajectory: Trajectory) -> RewardOutcome | tuple: ...
