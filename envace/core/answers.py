"""Checking a final reply against the key values of a turn: one rule for training rewards and evaluation.

**Mentions.** A reply mentions a value when, after case-folding, collapsing runs of whitespace and
dropping thousands separators (``1,250`` -> ``1250``) on both sides, the value occurs with no letter,
digit or underscore directly before or after it: ``150`` matches "$150." and "150.00" but not "1500";
``evt_3`` does not match ``evt_30``; ``1250`` does not match inside ``12507``. An empty value is always
mentioned. The evaluation scorer (``envace.envs.toolworld.scoring``), the tool world's checklist rules,
the rule judge and the built-in verifiable reward all call ``mentions``.

**Bound key values.** Most key values of a tool-world turn are read from a tool response (a balance, a
new transaction id). The generator records where: ``meta["answer_bindings"][t][i]`` is ``None`` for a
value the user or the system states (checked literally) or ``{"call": gold_call_id, "path": [...]}``
for the value at ``path`` in that gold call's response. A training reward must hold the reply to what
*the trajectory's own* response of the corresponding call said, real or rehearsed, as bound call
arguments already are (``envace.core.bindings``): ``answer_target`` gives the value to look for —
the value at the path in the corresponding response when that response is known, the gold literal
when the trajectory has no corresponding call (it found the value some other way). Evaluation on the
real environment keeps checking the gold literals (``envace.envs.toolworld.scoring``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from envace.core.bindings import MISSING, lookup

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")

AnswerBinding = Mapping[str, Any] | None  # {"call": gold call id, "path": [...]} or None (a literal value)


def normalise_text(text: str) -> str:
    """Case-folded, whitespace collapsed, thousands separators dropped."""
    return _THOUSANDS.sub("", " ".join(str(text).casefold().split()))


def mentions(text: str, value: Any) -> bool:
    """``value`` occurs in ``text`` as a whole token (see the module docstring)."""
    needle = normalise_text(str(value)).strip()
    if not needle:
        return True
    return re.search(r"(?<![0-9a-z_])" + re.escape(needle) + r"(?![0-9a-z_])", normalise_text(text or "")) is not None


def value_text(value: Any) -> str:
    """A response value as the generator writes key values (``str``), so a bound target compares alike."""
    return value if isinstance(value, str) else str(value)


def answer_target(literal: str, binding: AnswerBinding, source_response: Any = MISSING) -> Any:
    """The text a reply must mention for one key value, or ``MISSING`` when the corresponding response
    lacks the bound path (nothing the reply says can then be checked against it).

    ``source_response`` is the trajectory's response of the call corresponding to the binding's gold
    call (``MISSING`` when the trajectory made no such call: the gold literal is then the target).
    """
    if binding is None or source_response is MISSING:
        return literal
    value = lookup(source_response, binding.get("path", ()))
    return MISSING if value is MISSING else value_text(value)


def bound_answer_targets(
    values: Sequence[str],
    sources: Sequence[tuple[int, str, Sequence[Any]] | None],
    matched: Mapping[tuple[int, str], Any],
) -> list[Any]:
    """``answer_target`` of each key value of an answer rule: ``sources[i]`` is (turn, checklist item, path)
    of the item whose passing call's response binds value i (None: the literal), ``matched`` the responses
    of the items passed so far, keyed (turn, item). Shared by both checklist evaluators (the tool world's
    ``rule_passes`` and the rule judge)."""
    targets = []
    for value, src in zip(values, sources):
        if src is None:
            targets.append(answer_target(value, None))
            continue
        turn, item, path = src
        targets.append(answer_target(value, {"path": list(path)}, matched.get((turn, item), MISSING)))
    return targets


def turn_answer_bindings(meta: Mapping[str, Any] | None, turn: int, n_values: int) -> Sequence[AnswerBinding]:
    """The bindings of turn ``turn``'s ``n_values`` key values (all ``None`` where ``meta`` has none)."""
    per_turn = (meta or {}).get("answer_bindings") or ()
    bindings = list(per_turn[turn]) if turn < len(per_turn) else []
    if bindings and len(bindings) != n_values:
        raise ValueError(
            f"meta['answer_bindings'][{turn}] has {len(bindings)} entries for {n_values} key values; "
            "regenerate the tasks with this envace version (prepare_data)"
        )
    return bindings or [None] * n_values
