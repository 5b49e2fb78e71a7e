"""CM2 checklist records (pure: no I/O, no judge calls).

A CM2 checklist has, for every user turn, a list of items
``{id, question, focus_on, pass_condition, failure_examples, evidence, weight, required_for_next_turn,
dependence}`` whose weights sum to 1; an item may carry a machine-checkable ``rule`` (``ItemRule``).
Parsing raises ``ChecklistFormatError`` / ``ChecklistWeightError`` naming the offending field.
``dependence`` is kept as data; the reward (``envace.core.checklist_reward``) does not gate on it (the
reference does not either).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FOCUS_TOOL_CALLS = "assistant.tool_calls"
FOCUS_TOOL_CONTENT = "tool.content"
TOOL_FOCUSES = frozenset({FOCUS_TOOL_CALLS, FOCUS_TOOL_CONTENT})
DEFAULT_WEIGHT_TOLERANCE = 1e-6


class ChecklistFormatError(ValueError):
    """A checklist (or one of its items) does not follow the CM2 format; ``field`` says where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class ChecklistWeightError(ChecklistFormatError):
    """An item weight is not a finite non-negative number, or a turn's weights do not sum to 1."""


class RuleKind(str, enum.Enum):
    """Machine-checkable item kinds (evaluated by ``envace.judges.rule``)."""

    TOOL_CALL = "tool_call"  # some call of the step has this name and these argument values
    ANSWER_CONTAINS = "answer_contains"  # the step's user-visible reply mentions every value


@dataclass(frozen=True)
class BoundArgument:
    """An argument that may instead equal a value from the response of the call that passed another
    item (ids the agent's own execution produced). ``path`` steps: a key (str), an index (int), or a
    matcher (object: the first list element whose fields equal it)."""

    turn: int
    item: str
    path: tuple[Any, ...]


def _bound_from_dict(src: Any, where: str) -> BoundArgument:
    ok = isinstance(src, Mapping) and _is_int(src.get("turn")) and isinstance(src.get("item"), str)
    if not ok or not isinstance(src.get("path"), list):
        raise ChecklistFormatError(where, 'expected {"turn": int, "item": str, "path": [...]}')
    return BoundArgument(src["turn"], src["item"], tuple(src["path"]))


def _bound_to_dict(bound: BoundArgument) -> dict[str, Any]:
    return {"turn": bound.turn, "item": bound.item, "path": list(bound.path)}


def _value_sources(raw: Any, n_values: int, where: str) -> tuple[BoundArgument | None, ...]:
    """Parse an answer rule's optional ``bound_values`` (one entry per value, null = literal)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) != n_values:
        raise ChecklistFormatError(where, f"expected a list of {n_values} entries (null or a bound source)")
    return tuple(None if src is None else _bound_from_dict(src, f"{where}[{i}]") for i, src in enumerate(raw))


@dataclass(frozen=True)
class ItemRule:
    """Optional machine-checkable form of an item (the ``rule`` key of an item dict).

    JSON forms (the embedded tool world writes the same ones):

    * ``{"kind": "tool_call", "name": "get_x", "arguments": {"city": "Paris"}, "bound_arguments":
      {"event_id": {"turn": 0, "item": "C0", "path": ["event", "id"]}}, "require_success": true}`` -
      some call of the step has that name, each listed argument equals its value (keys may be dotted
      paths into nested objects) or, when bound, the value at ``path`` in the response of the call that
      passed item ``item`` of turn ``turn``; unlisted arguments are free. With ``require_success``
      (default true for explicit rules) the call's response must not be an error object.
    * ``{"kind": "answer_contains", "values": ["42", "Paris"]}`` (or ``"text": "42"``) - the step's
      user-visible reply mentions every value (``envace.core.answers.mentions``); no values: passes.
      Optional ``"bound_values": [null, {"turn": 0, "item": "C1", "path": ["balance"]}]`` (one entry
      per value): a bound value is read from the response of the call that passed that item when
      there is one (the reply must then repeat what *that* response said, real or rehearsed), else
      the literal value counts (``envace.core.answers.answer_target``).
    """

    kind: RuleKind
    tool_name: str | None = None
    arguments: tuple[tuple[str, Any], ...] = ()
    bound_arguments: tuple[tuple[str, BoundArgument], ...] = ()
    require_success: bool = True
    values: tuple[str, ...] = ()
    value_sources: tuple[BoundArgument | None, ...] = ()  # answer_contains: per value, or empty (all literal)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "rule") -> ItemRule:
        if not isinstance(raw, Mapping):
            raise ChecklistFormatError(where, f"expected an object, got {type(raw).__name__}")
        try:
            kind = RuleKind(raw.get("kind"))
        except ValueError:
            valid = ", ".join(k.value for k in RuleKind)
            raise ChecklistFormatError(
                f"{where}.kind", f"{raw.get('kind')!r} is not a rule kind; valid kinds: {valid}"
            ) from None
        if kind is RuleKind.TOOL_CALL:
            return cls._tool_call_from_dict(raw, where)
        if "text" in raw:
            values = [raw["text"]]
        else:
            values = raw.get("values")
        if not isinstance(values, list) or not all(_is_scalar(v) for v in values):
            raise ChecklistFormatError(f"{where}.values", "expected a list of strings or numbers (or 'text')")
        sources = _value_sources(raw.get("bound_values"), len(values), f"{where}.bound_values")
        return cls(kind, values=tuple(str(v) for v in values), value_sources=sources)

    @classmethod
    def _tool_call_from_dict(cls, raw: Mapping[str, Any], where: str) -> ItemRule:
        name, args = raw.get("name"), raw.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise ChecklistFormatError(f"{where}.name", "a tool_call rule needs a non-empty tool name")
        if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
            raise ChecklistFormatError(f"{where}.arguments", "expected an object with string keys")
        bound_raw = raw.get("bound_arguments", {})
        if not isinstance(bound_raw, Mapping):
            raise ChecklistFormatError(f"{where}.bound_arguments", "expected an object")
        bound = [(str(arg), _bound_from_dict(src, f"{where}.bound_arguments.{arg}")) for arg, src in bound_raw.items()]
        require = raw.get("require_success", True)
        if not isinstance(require, bool):
            raise ChecklistFormatError(f"{where}.require_success", "expected true or false")
        return cls(
            RuleKind.TOOL_CALL,
            name,
            tuple(sorted(args.items())),
            tuple(sorted(bound, key=lambda pair: pair[0])),
            require,
        )

    def to_dict(self) -> dict[str, Any]:
        if self.kind is RuleKind.ANSWER_CONTAINS:
            out: dict[str, Any] = {"kind": self.kind.value, "values": list(self.values)}
            if self.value_sources:
                out["bound_values"] = [_bound_to_dict(b) if b else None for b in self.value_sources]
            return out
        bound = {a: _bound_to_dict(b) for a, b in self.bound_arguments}
        return {
            "kind": self.kind.value,
            "name": self.tool_name,
            "arguments": dict(self.arguments),
            "bound_arguments": bound,
            "require_success": self.require_success,
        }


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Evidence:
    """Where the annotator saw the item satisfied in the reference conversation."""

    turn: int
    step: int
    source: str  # CM2 key "from", e.g. "assistant.tool_calls"
    snippet: str


@dataclass(frozen=True)
class ChecklistItem:
    id: str
    question: str
    focus_on: str
    pass_condition: str
    weight: float
    required_for_next_turn: bool = False
    failure_examples: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    dependence: tuple[str, ...] = ()
    rule: ItemRule | None = None

    @property
    def is_tool_focused(self) -> bool:
        return self.focus_on in TOOL_FOCUSES

    @classmethod
    def from_dict(cls, raw: Any, where: str = "item") -> ChecklistItem:
        """Parse one CM2 item; raises ``ChecklistFormatError`` naming the offending field."""
        if not isinstance(raw, Mapping):
            raise ChecklistFormatError(where, f"expected an object, got {type(raw).__name__}")
        for key in ("id", "question", "focus_on", "pass_condition"):
            if not isinstance(raw.get(key), str):
                raise ChecklistFormatError(f"{where}.{key}", "missing or not a string")
        weight = raw.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ChecklistWeightError(f"{where}.weight", f"expected a finite number, got {weight!r}")
        if weight < 0:
            raise ChecklistWeightError(f"{where}.weight", f"negative weight {weight}")
        required = raw.get("required_for_next_turn", False)
        if not isinstance(required, bool):
            raise ChecklistFormatError(f"{where}.required_for_next_turn", "expected true or false")
        rule_raw = raw.get("rule")
        return cls(
            id=raw["id"],
            question=raw["question"],
            focus_on=raw["focus_on"],
            pass_condition=raw["pass_condition"],
            weight=float(weight),
            required_for_next_turn=required,
            failure_examples=_string_tuple(raw.get("failure_examples", []), f"{where}.failure_examples"),
            evidence=_parse_evidence(raw.get("evidence", []), f"{where}.evidence"),
            dependence=_string_tuple(raw.get("dependence", []), f"{where}.dependence"),
            rule=None if rule_raw is None else ItemRule.from_dict(rule_raw, f"{where}.rule"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "focus_on": self.focus_on,
            "pass_condition": self.pass_condition,
            "failure_examples": list(self.failure_examples),
            "evidence": [
                {"turn": e.turn, "step": e.step, "from": e.source, "snippet": e.snippet} for e in self.evidence
            ],
            "weight": self.weight,
            "required_for_next_turn": self.required_for_next_turn,
            "dependence": list(self.dependence),
        }
        if self.rule is not None:
            out["rule"] = self.rule.to_dict()
        return out


def _string_tuple(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise ChecklistFormatError(where, "expected a list of strings")
    return tuple(raw)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_evidence(raw: Any, where: str) -> tuple[Evidence, ...]:
    if not isinstance(raw, list):
        raise ChecklistFormatError(where, "expected a list")
    out = []
    for k, ev in enumerate(raw):
        if not isinstance(ev, Mapping):
            raise ChecklistFormatError(f"{where}[{k}]", "expected an object")
        turn, step = ev.get("turn", -1), ev.get("step", -1)
        if not (_is_int(turn) and _is_int(step)):
            raise ChecklistFormatError(f"{where}[{k}]", "turn and step must be integers")
        source, snippet = ev.get("from", ""), ev.get("snippet", "")
        if not isinstance(source, str) or not isinstance(snippet, str):
            raise ChecklistFormatError(f"{where}[{k}]", "'from' and 'snippet' must be strings")
        out.append(Evidence(turn=turn, step=step, source=source, snippet=snippet))
    return tuple(out)


@dataclass(frozen=True)
class Checklist:
    """One checklist variant: per user turn, the items of that turn."""

    turns: tuple[tuple[ChecklistItem, ...], ...]

    @property
    def n_turns(self) -> int:
        return len(self.turns)

    @classmethod
    def from_raw(
        cls, raw: Any, where: str = "checklist", weight_tolerance: float = DEFAULT_WEIGHT_TOLERANCE
    ) -> Checklist:
        """Parse ``[[item, ...] per turn]`` (one CM2 variant); weights of each turn must sum to 1."""
        if not isinstance(raw, list) or not raw:
            raise ChecklistFormatError(where, "expected a non-empty list of turns")
        turns = []
        for t, items_raw in enumerate(raw):
            if not isinstance(items_raw, list) or not items_raw:
                raise ChecklistFormatError(f"{where}[{t}]", "expected a non-empty list of items")
            items = tuple(ChecklistItem.from_dict(it, f"{where}[{t}][{k}]") for k, it in enumerate(items_raw))
            ids = [it.id for it in items]
            if len(set(ids)) != len(ids):
                raise ChecklistFormatError(f"{where}[{t}]", f"duplicate item ids {sorted(ids)}")
            total = sum(it.weight for it in items)
            if abs(total - 1.0) > weight_tolerance:
                raise ChecklistWeightError(
                    f"{where}[{t}]",
                    f"weights sum to {total:.9f}, expected 1 (tolerance {weight_tolerance}); "
                    "renormalise the turn's weights",
                )
            turns.append(items)
        return cls(turns=tuple(turns))
