"""envace/core stays pure: importing any of its modules loads no engine, orchestration, tracking or config
stack — no verl, ray, prefect, mlflow, hydra, dvc (and no torch.distributed beyond what torch itself loads).

Each check runs in a fresh interpreter so that modules imported by other tests cannot hide a leak. The
pieces built on verl (the verl estimator signature) live in envace/engines/verl;
tests/unit/test_import_graph.py checks statically that no core module imports verl even inside a function.
"""

from __future__ import annotations

import pkgutil

from fresh_python import run_fresh

import envace.core

FORBIDDEN = ("prefect", "mlflow", "hydra", "dvc", "ray", "verl")

_PROBE = """
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))
"""


def core_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(envace.core.__path__, prefix="envace.core."))


def loaded_top_level_packages(modules: list[str]) -> set[str]:
    """Import ``modules`` in a fresh interpreter; return the top-level names in its sys.modules."""
    loaded, _ = run_fresh(_PROBE.format(modules=modules), timeout=120, what=f"importing {modules}")
    return set(loaded)


def test_core_modules_exist() -> None:
    modules = core_modules()
    for expected in ("envace.core.records", "envace.core.wire", "envace.core.advantages"):
        assert expected in modules


def test_core_imports_no_orchestration_stack() -> None:
    modules = core_modules()
    loaded = loaded_top_level_packages(modules)
    leaked = sorted(loaded.intersection(FORBIDDEN))
    assert not leaked, f"importing envace.core modules {modules} loaded {leaked}"


def test_wire_and_algorithms_load_no_config_library() -> None:
    loaded = loaded_top_level_packages(["envace.core.wire", "envace.core.advantages"])
    assert "verl" not in loaded and "omegaconf" not in loaded
