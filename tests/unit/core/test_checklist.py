"""Checklist reward aggregation (docs/method.md §4) on hand-computed cases and on the public CM2 sample."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from envace.core.checklist import (
    BoundArgument,
    Checklist,
    ChecklistFormatError,
    ChecklistItem,
    ChecklistWeightError,
    ItemRule,
    RuleKind,
)
from envace.core.checklist_reward import (
    ItemOutcome,
    ItemVerdict,
    StepVerdicts,
    Verdict,
    continue_after_turn,
    score_checklist,
)
from envace.core.conversation import conversation_steps, is_tool_call_error, split_thinking
from envace.core.records import TrajectoryStatus

SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "cm2" / "checklist_annotated_sample.json"
P, F, U, E = Verdict.PASS, Verdict.FAIL, Verdict.UNDECIDABLE, Verdict.ERROR


def item(item_id: str, weight: float, required: bool = False, focus: str = "assistant.content") -> dict:
    return {
        "id": item_id,
        "question": f"question {item_id}?",
        "focus_on": focus,
        "pass_condition": f"condition {item_id}",
        "failure_examples": [],
        "evidence": [],
        "weight": weight,
        "required_for_next_turn": required,
        "dependence": [],
    }


def step(turn: int, idx: int, tool_error: bool = False, **verdicts: Verdict) -> StepVerdicts:
    return StepVerdicts(turn, idx, tuple(ItemVerdict(k, v) for k, v in verdicts.items()), tool_error=tool_error)


@pytest.fixture
def two_turns() -> Checklist:
    return Checklist.from_raw([[item("A", 0.6, required=True), item("B", 0.4)], [item("C", 0.5), item("D", 0.5)]])


def test_any_step_passes_an_item(two_turns: Checklist) -> None:
    verdicts = [step(0, 0, A=F, B=P), step(0, 1, A=P, B=F), step(1, 0, C=P, D=F)]
    score = score_checklist(two_turns, verdicts)
    assert score.status is TrajectoryStatus.OK
    assert score.turn_scores == (1.0, 0.5)
    assert score.reward == pytest.approx((1.0 + 0.5) / 2)
    assert score.terminated_after is None


def test_required_item_unmet_ends_episode_and_later_turns_score_zero(two_turns: Checklist) -> None:
    verdicts = [step(0, 0, A=F, B=P), step(1, 0, C=P, D=P)]
    assert not continue_after_turn(two_turns.turns[0], verdicts[:1])
    score = score_checklist(two_turns, verdicts)
    assert score.terminated_after == 0
    assert score.turn_scores == (0.4, 0.0)
    assert score.reward == pytest.approx(0.4 / 2)
    assert score.item_outcomes[1] == (ItemOutcome.FAILED, ItemOutcome.FAILED)


def test_missed_turns_count_zero_with_full_denominator() -> None:
    checklist = Checklist.from_raw([[item("A", 1.0)], [item("B", 1.0)], [item("C", 1.0)]])
    score = score_checklist(checklist, [step(0, 0, A=P)])
    assert score.reward == pytest.approx(1 / 3)
    assert score.turn_scores == (1.0, 0.0, 0.0)


def test_turn_without_steps_fails_all_items(two_turns: Checklist) -> None:
    assert not continue_after_turn(two_turns.turns[0], [])
    assert score_checklist(two_turns, []).reward == 0.0


def test_tool_error_step_fails_tool_focused_items_only() -> None:
    checklist = Checklist.from_raw(
        [[item("T", 0.3, focus="assistant.tool_calls"), item("R", 0.2, focus="tool.content"), item("X", 0.5)]]
    )
    bad = step(0, 0, tool_error=True, T=P, R=P, X=P)
    assert score_checklist(checklist, [bad]).reward == pytest.approx(0.5)
    # a later clean step can still pass them (ANY semantics)
    good = step(0, 1, T=P, R=F, X=F)
    assert score_checklist(checklist, [bad, good]).reward == pytest.approx(0.8)


def test_judge_error_is_judge_failed_not_zero(two_turns: Checklist) -> None:
    score = score_checklist(two_turns, [step(0, 0, A=P, B=E), step(1, 0, C=P, D=P)])
    assert score.status is TrajectoryStatus.JUDGE_FAILED
    assert score.reward is None
    assert score.n_unknown == 1


def test_unknown_at_one_step_but_pass_at_another_is_a_pass(two_turns: Checklist) -> None:
    score = score_checklist(two_turns, [step(0, 0, A=P, B=U), step(0, 1, A=F, B=P), step(1, 0, C=F, D=F)])
    assert score.status is TrajectoryStatus.OK
    assert score.reward == pytest.approx(0.5)


def test_missing_verdict_is_unknown_and_unknown_required_stops(two_turns: Checklist) -> None:
    verdicts = [step(0, 0, B=P)]  # no verdict for A
    assert not continue_after_turn(two_turns.turns[0], verdicts)
    score = score_checklist(two_turns, verdicts)
    assert score.status is TrajectoryStatus.JUDGE_FAILED
    assert score.item_outcomes[0] == (ItemOutcome.UNKNOWN, ItemOutcome.PASSED)


def test_verdicts_for_turn_outside_checklist_raise(two_turns: Checklist) -> None:
    with pytest.raises(ValueError, match="turn 2"):
        score_checklist(two_turns, [step(2, 0, A=P)])


def test_weights_must_sum_to_one_within_tolerance() -> None:
    Checklist.from_raw([[item("A", 0.5), item("B", 0.5 + 5e-7)]])
    with pytest.raises(ChecklistWeightError, match="sum to 0.9"):
        Checklist.from_raw([[item("A", 0.5), item("B", 0.4)]])
    with pytest.raises(ChecklistWeightError):
        Checklist.from_raw([[item("A", 1.5), item("B", -0.5)]])
    with pytest.raises(ChecklistWeightError):
        Checklist.from_raw([[item("A", "1")]])


def test_format_errors_name_the_field() -> None:
    bad = item("A", 1.0)
    del bad["question"]
    with pytest.raises(ChecklistFormatError) as info:
        Checklist.from_raw([[bad]])
    assert info.value.field == "checklist[0][0].question"
    with pytest.raises(ChecklistFormatError, match="duplicate"):
        Checklist.from_raw([[item("A", 0.5), item("A", 0.5)]])
    with pytest.raises(ChecklistFormatError):
        Checklist.from_raw([])


def test_item_round_trip_with_rule() -> None:
    raw = item("A", 1.0, focus="assistant.tool_calls")
    raw["rule"] = {"kind": "tool_call", "name": "get_x", "arguments": {"city": "Paris", "n": 2}}
    parsed = ChecklistItem.from_dict(raw)
    assert parsed.rule == ItemRule(RuleKind.TOOL_CALL, "get_x", (("city", "Paris"), ("n", 2)))
    assert parsed.rule.require_success
    assert ChecklistItem.from_dict(parsed.to_dict()) == parsed
    bound = {
        "kind": "tool_call",
        "name": "f",
        "arguments": {"id": "e1"},
        "require_success": False,
        "bound_arguments": {"id": {"turn": 0, "item": "C0", "path": ["events", {"title": "x"}, "id"]}},
    }
    rule = ItemRule.from_dict(bound)
    assert rule.bound_arguments == (("id", BoundArgument(0, "C0", ("events", {"title": "x"}, "id"))),)
    assert ItemRule.from_dict(rule.to_dict()) == rule and not rule.require_success
    assert ItemRule.from_dict({"kind": "answer_contains", "values": ["a", 2]}).values == ("a", "2")
    assert ItemRule.from_dict({"kind": "answer_contains", "text": "a"}).values == ("a",)
    assert ItemRule.from_dict({"kind": "answer_contains", "values": []}).values == ()
    with pytest.raises(ChecklistFormatError, match="valid kinds"):
        ChecklistItem.from_dict({**raw, "rule": {"kind": "regex"}})
    with pytest.raises(ChecklistFormatError, match="bound_arguments.id"):
        ItemRule.from_dict({**bound, "bound_arguments": {"id": {"turn": "0", "item": "C0", "path": []}}})


def test_tool_call_error_marker_versus_tool_domain_error() -> None:
    assert is_tool_call_error('{"error_tool_call": "JSON_DECODE_ERROR"}')
    assert is_tool_call_error({"error_tool_call": "x"})
    assert not is_tool_call_error('{"error": "Invalid tool call"}')
    assert not is_tool_call_error("not json")


def test_conversation_steps_group_tools_and_count_steps_per_turn() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u0"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": '{"error_tool_call": "INVALID_TOOL_NAME"}'},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "ok"},
    ]
    steps = conversation_steps(messages)
    assert [(s.turn, s.step, s.message_index, len(s.tool_messages), s.tool_error) for s in steps] == [
        (0, 0, 2, 1, True),
        (0, 1, 4, 0, False),
        (1, 0, 6, 0, False),
    ]


def test_split_thinking() -> None:
    assert split_thinking("<think>\nplan\n</think>\n\nHello") == ("plan", "Hello")
    assert split_thinking("Hello") == ("", "Hello")
    assert split_thinking("<think>never closed") == ("never closed", "")
    assert split_thinking(None) == ("", "")


# ---- the public CM2 sample --------------------------------------------------------------------


@pytest.fixture(scope="module")
def cm2_row() -> dict:
    if not SAMPLE.is_file():
        pytest.skip(f"CM2 sample not present at {SAMPLE}")
    return json.loads(SAMPLE.read_text())[0]


def _uniform(checklist: Checklist, messages: list, decide) -> list[StepVerdicts]:
    return [
        StepVerdicts(
            st.turn,
            st.step,
            tuple(ItemVerdict(it.id, decide(st, it)) for it in checklist.turns[st.turn]),
            st.tool_error,
        )
        for st in conversation_steps(messages)
    ]


def test_cm2_sample_all_pass_gives_reward_one(cm2_row: dict) -> None:
    checklist = Checklist.from_raw(cm2_row["checklists"][0])
    assert checklist.n_turns == 3
    score = score_checklist(checklist, _uniform(checklist, cm2_row["messages"], lambda st, it: P))
    assert score.status is TrajectoryStatus.OK
    assert score.reward == pytest.approx(1.0)
    assert score.terminated_after is None


def test_cm2_sample_all_fail_gives_zero_and_stops_after_first_turn(cm2_row: dict) -> None:
    checklist = Checklist.from_raw(cm2_row["checklists"][0])
    score = score_checklist(checklist, _uniform(checklist, cm2_row["messages"], lambda st, it: F))
    assert score.reward == 0.0
    assert score.terminated_after == 0


def test_cm2_sample_only_required_items_pass(cm2_row: dict) -> None:
    checklist = Checklist.from_raw(cm2_row["checklists"][0])
    verdicts = _uniform(checklist, cm2_row["messages"], lambda st, it: P if it.required_for_next_turn else F)
    score = score_checklist(checklist, verdicts)
    # required weights: turn 0 .25+.2+.2+.2, turn 1 .45+.25, turn 2 .3+.4
    assert score.turn_scores == pytest.approx((0.85, 0.70, 0.70))
    assert score.reward == pytest.approx(2.25 / 3)


def test_cm2_sample_first_required_item_failing_ends_episode(cm2_row: dict) -> None:
    checklist = Checklist.from_raw(cm2_row["checklists"][0])
    verdicts = _uniform(checklist, cm2_row["messages"], lambda st, it: F if (st.turn, it.id) == (0, "C0") else P)
    score = score_checklist(checklist, verdicts)
    assert score.terminated_after == 0
    assert score.reward == pytest.approx(0.75 / 3)


def test_cm2_sample_tool_call_error_marker_autofails_tool_items(cm2_row: dict) -> None:
    messages = copy.deepcopy(cm2_row["messages"])
    assert messages[2]["role"] == "tool"
    # the recorded {"error": ...} is the tool's own answer, not a tool-call error: nothing auto-fails
    assert not conversation_steps(messages)[0].tool_error
    messages[2]["content"] = json.dumps({"error_tool_call": "INVALID_ARGUMENTS"})
    checklist = Checklist.from_raw(cm2_row["checklists"][0])

    def sensible(st, it) -> Verdict:  # tool items can only pass at a step that made a call
        return P if (st.tool_messages or not it.is_tool_focused) else F

    assert score_checklist(checklist, _uniform(checklist, cm2_row["messages"], sensible)).reward == 1.0
    score = score_checklist(checklist, _uniform(checklist, messages, sensible))
    # C0 (assistant.tool_calls, .25) and C1 (tool.content, .2) fail; both are required -> stop after turn 0
    assert score.turn_scores == pytest.approx((0.55, 0.0, 0.0))
    assert score.terminated_after == 0
    assert score.reward == pytest.approx(0.55 / 3)
