"""CM2-format checklists derived from the gold calls, and a rule checker for them.

Per user turn, one item per gold call that is meant to succeed, then one item for the final reply.
Items carry the CM2 keys ``{id, question, focus_on, pass_condition, failure_examples, evidence,
weight, required_for_next_turn, dependence}`` plus a machine-checkable ``rule``:

- ``{"kind": "tool_call", "name": N, "arguments": {...}, "bound_arguments": {arg: {"turn", "item",
  "path"}}}`` — some call of that turn has name N, succeeded (its response is not an error, as CM2
  auto-fails tool items whose step errored) and, for each listed argument, the value equals the
  gold value **or**, for a bound argument, the value found at ``path`` in the response of the call
  that passed item ``item`` of turn ``turn`` (ids the agent's own execution produced; the lenient
  check of ``bindings``, shared with the rule judge). Arguments not listed are not checked.
- ``{"kind": "answer_contains", "values": [v], "text": v}`` — one item per key value of the turn:
  the final reply mentions ``v`` (``envace.core.answers.mentions``). ``text`` repeats the value for
  the shared rule parser (``envace.core.checklist.ItemRule`` reads ``text``); ``values`` is the list
  form. A value read from a gold response (``meta["answer_bindings"]``) whose call has an item gets
  ``"bound_values": [{"turn", "item", "path"}]``: the reply must then repeat the value at ``path`` in
  the response of the call that passed that item (the trajectory's own response, real or rehearsed),
  and the gold literal counts only when no call passed it (``envace.core.answers.answer_target``).

Gold calls planned to fail (error-path scenarios) get no item: a sound agent may skip them (e.g. it
checks the balance first), and what matters is the reply, whose items then carry the whole weight.
Weights: the answer items share 0.3 and the call items share 0.7, equally within each group
(rounded to 4 decimals, the remainder on the group's last item); a turn without call items gives
the answer items weight 1 in total. Call items are ``required_for_next_turn``; ``dependence`` lists
same-turn items whose results an item uses (answer items depend on all call items of the turn).
Evidence ``step`` indexes the turn's messages as ``to_cm2_row`` lays them out (user message = 0).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.answers import bound_answer_targets, mentions
from envace.core.bindings import MISSING, bound_or_literal
from envace.core.env import Task
from envace.core.records import ToolCall, Turn
from envace.envs.toolworld.gold import RealizedTurn
from envace.envs.toolworld.schema import is_error

ANSWER_WEIGHT = 0.3


def turn_message_positions(step_sizes: Sequence[int]) -> tuple[list[int], int]:
    """Message index (within a turn, user = 0) of each step's assistant message, and of the reply."""
    positions, index = [], 1
    for size in step_sizes:
        positions.append(index)
        index += 1 + size
    return positions, index


def _split(total: float, count: int) -> list[float]:
    if count == 0:
        return []
    share = round(total / count, 4)
    return [share] * (count - 1) + [round(total - share * (count - 1), 4)]


def item_weights(n_calls: int, n_values: int) -> tuple[list[float], list[float]]:
    """Weights of a turn's call items and answer items (see the module docstring); they sum to 1."""
    if n_calls + n_values == 0:
        raise ValueError("a checklist turn needs at least one call item or one answer value")
    answer_total = 0.0 if n_values == 0 else (ANSWER_WEIGHT if n_calls else 1.0)
    return _split(1.0 - answer_total, n_calls), _split(answer_total, n_values)


def _describe_args(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items()) or "no arguments"


def _call_item(call: ToolCall, item_id: str, turn: int, step: int, bound: dict[str, Any]) -> dict[str, Any]:
    conditions = [
        f"arguments.{k} == {json.dumps(v)}" + (" (or the id returned earlier)" if k in bound else "")
        for k, v in call.arguments.items()
    ]
    first_arg = next(iter(call.arguments), None)
    return {
        "id": item_id,
        "question": f"Did the assistant call {call.name} with {_describe_args(call.arguments)}?",
        "focus_on": "assistant.tool_calls",
        "pass_condition": " and ".join([f"There exists an assistant tool call with name={call.name}", *conditions])
        + ", and its tool response is not an error.",
        "failure_examples": [f"No {call.name} call observed", "The call returned an error"]
        + ([f"{call.name} called with a wrong {first_arg}"] if first_arg else []),
        "evidence": [
            {
                "turn": turn,
                "step": step,
                "from": "assistant.tool_calls",
                "snippet": json.dumps({"name": call.name, "arguments": call.arguments}, sort_keys=True),
            }
        ],
        "weight": 0.0,
        "required_for_next_turn": True,
        "dependence": sorted({b["item"] for b in bound.values() if b["turn"] == turn}),
        "rule": {"kind": "tool_call", "name": call.name, "arguments": dict(call.arguments), "bound_arguments": bound},
    }


def _answer_item(
    value: str, reply: str, item_id: str, where: tuple[int, int], deps: list[str], bound: dict[str, Any] | None
) -> dict[str, Any]:
    turn, step = where
    quoted = json.dumps(value)
    rule: dict[str, Any] = {"kind": "answer_contains", "values": [value], "text": value}
    if bound is not None:
        rule["bound_values"] = [bound]
    return {
        "id": item_id,
        "question": f"Does the final reply tell the user {quoted}?",
        "focus_on": "assistant.content.user_visible_reply",
        "pass_condition": f"The final reply of this turn mentions {quoted}.",
        "failure_examples": ["No final reply", f"The reply omits {quoted}", "The reply states a different value"],
        "evidence": [{"turn": turn, "step": step, "from": "assistant.content.user_visible_reply", "snippet": reply}],
        "weight": 0.0,
        "required_for_next_turn": False,
        "dependence": deps,
        "rule": rule,
    }


def build_turn_checklist(turn: int, realized: RealizedTurn, item_of_call: dict[str, tuple[int, str]]) -> list[dict]:
    """Call items then answer items of one turn; ``item_of_call`` (call id → (turn, item id)) is
    extended in place."""
    positions, reply_step = turn_message_positions([len(s) for s in realized.steps])
    items: list[dict[str, Any]] = []
    for step_index, step in enumerate(realized.steps):
        for call in step:
            if call.id in realized.expected_errors:
                continue
            bound = {
                arg: {"turn": item_of_call[src["call"]][0], "item": item_of_call[src["call"]][1], "path": src["path"]}
                for arg, src in realized.bindings.get(str(call.id), {}).items()
                if src["call"] in item_of_call
            }
            item_id = f"C{len(items)}"
            items.append(_call_item(call, item_id, turn, positions[step_index], bound))
            item_of_call[str(call.id)] = (turn, item_id)
    deps = [i["id"] for i in items]
    sources = realized.answer_bindings or (None,) * len(realized.key_values)
    for value, source in zip(realized.key_values, sources):
        bound = None
        if source is not None and source["call"] in item_of_call:
            src_turn, src_item = item_of_call[source["call"]]
            bound = {"turn": src_turn, "item": src_item, "path": source["path"]}
        items.append(_answer_item(value, realized.answer, f"C{len(items)}", (turn, reply_step), deps, bound))
    call_weights, answer_weights = item_weights(len(deps), len(realized.key_values))
    for item, weight in zip(items, call_weights + answer_weights):
        item["weight"] = weight
    return items


def build_checklists(turns: Sequence[RealizedTurn]) -> tuple[tuple[dict[str, Any], ...], ...]:
    item_of_call: dict[str, tuple[int, str]] = {}
    return tuple(tuple(build_turn_checklist(t, realized, item_of_call)) for t, realized in enumerate(turns))


@dataclass(frozen=True)
class TurnTranscript:
    """What happened in one user turn: every call made, its response, and the final reply."""

    calls: tuple[ToolCall, ...]
    responses: tuple[Any, ...]
    reply: str


def transcripts_from_turns(turns: Sequence[Turn], final_answers: Sequence[str]) -> tuple[TurnTranscript, ...]:
    """Group rollout ``Turn`` records by ``user_turn`` into per-user-turn transcripts."""
    out = []
    for user_turn, reply in enumerate(final_answers):
        mine = [t for t in turns if t.user_turn == user_turn]
        calls = tuple(c for t in mine for c in t.tool_calls)
        responses = tuple(r for t in mine for r in t.responses)
        out.append(TurnTranscript(calls, responses, reply))
    return tuple(out)


def _arguments_pass(call: ToolCall, rule: dict[str, Any], matched: dict[tuple[int, str], Any]) -> bool:
    args = call.arguments if isinstance(call.arguments, dict) else {}
    for name, expected in rule["arguments"].items():
        bound = rule.get("bound_arguments", {}).get(name)
        source = matched.get((bound["turn"], bound["item"]), MISSING) if bound else MISSING
        if not bound_or_literal(args.get(name, MISSING), expected, source, bound["path"] if bound else ()):
            return False
    return True


def rule_passes(
    rule: dict[str, Any], transcript: TurnTranscript, matched: dict[tuple[int, str], Any], where: tuple[int, str]
) -> bool:
    """Check one item's rule on one turn; a passing tool-call item records its response in ``matched``."""
    if rule["kind"] == "answer_contains":
        values = rule.get("values") or [rule.get("text", "")]
        sources = rule.get("bound_values") or [None] * len(values)
        keys = [(s["turn"], s["item"], s.get("path", ())) if s else None for s in sources]
        targets = bound_answer_targets(values, keys, matched)
        return all(t is not MISSING and mentions(transcript.reply or "", t) for t in targets)
    if rule["kind"] != "tool_call":
        raise ValueError(f"checklist rule kind {rule['kind']!r} unknown; valid: tool_call, answer_contains")
    for call, response in zip(transcript.calls, transcript.responses):
        if call.name == rule["name"] and not is_error(response) and _arguments_pass(call, rule, matched):
            matched[where] = response
            return True
    return False


def evaluate_checklists(task: Task, transcripts: Sequence[TurnTranscript]) -> tuple[tuple[bool, ...], ...]:
    """Per turn, per item: does the rule pass? Turns missing from ``transcripts`` fail every item."""
    matched: dict[tuple[int, str], Any] = {}
    empty = TurnTranscript((), (), "")
    results = []
    for turn, items in enumerate(task.checklists):
        transcript = transcripts[turn] if turn < len(transcripts) else empty
        results.append(tuple(rule_passes(item["rule"], transcript, matched, (turn, item["id"])) for item in items))
    return tuple(results)


def checklist_score(task: Task, transcripts: Sequence[TurnTranscript]) -> float:
    """CM2 reward by rules alone: mean over turns of the passed items' weights (no early stop)."""
    passes = evaluate_checklists(task, transcripts)
    if not passes:
        return 0.0
    per_turn = [sum(i["weight"] for i, ok in zip(items, row) if ok) for items, row in zip(task.checklists, passes)]
    return sum(per_turn) / len(per_turn)
