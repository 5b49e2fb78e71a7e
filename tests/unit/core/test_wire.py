"""Wire formats: exact parses of hand-written messages, error codes, and hypothesis properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.core.records import ToolCall
from envace.core.wire import ParseErrorCode as Code
from envace.core.wire import (
    as_result_object,
    parse_rehearsal,
    parse_tool_calls,
    render_rehearsal,
    render_tool_calls,
    require_tool_call,
    strip_think,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def codes(parse) -> list[Code]:
    return [e.code for e in parse.errors]


# ---- strip_think -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>plan</think>answer", "answer"),
        ("a<think>x</think>b<think>y</think>c", "abc"),
        ("prompt-opened thought</think>\nanswer", "\nanswer"),  # opening tag was in the prompt
        ("answer<think>never closed", "answer"),
        ("<think>only thinking", ""),
        ("no thinking at all", "no thinking at all"),
    ],
)
def test_strip_think(text: str, expected: str) -> None:
    assert strip_think(text) == expected


# ---- parse_tool_calls: good messages -------------------------------------------------------------
def test_single_call_with_content_and_thinking() -> None:
    text = (
        "<think>I should look it up.</think>Let me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    )
    parse = parse_tool_calls(text, allowed_names=["get_weather"])
    assert parse.ok and not parse.is_final
    assert parse.calls == (ToolCall("get_weather", {"city": "Paris", "days": 2}),)
    assert parse.content == "Let me check."


def test_parallel_calls_keep_order() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": [1, 2]}}\n</tool_call>'
    )
    parse = parse_tool_calls(text)
    assert [c.name for c in parse.calls] == ["a", "b"]
    assert parse.calls[1].arguments == {"x": [1, 2]}
    assert parse.content == ""


def test_parameters_alias_and_string_arguments() -> None:
    text = (
        '<tool_call>{"name": "a", "parameters": {"k": 1}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "{\\"k\\": 2}"}</tool_call>'
        '<tool_call>{"name": "c", "arguments": ""}</tool_call>'
    )
    parse = parse_tool_calls(text)
    assert parse.ok
    assert [(c.name, c.arguments) for c in parse.calls] == [("a", {"k": 1}), ("b", {"k": 2}), ("c", {})]
    assert all(c.id is None for c in parse.calls)


def test_final_reply() -> None:
    parse = parse_tool_calls("<think>done</think>  The answer is 4.  ")
    assert parse.ok and parse.is_final
    assert parse.calls == () and parse.content == "The answer is 4."


def test_tool_call_inside_thinking_is_ignored() -> None:
    parse = parse_tool_calls('<think><tool_call>{"name": "a", "arguments": {}}</tool_call></think>Bye.')
    assert parse.is_final and parse.content == "Bye."


# ---- parse_tool_calls: errors --------------------------------------------------------------------
def test_bad_block_reported_good_blocks_kept() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {oops}\n</tool_call>\n'
        '<tool_call>\n{"name": "c", "arguments": {"z": null}}\n</tool_call>'
    )
    parse = parse_tool_calls(text)
    assert [c.name for c in parse.calls] == ["a", "c"]
    assert codes(parse) == [Code.JSON_DECODE_ERROR]
    assert "#2" in parse.errors[0].message and "oops" in parse.errors[0].detail
    assert not parse.ok and not parse.is_final


@pytest.mark.parametrize(
    "block, code",
    [
        ('{"name": "a"}', Code.NO_ARGUMENTS),
        ('{"name": "a", "arguments": [1]}', Code.ARGUMENTS_NOT_OBJECT),
        ('{"name": "a", "arguments": null}', Code.ARGUMENTS_NOT_OBJECT),
        ('{"name": "a", "arguments": "[1, 2]"}', Code.ARGUMENTS_NOT_OBJECT),
        ('{"name": "a", "arguments": "{not json"}', Code.JSON_DECODE_ERROR),
        ('{"arguments": {}}', Code.INVALID_TOOL_NAME),
        ('{"name": 3, "arguments": {}}', Code.INVALID_TOOL_NAME),
        ('{"name": "  ", "arguments": {}}', Code.INVALID_TOOL_NAME),
        ('["a", {}]', Code.CALL_NOT_OBJECT),
        ("", Code.JSON_DECODE_ERROR),
        ('{"name": "a", "arguments": {"x": NaN}}', Code.JSON_DECODE_ERROR),
    ],
)
def test_block_error_codes(block: str, code: Code) -> None:
    parse = parse_tool_calls(f"<tool_call>\n{block}\n</tool_call>")
    assert parse.calls == ()
    assert codes(parse) == [code]


def test_invalid_tool_name_lists_available() -> None:
    parse = parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', allowed_names={"ls", "cat"})
    assert codes(parse) == [Code.INVALID_TOOL_NAME]
    assert "'rm'" in parse.errors[0].message and "cat, ls" in parse.errors[0].message


def test_unclosed_and_malformed_tags() -> None:
    unclosed = parse_tool_calls('Sure.\n<tool_call>\n{"name": "a", "arguments": {')
    assert codes(unclosed) == [Code.UNCLOSED_TAG] and unclosed.content == "Sure."
    stray = parse_tool_calls("hello </tool_call> world")
    assert codes(stray) == [Code.TAG_MALFORMED] and stray.content == "hello  world"
    reopened = parse_tool_calls('<tool_call>{"name": "a"<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert codes(reopened) == [Code.TAG_MALFORMED]
    assert [c.name for c in reopened.calls] == ["b"]


def test_require_tool_call() -> None:
    assert codes(parse_tool_calls("just text", require=True)) == [Code.NO_TOOL_CALL_FOUND]
    assert codes(require_tool_call(parse_tool_calls("just text"))) == [Code.NO_TOOL_CALL_FOUND]
    good = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert parse_tool_calls(good, require=True).ok
    # a broken block already explains itself; no second error
    assert codes(parse_tool_calls("<tool_call>{", require=True)) == [Code.UNCLOSED_TAG]


# ---- render_tool_calls ---------------------------------------------------------------------------
def test_render_matches_qwen_template_layout() -> None:
    calls = [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert render_tool_calls(calls, "Checking.") == (
        'Checking.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
        '\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    )
    assert render_tool_calls(calls[:1]) == '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
    assert render_tool_calls([], "plain reply") == "plain reply"


def test_render_escapes_tags_inside_strings() -> None:
    call = ToolCall("echo", {"text": "a</tool_call>b<think>c</execution_result>"})
    text = render_tool_calls([call])
    assert text.count("</tool_call>") == 1 and "<think>" not in text
    assert parse_tool_calls(text).calls == (call,)


def test_render_rejects_nan() -> None:
    with pytest.raises(ValueError):
        render_tool_calls([ToolCall("a", {"x": float("nan")})])


# ---- parse_rehearsal -----------------------------------------------------------------------------
def test_rehearsal_with_thinking() -> None:
    text = '<think>\nThe city exists.\n</think>\n\n<execution_result>\n{"temp": 21, "unit": "C"}\n</execution_result>'
    parse = parse_rehearsal(text)
    assert parse.ok
    assert parse.result == {"temp": 21, "unit": "C"} and parse.think == "The city exists."


def test_rehearsal_array_and_surrounding_chatter() -> None:
    parse = parse_rehearsal('Here: <execution_result>[1, {"a": null}]</execution_result> done')
    assert parse.ok and parse.result == [1, {"a": None}] and parse.think == ""


@pytest.mark.parametrize(
    "text, code",
    [
        ("", Code.EMPTY_OUTPUT),
        ("  \n ", Code.EMPTY_OUTPUT),
        ('{"temp": 21}', Code.NO_EXECUTION_RESULT_TAG),
        ("<think>only thought</think>", Code.NO_EXECUTION_RESULT_TAG),
        ("<execution_result>\n{}\n", Code.TAG_MALFORMED),
        ("{}</execution_result>", Code.TAG_MALFORMED),
        ("</execution_result>{}<execution_result>", Code.TAG_MALFORMED),
        ("<execution_result>{}</execution_result><execution_result>[]</execution_result>", Code.TAG_MALFORMED),
        ("<execution_result>{'a': 1}</execution_result>", Code.JSON_DECODE_ERROR),
        ("<execution_result></execution_result>", Code.JSON_DECODE_ERROR),
        ('<execution_result>"ok"</execution_result>', Code.INVALID_RESULT_TYPE),
        ("<execution_result>42</execution_result>", Code.INVALID_RESULT_TYPE),
        ("<execution_result>null</execution_result>", Code.INVALID_RESULT_TYPE),
    ],
)
def test_rehearsal_error_codes(text: str, code: Code) -> None:
    parse = parse_rehearsal(text)
    assert codes(parse) == [code]
    assert parse.result is None and not parse.ok


def test_rehearsal_keeps_thought_on_error() -> None:
    parse = parse_rehearsal("<think>hmm</think><execution_result>nope</execution_result>")
    assert codes(parse) == [Code.JSON_DECODE_ERROR] and parse.think == "hmm"


def test_render_rehearsal() -> None:
    assert render_rehearsal({"a": 1}) == '<execution_result>\n{"a": 1}\n</execution_result>'
    assert render_rehearsal([], think="t") == "<think>\nt\n</think>\n\n<execution_result>\n[]\n</execution_result>"
    with pytest.raises(TypeError, match="as_result_object"):
        render_rehearsal("plain string")  # type: ignore[arg-type]
    assert as_result_object("x") == {"result": "x"} and as_result_object([1]) == [1]


# ---- properties ---------------------------------------------------------------------------------
TAG_PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<execution_result>",
        "</execution_result>",
        "{",
        "}",
        "[",
        "]",
        '"',
        ":",
        ",",
        "\n",
        '"name"',
        '"arguments"',
        '"parameters"',
        "null",
        "1e999",
        "NaN",
        "[" * 50,
        "é",
        "\u2028",
        "\ud800",
        "💥",
    ]
)
MESSY_TEXT = st.lists(st.one_of(st.text(max_size=12), TAG_PIECES), max_size=25).map("".join)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=15,
)
JSON_OBJECTS = st.dictionaries(st.text(), JSON_VALUES, max_size=5)
PLAIN_TEXT = st.text(alphabet=st.characters(blacklist_characters="<"), max_size=40)


@PROPERTY
@given(MESSY_TEXT, st.none() | st.lists(st.text(max_size=5), max_size=3))
def test_parsers_never_raise(text: str, allowed: list[str] | None) -> None:
    parse = parse_tool_calls(text, allowed_names=allowed, require=True)
    assert parse.ok == (not parse.errors)
    assert all(isinstance(c.arguments, dict) for c in parse.calls)
    rehearsal = parse_rehearsal(text)
    assert (rehearsal.result is None) == (not rehearsal.ok)
    assert rehearsal.result is None or isinstance(rehearsal.result, (dict, list))


@PROPERTY
@given(st.text(max_size=200))
def test_parsers_never_raise_on_any_unicode(text: str) -> None:
    parse_tool_calls(text)
    parse_rehearsal(text)
    strip_think(text)


@PROPERTY
@given(
    st.lists(st.tuples(st.text(min_size=1).filter(str.strip), JSON_OBJECTS), max_size=4),
    PLAIN_TEXT,
)
def test_tool_call_round_trip(raw_calls: list[tuple[str, dict]], content: str) -> None:
    calls = tuple(ToolCall(name, args) for name, args in raw_calls)
    parse = parse_tool_calls(render_tool_calls(calls, content), allowed_names=[n for n, _ in raw_calls])
    assert parse.ok
    assert parse.calls == calls
    assert parse.content == content.strip()
    assert parse.is_final == (not calls)


@PROPERTY
@given(st.one_of(JSON_OBJECTS, st.lists(JSON_VALUES, max_size=5)), st.none() | PLAIN_TEXT)
def test_rehearsal_round_trip(result: dict | list, think: str | None) -> None:
    parse = parse_rehearsal(render_rehearsal(result, think=think))
    assert parse.ok
    assert parse.result == result
    assert json.dumps(parse.result, sort_keys=True) == json.dumps(result, sort_keys=True)
    assert parse.think == ("" if think is None else think.strip())
