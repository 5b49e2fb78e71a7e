"""The registry of tool-world domains: each pairs a backend (tools + seed state) with its scenarios.

``get_domain(name)`` raises an error listing the valid names; ``get_tool(name)`` finds a tool in any
domain. Domain order is fixed (it drives round-robin task allocation, so it is part of determinism).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from envace.envs.toolworld.domains import bank, calendar, files, shop, todo
from envace.envs.toolworld.planning import Scenario
from envace.envs.toolworld.scenarios import bank as bank_scenarios
from envace.envs.toolworld.scenarios import calendar as calendar_scenarios
from envace.envs.toolworld.scenarios import files as files_scenarios
from envace.envs.toolworld.scenarios import shop as shop_scenarios
from envace.envs.toolworld.scenarios import todo as todo_scenarios
from envace.envs.toolworld.schema import ToolSpec


@dataclass(frozen=True)
class Domain:
    name: str
    description: str
    tools: tuple[ToolSpec, ...]
    seed_state: Callable[[random.Random], dict[str, Any]]
    scenarios: tuple[Scenario, ...]

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    def scenario(self, name: str) -> Scenario:
        for found in self.scenarios:
            if found.name == name:
                return found
        raise KeyError(f"domain {self.name!r} has no scenario {name!r}; valid: {[s.name for s in self.scenarios]}")


def _domain(backend: ModuleType, scenarios: ModuleType) -> Domain:
    return Domain(backend.NAME, backend.DESCRIPTION, backend.TOOLS, backend.seed_state, scenarios.SCENARIOS)


DOMAINS: dict[str, Domain] = {
    d.name: d
    for d in (
        _domain(bank, bank_scenarios),
        _domain(calendar, calendar_scenarios),
        _domain(shop, shop_scenarios),
        _domain(files, files_scenarios),
        _domain(todo, todo_scenarios),
    )
}
TOOLS: dict[str, ToolSpec] = {t.name: t for d in DOMAINS.values() for t in d.tools}


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise KeyError(f"unknown tool-world domain {name!r}; valid domains: {sorted(DOMAINS)}")
    return DOMAINS[name]


def get_tool(name: str) -> ToolSpec:
    if name not in TOOLS:
        raise KeyError(f"unknown tool-world tool {name!r}; valid tools: {sorted(TOOLS)}")
    return TOOLS[name]
