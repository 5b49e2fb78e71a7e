"""JSON paths into tool responses: a path is a sequence of steps, where a string is a dict key, an int a
list index, and a ``Match`` picks the first list element whose fields equal the given values (so an
element is found by content, not by position). In JSON a path is a list whose dict elements are matches:
``["events", {"title": "Standup"}, "event_id"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Match:
    """Selects the first element of a list whose fields equal ``fields``."""

    fields: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **fields: Any) -> Match:
        return cls(tuple(sorted(fields.items())))


PathStep = str | int | Match


def path_to_json(path: tuple[PathStep, ...]) -> list[Any]:
    return [dict(step.fields) if isinstance(step, Match) else step for step in path]


def resolve_path(value: Any, path: list[Any] | tuple[Any, ...]) -> Any:
    """Follow a JSON path (see module docstring); raise ``LookupError`` when it does not exist."""
    for step in path:
        if isinstance(step, Match):
            step = dict(step.fields)
        if isinstance(step, dict):
            if not isinstance(value, list):
                # LookupError, not TypeError: a path that does not fit the response is "not found"
                raise LookupError(f"expected a list to match {step}, got {type(value).__name__}")  # noqa: TRY004
            hits = [v for v in value if isinstance(v, dict) and all(v.get(k) == x for k, x in step.items())]
            if not hits:
                raise LookupError(f"no element matches {step}")
            value = hits[0]
        elif isinstance(step, int) and not isinstance(step, bool):
            if not isinstance(value, list) or not -len(value) <= step < len(value):
                raise LookupError(f"index {step} out of range")
            value = value[step]
        else:
            if not isinstance(value, dict) or step not in value:
                raise LookupError(f"no key {step!r}")
            value = value[step]
    return value
