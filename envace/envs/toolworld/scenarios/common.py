"""Small helpers shared by the scenario builders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envace.envs.toolworld.planning import PlannedCall, ScenarioInput


def phrase(inp: ScenarioInput, templates: Sequence[str], **values: Any) -> str:
    """One of several paraphrases of a user request, chosen by the scenario's rng."""
    return inp.rng.choice(tuple(templates)).format(**values)


def call(key: str, name: str, expect_error: str | None = None, **arguments: Any) -> PlannedCall:
    return PlannedCall(key=key, name=name, arguments=dict(arguments), expect_error=expect_error)


def one_step(planned: PlannedCall) -> tuple[tuple[PlannedCall, ...], ...]:
    """A plan with a single step holding a single call."""
    return ((planned,),)


def enumerate_fields(prefix: str, values: Sequence[Any]) -> dict[str, Any]:
    """``{"prefix_0": v0, "prefix_1": v1, ...}`` for answers that must mention several values."""
    return {f"{prefix}_{i}": v for i, v in enumerate(values)}
