"""Training engines behind one interface (``get_engine(name)``): ``local`` (HF + torch) and plug-ins (verl).

Importing this package is light: engines are imported on first ``get_engine`` call. It also gathers what
a caller of an engine needs from the floors below (specs: ``envace.data.specs``; the reward contract:
``envace.core.reward``; the tool world's verifiable reward: ``envace.envs.toolworld.reward``).
"""

from envace.core.curves import CURVE_KEYS, training_curves
from envace.core.records import EpisodeSpec, GoldStep
from envace.core.reward import RewardFn, RewardOutcome
from envace.data.specs import episode_spec_from_task, executor_factory_for, to_episode_spec
from envace.engines.base import (
    VARIANTS,
    Engine,
    StepCallback,
    TrainResult,
    Variant,
    available_engines,
    get_engine,
    get_variant,
    register_engine,
)
from envace.envs.toolworld.reward import toolworld_verifiable_reward

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
