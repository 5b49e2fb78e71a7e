"""The local engine (HF transformers + torch; CPU or one GPU): rollouts, role-wise GRPO, SFT, checkpoints."""

from envace.core.seeds import derive_seed
from envace.engines.local.config import (
    LocalEngineConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
)
from envace.engines.local.engine import LocalEngine, step_examples
from envace.engines.local.rollout import RolloutRunner
from envace.engines.local.rollout_records import ResponseSource, RolloutBatch
from envace.runtime.decode import DecodeGuide, OutputKey

__all__ = [
    "DecodeGuide",
    "LocalEngine",
    "LocalEngineConfig",
    "OptimConfig",
    "OutputKey",
    "ResponseSource",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutRunner",
    "SFTConfig",
    "derive_seed",
    "step_examples",
]
