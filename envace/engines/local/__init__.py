"""The local engine (HF transformers + torch; CPU or one GPU): rollouts, role-wise GRPO, SFT, checkpoints.

The decoding guide and output keys live in ``envace.runtime.decode``, seeds in ``envace.core.seeds``.
"""

from envace.engines.local.config import (
    LocalEngineConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
)
from envace.engines.local.engine import LocalEngine, step_examples
from envace.engines.local.rollout import RolloutRunner
from envace.engines.local.rollout_records import ResponseSource, RolloutBatch

__all__ = [
    "LocalEngine",
    "LocalEngineConfig",
    "OptimConfig",
    "ResponseSource",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutRunner",
    "SFTConfig",
    "step_examples",
]
