"""Bound arguments: call arguments whose gold value was read from the response of an earlier call.

The tool-world generator records them per task as ``meta["bindings"] = {call_id: {argument: {"call":
source_id, "path": [...]}}}`` (``envace.envs.toolworld.gold.GoldRecorder``; paths:
``envace.core.json_paths``). The rules are independent of any data source (the engines' verifiable reward
and the rule judge apply them to any ``EpisodeSpec`` with bindings). Ids in the tool world come from
hidden counters and from a hidden initial state, so the literal gold value of a bound argument is an
accident of one execution: an agent that reads the id from *its* response of the same call is right even
when that id differs (a shifted counter in a real run, any made-up id in a rehearsed one).

One module holds every check of a bound argument; three scorers use it:

- **Lenient (checklist items).** ``bound_or_literal``: the value equals the gold literal, or the value
  found at the path in the response that passed the source item. Used by the tool world's own
  checklist rules (``envace.envs.toolworld.checklist.rule_passes``) and the rule judge (``envace.judges.rule``).
- **Corresponding (the built-in verifiable reward).** ``CallCorrespondence`` walks one trajectory in
  order and pairs made calls with gold calls. Made call M *corresponds* to gold call G when M was
  paired with G, which happens when they have the same name, the same argument names and every
  argument matches:

  * an unbound argument equals G's gold value (JSON equality, ``json_equal``);
  * a bound argument of G with source gold call S: when S has a corresponding made call from an
    *earlier* assistant step (calls of one step are issued together and cannot see each other's
    responses), the value must equal the value at the binding's path in the response (real or
    rehearsed) of that made call; the gold literal then does not count. When S has no
    corresponding call, the value must equal the gold literal (the agent found it some other way).
  * renaming must be one-to-one over the whole trajectory: every bound argument pairs its gold
    value g with the value v made; a pairing conflicts with an earlier one when g was paired with
    another value or v with another gold value, and a conflicting argument does not match. So two
    gold ids written as one id, or one gold id written as two, do not score as gold.

  A consistently renamed gold trajectory (every response-derived id replaced in the responses and
  in the later arguments by a fresh one, the same fresh id for the same old one) therefore pairs
  every call and scores exactly as the gold trajectory does; an id taken from the wrong earlier
  response, an id no corresponding response returned, or a collision of two ids does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from envace.core.json_paths import resolve_path
from envace.core.records import ToolCall

MISSING: Any = object()  # "no value": an absent argument, response or path
Bindings = Mapping[str, Mapping[str, Mapping[str, Any]]]  # call id -> argument -> {"call", "path"}


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: numbers compare by value, booleans only with booleans."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def lookup(value: Any, path: Iterable[Any]) -> Any:
    """The value at ``path`` (keys, indices, field matchers; see ``envace.core.json_paths``), or ``MISSING``."""
    if value is MISSING:
        return MISSING
    try:
        return resolve_path(value, list(path))
    except LookupError:
        return MISSING


def bound_or_literal(actual: Any, expected: Any, source: Any = MISSING, path: Iterable[Any] = ()) -> bool:
    """Lenient check of one argument: ``actual`` equals the gold ``expected`` or, when the source
    response is known, the value at ``path`` in it (see the module docstring)."""
    if actual is MISSING:
        return False
    if json_equal(actual, expected):
        return True
    value = lookup(source, path)
    return value is not MISSING and json_equal(actual, value)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class CallCorrespondence:
    """Pairs made calls with gold calls along one trajectory (the "corresponding" rule above).

    Use per assistant step: ``match(gold, made)`` for candidate pairs, ``accept`` for the chosen
    ones, then ``end_step(pairs)`` with (gold call, response) of every accepted pair, so that later
    steps, never the same one, can refer to those responses.
    """

    def __init__(self, bindings: Bindings | None = None) -> None:
        self.bindings: Bindings = bindings or {}
        self._responses: dict[str, Any] = {}  # gold call id -> response of the corresponding made call
        self._forward: dict[str, Any] = {}  # gold value -> made value
        self._backward: dict[str, Any] = {}  # made value -> gold value

    def source_response(self, gold_call_id: str) -> Any:
        """The response of the made call that corresponds to gold call ``gold_call_id``, or ``MISSING``."""
        return self._responses.get(gold_call_id, MISSING)

    def match(self, gold: ToolCall, made: ToolCall) -> list[tuple[Any, Any]] | None:
        """The (gold value, made value) pairs of ``gold``'s bound arguments when ``made`` matches it,
        else None."""
        args = made.arguments if isinstance(made.arguments, Mapping) else None
        if made.name != gold.name or args is None or set(args) != set(gold.arguments):
            return None
        pairs: list[tuple[Any, Any]] = []
        for name, expected in gold.arguments.items():
            right, bound = self._argument_matches(gold, name, args[name])
            if not right:
                return None
            if bound:
                pairs.append((expected, args[name]))
        return pairs if self._consistent(pairs) else None

    def argument_fraction(self, gold: ToolCall, made: ToolCall) -> float:
        """For a made call that ``match`` rejected: the share of arguments it got right, over the union of
        both calls' argument names (0 when the names differ or the arguments are not an object).

        Each gold argument is checked on its own by ``match``'s rule (bound arguments against the
        corresponding response, renaming consistent with the pairs accepted so far); nothing is recorded.
        """
        args = made.arguments if isinstance(made.arguments, Mapping) else None
        if made.name != gold.name or args is None:
            return 0.0
        names = set(args) | set(gold.arguments)
        if not names:
            return 0.0
        right = 0
        for name, expected in gold.arguments.items():
            if name not in args:
                continue
            ok, bound = self._argument_matches(gold, name, args[name])
            right += ok and (not bound or self._consistent([(expected, args[name])]))
        return right / len(names)

    def _argument_matches(self, gold: ToolCall, name: str, actual: Any) -> tuple[bool, bool]:
        """(whether ``actual`` is right for ``gold``'s argument ``name``, whether that argument is bound).

        A bound argument must equal the value at its path in the response of the made call that corresponds
        to its source call; before any such call exists (or an unbound argument), the gold literal. The
        renaming check across the trajectory is the caller's (``_consistent``).
        """
        bound = self.bindings.get(str(gold.id), {}) if gold.id is not None else {}
        source = bound.get(name)
        response = self.source_response(str(source["call"])) if source else MISSING
        target = gold.arguments[name] if response is MISSING else lookup(response, source["path"])
        return target is not MISSING and json_equal(actual, target), bool(source)

    def _consistent(self, pairs: list[tuple[Any, Any]]) -> bool:
        forward, backward = dict(self._forward), dict(self._backward)
        for gold_value, made_value in pairs:
            g, m = _key(gold_value), _key(made_value)
            if forward.setdefault(g, m) != m or backward.setdefault(m, g) != g:
                return False
        return True

    def accept(self, pairs: list[tuple[Any, Any]]) -> None:
        """Record the renaming of an accepted pair (from ``match``)."""
        for gold_value, made_value in pairs:
            g, m = _key(gold_value), _key(made_value)
            self._forward[g], self._backward[m] = m, g

    def end_step(self, accepted: Iterable[tuple[ToolCall, Any]]) -> None:
        """Make the responses of this step's accepted (gold call, response) pairs visible to later steps."""
        for gold, response in accepted:
            if gold.id is not None:
                self._responses[str(gold.id)] = response
