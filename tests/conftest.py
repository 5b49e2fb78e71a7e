"""Shared test set-up: telemetry off, one torch thread, the repo root, stage paths under a temp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envace.utils.telemetry import telemetry_off

telemetry_off()
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """2 shared cores: never let a test spread over both."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


def tmp_paths_overrides(root: Path) -> list[str]:
    """Hydra overrides that move every stage path under ``root``."""
    from envace.config.schema import PathsConfig

    return [f"paths.{name}={root / name}" for name in PathsConfig.__dataclass_fields__]


@pytest.fixture(scope="session")
def paths_under():
    """``paths_under(root)`` -> overrides moving every stage path under ``root``."""
    return tmp_paths_overrides
