"""Fixtures shared by the unit tests that use a real MLflow store."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store per module (creating it costs seconds); tests use their own experiments."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def experiment(request) -> str:
    """An experiment name of the test's own."""
    return f"test-{request.node.name}"
