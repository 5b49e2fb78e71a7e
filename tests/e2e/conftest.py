"""End-to-end fixtures (helpers live in e2e_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import make_project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """This project copied into a fresh git repo with one commit."""
    return make_project(tmp_path)
