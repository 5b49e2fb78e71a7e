"""Training engines behind one interface (``get_engine(name)``): ``local`` (HF + torch) and plug-ins (verl).

Importing this package is light: engines are imported on first ``get_engine`` call. What a caller of an
engine needs besides the interface is imported from its own home: episode specs from ``envace.data.specs``,
the reward contract from ``envace.core.reward``, the tool world's verifiable reward from
``envace.envs.toolworld.reward`` and the training curves from ``envace.core.curves``.
"""

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

__all__ = [
    "VARIANTS",
    "Engine",
    "StepCallback",
    "TrainResult",
    "Variant",
    "available_engines",
    "get_engine",
    "get_variant",
    "register_engine",
]
