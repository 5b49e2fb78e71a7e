"""How scenarios describe a task before it is executed: planned calls whose arguments may point into
earlier responses, and the answer template of a user turn.

A ``Ref(call, path)`` stands for a value taken from the response of an earlier planned call (key
``call``). ``path`` walks that response: a string is a dict key, an int a list index, and a ``Match``
picks the first list element whose fields equal the given values (so "the event titled Standup" is
found by content, not by position). The task generator executes the plan on a real executor, which
turns every ``Ref`` into the value the execution produced; the oracle and the checklist rules later
resolve the same paths against *their* responses, so ids created at run time are followed rather
than hard-coded.

In JSON (task meta, checklist rules) a path is a list whose dict elements are matches:
``["events", {"title": "Standup"}, "event_id"]``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Match:
    """Selects the first element of a list whose fields equal ``fields``."""

    fields: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **fields: Any) -> Match:
        return cls(tuple(sorted(fields.items())))


PathStep = str | int | Match


@dataclass(frozen=True)
class Ref:
    """A value read from the response of the planned call ``call`` at ``path``."""

    call: str
    path: tuple[PathStep, ...]


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


@dataclass(frozen=True)
class PlannedCall:
    """One gold call. Argument values may be ``Ref``; ``expect_error`` names the error code the call
    is meant to produce (error-path scenarios), None when it must succeed."""

    key: str
    name: str
    arguments: Mapping[str, Any]
    expect_error: str | None = None


@dataclass(frozen=True)
class PlannedTurn:
    """One user turn: the message, the gold steps (each a tuple of parallel calls) and the answer.

    ``answer`` is a ``str.format`` template over ``fields`` (values may be ``Ref``); ``key_fields``
    names the fields whose values the final reply must contain. ``provides`` is what a follow-up turn
    may refer to ("it"), e.g. ``{"event": {"id": Ref(...), "date": ...}}``.
    """

    user: str
    steps: tuple[tuple[PlannedCall, ...], ...]
    answer: str
    fields: Mapping[str, Any]
    key_fields: tuple[str, ...]
    provides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScenarioInput:
    """What a scenario builder sees: an rng, the domain state at this turn, what the previous turn
    provided, the turn index (used to make planning keys unique) and the responses of the calls
    executed so far (so ``value`` can look behind a ``Ref`` handed over by an earlier turn)."""

    rng: random.Random
    state: Mapping[str, Any]
    context: Mapping[str, Any]
    turn: int
    responses: Mapping[str, Any] = field(default_factory=dict)

    def key(self, name: str) -> str:
        return f"t{self.turn}.{name}"

    def value(self, item: Any) -> Any:
        """``item`` itself, or the executed value behind it when it is a ``Ref``."""
        if isinstance(item, Ref):
            return resolve_path(self.responses[item.call], item.path)
        return item


Builder = Callable[[ScenarioInput], PlannedTurn | None]


@dataclass(frozen=True)
class Scenario:
    """A kind of user request with a fixed tool set.

    ``requires``: a context key the *previous* turn must provide (follow-up requests such as "invite
    Ben to it"); follow-ups are phrased as continuations and never open a conversation.
    ``provides``: context keys its turns provide. A builder returns None when the state at hand
    cannot support the request; the generator then retries with another draw.
    """

    name: str
    tools: tuple[str, ...]
    build: Builder
    requires: str | None = None
    provides: tuple[str, ...] = ()
