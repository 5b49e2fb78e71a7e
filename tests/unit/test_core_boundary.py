"""envace/core stays pure: importing any of its modules loads no engine, orchestration, tracking or config
stack — no verl, ray, prefect, mlflow, hydra, dvc (and no torch.distributed beyond what torch itself loads).

Each check runs in a fresh interpreter so that modules imported by other tests cannot hide a leak. The
pieces built on verl (the verl estimator signature) live in envace/engines/verl;
tests/unit/test_import_graph.py checks statically that no core module imports verl even inside a function.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import envace.core

FORBIDDEN = ("prefect", "mlflow", "hydra", "dvc", "ray", "verl")
REPO_ROOT = Path(__file__).resolve().parents[2]

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
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(modules=modules)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"importing {modules} failed:\n{proc.stderr[-3000:]}"
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


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
