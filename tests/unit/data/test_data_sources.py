"""Data sources register by name (``envace.envs.data_sources``); the shared ``Registry`` lists known names on a miss."""

from __future__ import annotations

import pytest

from envace.core.registry import Registry, UnknownName
from envace.engines.verl.reward_sources import make_executor
from envace.envs.data_sources import DATA_SOURCES, data_source


def test_registry_register_get_and_errors() -> None:
    reg: Registry[int] = Registry("thing")
    reg.register("a", 1)
    reg.register("a", 1)  # the same item again: no-op
    assert reg.get("a") == 1 and "a" in reg and reg.names() == ["a"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", 2)
    with pytest.raises(UnknownName, match=r"unknown thing 'b'; known: a") as info:
        reg.get("b")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_builtin_sources_and_executability() -> None:
    assert {"toolworld", "cm2"} <= set(DATA_SOURCES.names())
    assert data_source("toolworld").executor_from_row is not None
    assert data_source("cm2").executor_from_row is None
    with pytest.raises(ValueError, match=r"data source 'cm2' has none \(executable: \['toolworld'\]\)"):
        make_executor("cm2", "{}")
    with pytest.raises(KeyError, match="unknown data source 'nope'"):
        data_source("nope")
