"""Training engines behind one interface (``get_engine(name)``): ``local`` (HF + torch) and plug-ins (verl).

Importing this package is light: engines are imported on first ``get_engine`` call.
"""

from envace.core.curves import CURVE_KEYS, training_curves
from envace.engines.base import (
    VARIANTS,
    Engine,
    EpisodeSpec,
    GoldStep,
    RewardFn,
    RewardOutcome,
    StepCallback,
    TrainResult,
    Variant,
    available_engines,
    episode_spec_from_task,
    executor_factory_for,
    get_engine,
    get_variant,
    register_engine,
    to_episode_spec,
    toolworld_verifiable_reward,
)

__all__ = [
    "CURVE_KEYS",
    "VARIANTS",
    "Engine",
    "EpisodeSpec",
    "GoldStep",
    "RewardFn",
    "RewardOutcome",
    "StepCallback",
    "TrainResult",
    "Variant",
    "available_engines",
    "episode_spec_from_task",
    "executor_factory_for",
    "get_engine",
    "get_variant",
    "register_engine",
    "to_episode_spec",
    "toolworld_verifiable_reward",
    "training_curves",
]
