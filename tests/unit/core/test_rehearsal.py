"""Pure rehearsal logic (envace.core.rehearsal*, core.critique): critique parser, prompts, transcripts, memory."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.critique import Critique, CritiqueErrorCode, CritiqueParse, parse_critique, render_critique
from envace.core.records import Termination, ToolCall, Turn
from envace.core.rehearsal import AttemptRecord, RehearsalConfig, RehearsalContext, RehearsalMode
from envace.core.rehearsal_memory import MemoryBudget, bound_memory, count_approx_tokens
from envace.core.rehearsal_prompts import (
    RehearsalPrompts,
    critique_messages,
    extract_memory_text,
    history_message,
    memory_message,
    render_attempt_transcript,
    structured_memory,
    summary_messages,
)
from envace.core.seeds import derive_seed

CONTEXT = RehearsalContext(
    task_id="t1",
    system_prompt="You are a bank assistant.",
    tools=(),
    user_turns=("Send 5 to Bob.", "What is my balance?"),
)


def _attempt(index: int, critique: Critique | None = None) -> AttemptRecord:
    call = ToolCall("transfer", {"to": "bob", "amount": 5})
    turns = (
        Turn("<tool_call>…</tool_call>", (call,), ({"ok": True, "balance": 95},), True, 0),
        Turn("Sent.", (), (), True, 0),
        Turn("Your balance is 95.", (), (), True, 1),
    )
    record = AttemptRecord(index, turns, ("Sent.", "Your balance is 95."), Termination.FINAL_REPLY)
    if critique is not None:
        record = record.with_critique(render_critique(critique), CritiqueParse(critique))
    return record


# ---- critique parser ------------------------------------------------------------------------------


def test_parse_critique_round_trip():
    c = Critique("called transfer once", True, "keep the same plan")
    parsed = parse_critique("<think>hmm</think>\nsome chatter " + render_critique(c) + " trailing")
    assert parsed.ok and parsed.critique == c


@pytest.mark.parametrize(
    "text, code",
    [
        ("", CritiqueErrorCode.EMPTY_OUTPUT),
        ("   <think>only thoughts</think>  ", CritiqueErrorCode.EMPTY_OUTPUT),
        ("looks fine to me", CritiqueErrorCode.NO_CRITIQUE_TAG),
        ('<critique>{"assessment": "a"', CritiqueErrorCode.TAG_MALFORMED),
        ("<critique>{not json}</critique>", CritiqueErrorCode.JSON_DECODE_ERROR),
        ("<critique>[1, 2]</critique>", CritiqueErrorCode.INVALID_JSON_TYPE),
        ('<critique>{"assessment": "a", "revision": "r"}</critique>', CritiqueErrorCode.MISSING_FIELD),
        (
            '<critique>{"assessment": 3, "success_likely": true, "revision": "r"}</critique>',
            CritiqueErrorCode.INVALID_FIELD_TYPE,
        ),
        (
            '<critique>{"assessment": "a", "success_likely": "maybe", "revision": "r"}</critique>',
            CritiqueErrorCode.INVALID_FIELD_TYPE,
        ),
    ],
)
def test_parse_critique_error_codes(text, code):
    parsed = parse_critique(text)
    assert not parsed.ok and parsed.critique is None
    assert [e.code for e in parsed.errors] == [code]


def test_parse_critique_accepts_boolean_words():
    parsed = parse_critique('<critique>{"assessment": "a", "success_likely": "No", "revision": "r"}</critique>')
    assert parsed.ok and parsed.critique.success_likely is False


_PIECES = [
    *'<>/{}":,[] \\x',
    "<critique>",
    "</critique>",
    "<think>",
    "</think>",
    '"assessment"',
    '"revision"',
    '"success_likely"',
    "true",
    "false",
    '"a"',
    "null",
    "1e999",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join) | st.text())
def test_parse_critique_never_raises_on_tag_soup(text):
    parsed = parse_critique(text)
    assert parsed.ok == (parsed.critique is not None and not parsed.errors)
    assert parsed.critique is not None or parsed.errors


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=10,
    )
)
def test_parse_critique_never_raises_on_any_json_payload(payload):
    parsed = parse_critique(f"<critique>{json.dumps(payload)}</critique>")
    if parsed.ok:
        assert isinstance(payload, dict) and {"assessment", "success_likely", "revision"} <= set(payload)


# ---- prompts ---------------------------------------------------------------------------------------


def test_prompts_reject_templates_with_wrong_placeholders():
    with pytest.raises(ValueError, match="critique_user"):
        RehearsalPrompts(version="bad", critique_user="Task: {task}\n{transcrpt}")
    with pytest.raises(ValueError, match="memory_role"):
        RehearsalPrompts(memory_role="tool")
    custom = RehearsalPrompts(version="v2", memory_note="NOTES: {memory}")
    assert memory_message(custom, bound_memory("x y", MemoryBudget(), "policy"))["content"] == "NOTES: x y"


def test_config_accepts_strings_and_validates():
    cfg = RehearsalConfig(n_attempts=2, mode="sequential", scope="turn", summarizer="structured")
    assert cfg.mode is RehearsalMode.sequential
    with pytest.raises(ValueError, match="n_attempts"):
        RehearsalConfig(n_attempts=-1)
    with pytest.raises(ValueError):
        RehearsalConfig(mode="beam")


def test_critique_and_summary_messages_carry_task_and_transcript():
    prompts = RehearsalPrompts()
    attempt = _attempt(0)
    system, user = critique_messages(prompts, CONTEXT, attempt, value_chars=200)
    assert system["role"] == "system" and "<critique>" in system["content"] and "{{" not in system["content"]
    assert "Send 5 to Bob." in user["content"] and 'transfer({"amount": 5, "to": "bob"})' in user["content"]
    assert '[imagined result] {"balance": 95, "ok": true}' in user["content"]
    s_system, s_user = summary_messages(
        prompts, CONTEXT, [_attempt(0, Critique("ok", True, "same"))], MemoryBudget(max_chars=600, max_tokens=90), 200
    )
    assert "60 words" in s_system["content"] and "Revision: same" in s_user["content"]


def test_transcript_is_clipped_and_deterministic():
    attempt = _attempt(0)
    a = render_attempt_transcript(attempt, CONTEXT, value_chars=10)
    assert a == render_attempt_transcript(attempt, CONTEXT, value_chars=10)
    assert "[user 1] Send 5 to…" in a and "[user 2] What is m…" in a and a.endswith("[ended: final_reply]")


def test_history_message_lists_previous_attempts_only():
    prompts = RehearsalPrompts()
    assert history_message(prompts, CONTEXT, (), 100) is None
    previous = (_attempt(0, Critique("wrong amount", False, "send 5 not 50")), _attempt(1))
    note = history_message(prompts, CONTEXT, previous, 100)["content"]
    assert "Attempt 1:" in note and "Attempt 2:" in note and "Attempt 3" not in note
    assert "Revision: send 5 not 50" in note and "Critique: unavailable (none)" in note


def test_structured_memory_and_extraction():
    memory = structured_memory([_attempt(0, Critique("fine", True, "repeat")), _attempt(1)])
    assert memory.splitlines() == [
        "Attempt 1 (likely success): calls transfer; ended final_reply. Advice: repeat",
        "Attempt 2 (unreviewed): calls transfer; ended final_reply.",
    ]
    assert extract_memory_text("<think>x</think>blah <memory> use transfer </memory> end") == "use transfer"
    assert extract_memory_text("  plain text  ") == "plain text"


# ---- memory bound ----------------------------------------------------------------------------------


def test_memory_within_budget_is_untouched():
    m = bound_memory("  call transfer once  ", MemoryBudget(max_chars=100, max_tokens=10), "policy")
    assert (m.text, m.truncated, m.source, m.source_chars) == ("call transfer once", False, "policy", 18)


def test_memory_token_bound_is_exact_and_deterministic():
    text = " ".join(f"word{i}" for i in range(200))
    budget = MemoryBudget(max_chars=None, max_tokens=20)
    m = bound_memory(text, budget, "policy")
    assert m.truncated and m.source_chars == len(text)
    assert count_approx_tokens(m.text) <= 20
    assert m.text == bound_memory(text, budget, "policy").text
    # longest fitting prefix: 15 words + the 5-token marker
    assert m.text == " ".join(f"word{i}" for i in range(15)) + budget.marker


def test_memory_char_bound_and_custom_counter():
    text = "alpha beta gamma delta epsilon zeta eta theta"
    m = bound_memory(text, MemoryBudget(max_chars=30, max_tokens=None, marker=" …"), "policy")
    assert len(m.text) <= 30 and m.text == "alpha beta gamma delta …"
    by_chars = bound_memory(text, MemoryBudget(max_chars=None, max_tokens=12, marker=""), "p", count_tokens=len)
    assert by_chars.text == "alpha beta"


def test_memory_budget_smaller_than_marker():
    m = bound_memory("a b c d e f", MemoryBudget(max_chars=None, max_tokens=1), "policy")
    assert m.text == "" and m.truncated
    assert memory_message(RehearsalPrompts(), m) is None


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400), st.integers(0, 60), st.integers(0, 200))
def test_memory_bound_always_holds(text, max_tokens, max_chars):
    budget = MemoryBudget(max_chars=max_chars, max_tokens=max_tokens)
    m = bound_memory(text, budget, "policy")
    assert len(m.text) <= max_chars and count_approx_tokens(m.text) <= max_tokens


def test_derive_seed_is_stable():
    assert derive_seed(0, "t1", "attempt", 0) == derive_seed(0, "t1", "attempt", 0)
    assert derive_seed(0, "t1", "attempt", 0) != derive_seed(0, "t1", "attempt", 1)
    assert derive_seed("a") == 3904355907 & 0x7FFFFFFF


def test_turn_json_keeps_stand_ins_and_omits_them_when_none():
    from envace.core.rehearsal import turn_from_json, turn_to_json

    calls = (ToolCall("a", {}), ToolCall("b", {"x": 1}))
    turn = Turn("t", calls, ({"ok": 1}, {"error": "made up"}), False, 2, stand_ins=(1,))
    assert turn_to_json(turn)["stand_ins"] == [1]
    assert turn_from_json(json.loads(json.dumps(turn_to_json(turn)))) == turn
    plain = Turn("t", calls[:1], ({"ok": 1},), False, 0)
    assert "stand_ins" not in turn_to_json(plain)
    assert turn_from_json(turn_to_json(plain)) == plain
