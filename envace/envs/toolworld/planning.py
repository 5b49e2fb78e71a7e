"""How scenarios describe a task before it is executed: planned calls whose arguments may point into
earlier responses, and the answer template of a user turn.

A ``Ref(call, path)`` stands for a value taken from the response of an earlier planned call (key
``call``). ``path`` walks that response (``envace.core.json_paths``): a string is a dict key, an int a
list index, and a ``Match`` picks the first list element whose fields equal the given values (so "the
event titled Standup" is found by content, not by position). The task generator executes the plan on a
real executor, which turns every ``Ref`` into the value the execution produced; the oracle and the
checklist rules later resolve the same paths against *their* responses, so ids created at run time are
followed rather than hard-coded.

In JSON (task meta, checklist rules) a path is a list whose dict elements are matches:
``["events", {"title": "Standup"}, "event_id"]``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envace.core.json_paths import PathStep, resolve_path


@dataclass(frozen=True)
class Ref:
    """A value read from the response of the planned call ``call`` at ``path``."""

    call: str
    path: tuple[PathStep, ...]


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
