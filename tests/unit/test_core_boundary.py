"""envace/core stays pure: importing any of its modules loads no orchestration / tracking / config stack.

Each check runs in a fresh interpreter so that modules imported by other tests cannot hide a leak.
verl is allowed in core, but only lazily: importing the ``verl`` package loads ``verl.protocol`` and
with it ray, so a top-level ``import verl…`` in a core module fails the ray check here.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import envace.core

FORBIDDEN = ("prefect", "mlflow", "hydra", "dvc", "ray")
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
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"importing {modules} failed:\n{proc.stderr[-3000:]}"
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_core_modules_exist() -> None:
    modules = core_modules()
    for expected in ("envace.core.records", "envace.core.wire", "envace.core.advantages", "envace.core.losses"):
        assert expected in modules


def test_core_imports_no_orchestration_stack() -> None:
    modules = core_modules()
    loaded = loaded_top_level_packages(modules)
    leaked = sorted(loaded.intersection(FORBIDDEN))
    hint = ""
    if "verl" in loaded:
        hint = " (verl is loaded: import it lazily inside functions; its package import pulls ray)"
    assert not leaked, f"importing envace.core modules {modules} loaded {leaked}{hint}"


def test_wire_and_algorithms_import_verl_lazily() -> None:
    loaded = loaded_top_level_packages(["envace.core.wire", "envace.core.advantages", "envace.core.losses"])
    assert "verl" not in loaded and "omegaconf" not in loaded
