"""Executing a plan into the gold record of a task: concrete gold calls, their real responses, the
rendered gold answers and the argument bindings (which argument came from which earlier response).

``GoldRecorder`` runs planned turns on a real executor in order. Every ``Ref`` in an argument is
resolved against the response actually produced, recorded as a binding
``{call_id: {argument: {"call": source_call_id, "path": [...]}}}`` and replaced by its value. Gold
call ids are ``call_1``, ``call_2``, … in execution order across the whole task. A gold call that
fails unexpectedly (or succeeds where an error was planned) is a bug in a scenario builder and
raises ``GoldPlanError`` at generation time, never at evaluation time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envace.core.answers import mentions, value_text
from envace.core.json_paths import path_to_json, resolve_path
from envace.core.records import ToolCall
from envace.envs.toolworld.executor import ToolWorldExecutor
from envace.envs.toolworld.planning import (
    PlannedCall,
    PlannedTurn,
    Ref,
)
from envace.envs.toolworld.schema import is_error


class GoldPlanError(RuntimeError):
    """A scenario produced a gold call whose real outcome contradicts the plan."""


@dataclass(frozen=True)
class RealizedTurn:
    """One executed user turn of the gold conversation."""

    user: str
    steps: tuple[tuple[ToolCall, ...], ...]
    responses: tuple[tuple[Any, ...], ...]
    answer: str
    key_values: tuple[str, ...]
    bindings: dict[str, dict[str, dict[str, Any]]]
    expected_errors: dict[str, str]
    # per key value: None (stated by the user, or composed: checked literally) or {"call", "path"} of the
    # gold response it was read from (``envace.core.answers``)
    answer_bindings: tuple[dict[str, Any] | None, ...] = ()


def leaf_path(value: Any, text: str, path: tuple[Any, ...] = ()) -> list[Any] | None:
    """The first path (keys and indices, depth first) to a scalar leaf of ``value`` written as ``text``."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return list(path) if value is not None and value_text(value) == text else None
    for key, child in items:
        found = leaf_path(child, text, (*path, key))
        if found is not None:
            return found
    return None


class GoldRecorder:
    """Executes planned turns in order, remembering every response by planning key."""

    def __init__(self, executor: ToolWorldExecutor) -> None:
        self.executor = executor
        self.responses: dict[str, Any] = {}
        self._call_ids: dict[str, str] = {}
        self._executed: list[tuple[str, Any]] = []  # (gold call id, response) in execution order
        self._user_texts: list[str] = []

    def run_turn(self, planned: PlannedTurn) -> RealizedTurn:
        bindings: dict[str, dict[str, dict[str, Any]]] = {}
        errors: dict[str, str] = {}
        self._user_texts.append(planned.user)
        steps, responses = [], []
        for step in planned.steps:
            calls = tuple(self._concrete(p, bindings) for p in step)
            outs = tuple(self._execute(p, c, errors) for p, c in zip(step, calls))
            steps.append(calls)
            responses.append(outs)
        fields = {name: self._value(v) for name, v in planned.fields.items()}
        return RealizedTurn(
            user=planned.user,
            steps=tuple(steps),
            responses=tuple(responses),
            answer=planned.answer.format(**fields),
            key_values=tuple(str(fields[name]) for name in planned.key_fields),
            bindings=bindings,
            expected_errors=errors,
            answer_bindings=tuple(self._answer_binding(planned.fields[name]) for name in planned.key_fields),
        )

    def _answer_binding(self, item: Any) -> dict[str, Any] | None:
        """Where a key value comes from: ``None`` when a user turn states it (or no response holds it),
        else the gold call and path of the response it was read from: the ``Ref`` itself, or for a
        value the scenario read some other way, the newest response holding it as a leaf."""
        text = value_text(self._value(item))
        if any(mentions(user, text) for user in self._user_texts):
            return None
        if isinstance(item, Ref):
            return {"call": self._call_ids[item.call], "path": path_to_json(item.path)}
        for call_id, response in reversed(self._executed):
            path = leaf_path(response, text)
            if path is not None:
                return {"call": call_id, "path": path}
        return None

    def _value(self, item: Any) -> Any:
        if isinstance(item, Ref):
            return resolve_path(self.responses[item.call], item.path)
        return item

    def _concrete(self, planned: PlannedCall, bindings: dict[str, dict[str, dict[str, Any]]]) -> ToolCall:
        if planned.key in self._call_ids:
            raise GoldPlanError(f"planning key {planned.key!r} is used twice")
        call_id = f"call_{len(self._call_ids) + 1}"
        self._call_ids[planned.key] = call_id
        arguments = {}
        for name, value in planned.arguments.items():
            if isinstance(value, Ref):
                bindings.setdefault(call_id, {})[name] = {
                    "call": self._call_ids[value.call],
                    "path": path_to_json(value.path),
                }
            arguments[name] = self._value(value)
        return ToolCall(name=planned.name, arguments=arguments, id=call_id)

    def _execute(self, planned: PlannedCall, call: ToolCall, errors: dict[str, str]) -> Any:
        response = self.executor.execute(call)
        self.responses[planned.key] = response
        self._executed.append((str(call.id), response))
        code = response["error"]["code"] if is_error(response) else None
        if code != planned.expect_error:
            raise GoldPlanError(
                f"gold call {call.name}({call.arguments}) returned {response}; the plan expected "
                f"{planned.expect_error or 'success'} — fix the scenario builder"
            )
        if code is not None:
            errors[str(call.id)] = code
        return response
