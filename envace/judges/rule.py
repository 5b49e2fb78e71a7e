"""Rule judge: decides machine-checkable checklist items without any model; the rest is UNDECIDABLE.

An item is machine-checkable when it carries an explicit ``rule`` (``envace.core.checklist.ItemRule``;
the embedded tool world writes one on every item) or when ``envace.judges.conditions`` can parse its
``pass_condition`` completely.

Evaluation at one assistant step (its OpenAI ``tool_calls``, paired in order with the tool messages
that follow; calls written only inside the content are not calls, as in the CM2 judge prompt):

* tool_call: some call has the rule's name, its arguments are a JSON object, every listed argument
  equals the expected value (JSON equality: 1 == 1.0, but true != 1 and "1" != 1) or, for a bound
  argument, the value at its path in the response of the call that passed the referenced item earlier
  in this conversation (the lenient check ``envace.core.bindings.bound_or_literal``, shared
  with the tool world's checklist rules), and - with ``require_success`` - its response is not an
  error object (a JSON object with an ``error`` or ``error_tool_call`` key). The response of the
  passing call is remembered for later bound arguments; steps are judged in conversation order.
* answer_contains: the step's user-visible reply (content without its ``<think>`` block) mentions
  every value: after case-folding, collapsing whitespace and dropping thousands separators on both
  sides, the value occurs with no letter, digit or underscore directly before or after it ("150"
  matches "$150." but not "1500"): ``envace.core.answers.mentions``, the rule evaluation uses too. A
  value the rule binds to an item's response (``bound_values``) is read from the response of the call
  that passed that item in this conversation, real or rehearsed (``answer_target``); when no call
  passed it, the literal counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envace.core.answers import bound_answer_targets, mentions
from envace.core.bindings import (
    MISSING,
    bound_or_literal,
    json_equal,  # noqa: F401  (re-exported: the judge's equality of JSON values)
    lookup,
)
from envace.core.checklist import Checklist, ChecklistItem, ItemRule, RuleKind
from envace.core.checklist_reward import ItemVerdict, Verdict
from envace.core.conversation import ConversationStep, is_error_response, json_or_text, split_thinking
from envace.judges.base import (
    LLM_SETTING_NAMES,
    JudgeReport,
    Messages,
    assemble_report,
    forced_verdict,
    register_judge,
    steps_to_judge,
)
from envace.judges.conditions import parse_pass_condition

_MISSING = MISSING  # one sentinel with the shared binding checks
Matched = dict[tuple[int, str], Any]  # (turn, item id) -> response of the call that passed it


def item_rule(item: ChecklistItem, parse_conditions: bool = True) -> ItemRule | None:
    """The explicit rule of ``item``, else the rule parsed from its pass condition (when enabled)."""
    if item.rule is not None:
        return item.rule
    return parse_pass_condition(item.pass_condition, item.focus_on) if parse_conditions else None


def _argument(arguments: Mapping[str, Any], path: str) -> Any:
    if path in arguments:
        return arguments[path]
    return lookup(arguments, path.split("."))  # keys, indices, matchers; MISSING if absent


def _arguments_match(args: Mapping[str, Any], rule: ItemRule, matched: Matched) -> bool:
    bound = dict(rule.bound_arguments)
    for path, expected in rule.arguments:
        src = bound.get(path)
        source = matched.get((src.turn, src.item), _MISSING) if src else _MISSING
        if not bound_or_literal(_argument(args, path), expected, source, src.path if src else ()):
            return False
    return True


def answer_targets(rule: ItemRule, matched: Matched) -> list[Any]:
    """What the reply must mention for each value of an answer rule (``envace.core.answers.answer_target``)."""
    sources = rule.value_sources or (None,) * len(rule.values)
    return bound_answer_targets(rule.values, [(s.turn, s.item, s.path) if s else None for s in sources], matched)


def step_calls(step: ConversationStep) -> list[tuple[str, Mapping[str, Any] | None, Any]]:
    """(name, arguments object or None when invalid, parsed response or _MISSING) per call of a step."""
    calls = []
    raw_calls = step.assistant.get("tool_calls")
    for k, call in enumerate(raw_calls if isinstance(raw_calls, list) else []):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = json_or_text(args) if args.strip() else {}
        response = json_or_text(step.tool_messages[k].get("content")) if k < len(step.tool_messages) else _MISSING
        calls.append((fn["name"], args if isinstance(args, Mapping) else None, response))
    return calls


def user_visible_reply(content: Any) -> str:
    """Assistant content without its leading ``<think>…</think>`` block."""
    return split_thinking(content)[1]


def evaluate_rule(rule: ItemRule, step: ConversationStep, matched: Matched) -> tuple[bool, str, Any]:
    """(passed, one-line explanation, response of the passing call or _MISSING) of ``rule`` at ``step``."""
    if rule.kind is RuleKind.ANSWER_CONTAINS:
        reply = user_visible_reply(step.assistant.get("content"))
        targets = answer_targets(rule, matched)
        missing = [
            t if t is not _MISSING else v
            for v, t in zip(rule.values, targets)
            if t is _MISSING or not mentions(reply, t)
        ]
        return not missing, f"reply misses {missing}" if missing else "reply mentions every value", _MISSING
    for name, args, response in step_calls(step):
        if name != rule.tool_name or args is None or not _arguments_match(args, rule, matched):
            continue
        if rule.require_success and (response is _MISSING or is_error_response(response)):
            continue
        return True, f"call {name} matches {dict(rule.arguments)}", response
    return (
        False,
        f"no {'successful ' if rule.require_success else ''}call {rule.tool_name} matching",
        _MISSING,
    )


class RuleJudge:
    """Judge of machine-checkable items; ``parse_pass_conditions`` enables the pass-condition parser."""

    name = "rule"

    def __init__(self, parse_pass_conditions: bool = True) -> None:
        self.parse_pass_conditions = parse_pass_conditions

    def verdict(self, item: ChecklistItem, step: ConversationStep, matched: Matched | None = None) -> ItemVerdict:
        """The verdict on ``item`` at ``step``; ``matched`` carries bound-argument sources across steps."""
        forced = forced_verdict(item, step)
        if forced is not None:
            return forced
        rule = item_rule(item, self.parse_pass_conditions)
        if rule is None:
            return ItemVerdict(item.id, Verdict.UNDECIDABLE, source="rule", analysis="no machine-checkable rule")
        passed, why, response = evaluate_rule(rule, step, matched if matched is not None else {})
        if passed and matched is not None and (step.turn, item.id) not in matched:
            matched[(step.turn, item.id)] = response
        return ItemVerdict(item.id, Verdict.PASS if passed else Verdict.FAIL, source="rule", analysis=why)

    def verdicts(
        self, messages: Messages, checklist: Checklist, steps: Sequence[ConversationStep]
    ) -> dict[tuple[int, str], ItemVerdict]:
        """Verdicts on ``steps`` keyed by (assistant message index, item id).

        Every step of the conversation up to the last selected turn is evaluated in order, so bound
        arguments can refer to calls of turns that are not being judged now (per-turn online judging).
        """
        last = max((st.turn for st in steps), default=-1)
        context = [st for st in steps_to_judge(messages, checklist) if st.turn <= last]
        matched: Matched = {}
        every = {
            (st.message_index, it.id): self.verdict(it, st, matched)
            for st in context
            for it in checklist.turns[st.turn]
        }
        wanted = {st.message_index for st in steps}
        return {key: v for key, v in every.items() if key[0] in wanted}

    def judge(self, messages: Messages, checklist: Checklist, turns: Iterable[int] | None = None) -> JudgeReport:
        steps = steps_to_judge(messages, checklist, turns)
        return assemble_report(steps, self.verdicts(messages, checklist, steps), checklist)


@register_judge("rule")
def make_rule_judge(parse_pass_conditions: bool = True, **llm_settings: Any) -> RuleJudge:
    """A ``RuleJudge``; endpoint settings of a shared judge config (base_url, model, ...) are ignored."""
    unknown = sorted(set(llm_settings) - LLM_SETTING_NAMES)
    if unknown:
        raise TypeError(
            f"judge 'rule': unknown settings {unknown}; valid: parse_pass_conditions (endpoint settings "
            f"{sorted(LLM_SETTING_NAMES)} are accepted and ignored)"
        )
    return RuleJudge(parse_pass_conditions=parse_pass_conditions)
