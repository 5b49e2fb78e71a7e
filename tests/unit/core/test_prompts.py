"""ChatML tool template, ChatFormatter continuations and role prompt builders (tiny tokenizer; SmolLM2 if cached)."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from envace.core.prompts import (
    CHATML_TOOL_TEMPLATE,
    DEFAULT_ROLE_PROMPTS,
    ChatFormatter,
    RolePrompts,
    TemplateNotAppendOnlyError,
    act_messages,
    act_observation_messages,
    sft_act_target,
    sft_rehearse_target,
    template_renders_tools,
)
from envace.core.records import ToolCall
from envace.core.rehearse_context import Said, call_message, rehearse_context, rehearse_system_message
from envace.core.wire import parse_rehearsal, parse_tool_calls
from envace.models import ModelSpec, build_tiny_tokenizer
from envace.models.smollm2 import SMOLLM2_CACHE_NAME, model_cache_root

torch.set_num_threads(1)

SMOLLM2_DIR = model_cache_root(ModelSpec("smollm2")) / SMOLLM2_CACHE_NAME
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "name": "book_hotel",
        "description": "Book a hotel",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}}},
    },
]
PARIS = ToolCall("get_weather", {"city": "Paris"})
ROME = ToolCall("get_weather", {"city": "Rome"})
BOOK = ToolCall("book_hotel", {"city": "Paris", "nights": 2})


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer():
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        pytest.skip(f"SmolLM2 cache {SMOLLM2_DIR} not built (run the slow test in test_models.py)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2_DIR, local_files_only=True)


@pytest.fixture(params=["tiny-own-template", "tiny-override", "smollm2"])
def formatter(request, tiny_tokenizer) -> ChatFormatter:
    if request.param == "tiny-own-template":
        return ChatFormatter(tiny_tokenizer)
    if request.param == "tiny-override":
        return ChatFormatter(tiny_tokenizer, template=CHATML_TOOL_TEMPLATE)
    return ChatFormatter(_smollm2_tokenizer(), template=CHATML_TOOL_TEMPLATE)


def _assistant(calls: list[ToolCall], content: str = "") -> dict:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls],
    }


# ---- template --------------------------------------------------------------------------------------------
def test_template_lists_tools_in_system_turn(tiny_tokenizer):
    text = ChatFormatter(tiny_tokenizer).render(act_messages(DEFAULT_ROLE_PROMPTS, "Travel desk.", "Hi"), TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nTravel desk.\n")
    tools_block = system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line)["name"] for line in tools_block] == ["get_weather", "book_hotel"]
    assert json.loads(tools_block[0]) == TOOLS[0]["function"]
    assert "<tool_call>" in system
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_template_without_tools_has_plain_system_and_no_generation_prompt(tiny_tokenizer):
    f = ChatFormatter(tiny_tokenizer)
    text = f.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], add_generation_prompt=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"


@pytest.mark.parametrize("content", ["", "Let me check."])
def test_assistant_tool_calls_render_as_wire_format(tiny_tokenizer, content):
    f = ChatFormatter(tiny_tokenizer)
    text = f.render([{"role": "user", "content": "q"}, _assistant([PARIS, BOOK], content)], add_generation_prompt=False)
    expected_body = sft_act_target([PARIS, BOOK], content)
    assert f"<|im_start|>assistant\n{expected_body}<|im_end|>\n" in text
    assert parse_tool_calls(expected_body).calls == (PARIS, BOOK)


def test_consecutive_tool_messages_share_one_user_turn(tiny_tokenizer):
    f = ChatFormatter(tiny_tokenizer)
    obs = act_observation_messages([PARIS, ROME], [{"t": 21}, {"t": 25}])
    text = f.render([{"role": "user", "content": "q"}, _assistant([PARIS, ROME]), *obs], add_generation_prompt=False)
    assert text.endswith(
        '<|im_start|>user\n<tool_response>\n{"t":21}\n</tool_response>\n'
        '<tool_response>\n{"t":25}\n</tool_response><|im_end|>\n'
    )


def test_template_renders_tools_detection(tiny_tokenizer):
    assert template_renders_tools(tiny_tokenizer)
    assert not template_renders_tools(tiny_tokenizer, "{% for m in messages %}{{ m.content }}{% endfor %}")


# ---- continuations ---------------------------------------------------------------------------------------
def _conversation() -> list[tuple[list[dict], str | None]]:
    """(new messages, assistant generation that follows them) steps of a two-user-turn dialogue."""
    return [
        (
            act_messages(DEFAULT_ROLE_PROMPTS, "Travel desk.", "Weather in Paris and Rome?"),
            sft_act_target([PARIS, ROME], "I'll check both."),
        ),
        (act_observation_messages([PARIS, ROME], [{"t": 21}, {"t": "25°C", "ok": True}]), "Paris 21, Rome 25°C."),
        ([{"role": "user", "content": "Book Paris for 2 nights."}], sft_act_target([BOOK])),
        (act_observation_messages([BOOK], [{"booking": "B-1"}]), "Booked: B-1."),
    ]


def test_stream_of_renders_and_continuations_equals_full_render(formatter):
    eot = formatter.end_of_turn_text
    history: list[dict] = []
    stream = ""
    for step, (new, generated) in enumerate(_conversation()):
        stream += formatter.render(new, TOOLS) if step == 0 else formatter.continuation(new, TOOLS)
        history += new
        assert stream == formatter.render(history, TOOLS, add_generation_prompt=True), f"step {step}"
        stream += generated + eot
        calls = parse_tool_calls(generated)
        history.append(
            _assistant(list(calls.calls), calls.content) if calls.calls else {"role": "assistant", "content": generated}
        )
    full = formatter.render(history, TOOLS, add_generation_prompt=False)
    assert full.startswith(stream) and full[len(stream) :].strip() == ""


def test_stream_token_ids_equal_encoding_of_full_render(formatter):
    eot = formatter.end_of_turn_text
    history: list[dict] = []
    ids: list[int] = []
    for step, (new, generated) in enumerate(_conversation()):
        text = formatter.render(new, TOOLS) if step == 0 else formatter.continuation(new, TOOLS)
        ids += formatter.encode(text) + formatter.encode(generated) + formatter.encode(eot)
        history += new + [{"role": "assistant", "content": generated}]
    full = formatter.render(history, TOOLS, add_generation_prompt=False)
    assert ids == formatter.encode(full[: len(formatter.decode(ids))])


def test_end_of_turn_ids(formatter):
    assert formatter.end_of_turn_text == "<|im_end|>"
    assert formatter.end_of_turn_token_ids[0] == formatter.encode("<|im_end|>")[0]
    assert all(isinstance(i, int) for i in formatter.end_of_turn_token_ids)


def test_history_rewriting_template_is_rejected(tiny_tokenizer):
    counting = (
        "{% for m in messages %}<|im_start|>{{ m.role }} of {{ messages|length }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateNotAppendOnlyError, match="not append-only"):
        ChatFormatter(tiny_tokenizer, template=counting)


def test_template_without_end_of_turn_token_is_rejected(tiny_tokenizer):
    bare = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="closes assistant turns"):
        ChatFormatter(tiny_tokenizer, template=bare)


def test_continuation_needs_messages(tiny_tokenizer):
    with pytest.raises(ValueError, match="new_messages is empty"):
        ChatFormatter(tiny_tokenizer).continuation([])


# ---- role prompts ----------------------------------------------------------------------------------------
def test_act_messages_structure():
    msgs = act_messages(DEFAULT_ROLE_PROMPTS, "", "Hello")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"].startswith("Work on the user's request")  # no blank line from an empty task text
    assert msgs[1]["content"] == "Hello"
    assert act_messages(DEFAULT_ROLE_PROMPTS, "Be brief.", "Hi")[0]["content"].startswith("Be brief.\n")


def test_act_observation_messages_are_compact_json_per_call():
    msgs = act_observation_messages([PARIS, ToolCall("x", {}, id="c9")], [{"a": [1, 2]}, ["é"]])
    assert [m["role"] for m in msgs] == ["tool", "tool"]
    assert [m["content"] for m in msgs] == ['{"a":[1,2]}', '["é"]']
    assert [m["name"] for m in msgs] == ["get_weather", "x"]
    assert msgs[1]["tool_call_id"] == "c9"
    with pytest.raises(ValueError, match="2 calls but 1 responses"):
        act_observation_messages([PARIS, ROME], [{}])


def test_rehearse_system_message_lists_tools_and_format_only():
    system = rehearse_system_message(DEFAULT_ROLE_PROMPTS, TOOLS)
    assert system["role"] == "system"
    text = system["content"]
    assert '{"name":"get_weather","description":"Current weather of a city"' in text
    assert '{"name":"book_hotel"' in text
    assert "<execution_result>\n{JSON object or array}\n</execution_result>" in text
    assert "Earlier calls" not in text  # no few-shot block: the history lives in the conversation


def test_rehearse_call_message_carries_conversation_call_and_schema():
    msg = call_message(DEFAULT_ROLE_PROMPTS, TOOLS, BOOK, [Said("user", "User wants  a\nhotel.")])
    assert msg["role"] == "user"
    lines = msg["content"].splitlines()
    assert lines[:2] == ["Conversation since the previous call:", "User: User wants a hotel."]
    assert "Call: book_hotel" in lines
    assert 'Arguments: {"city":"Paris","nights":2}' in lines
    assert any(line.startswith('Schema: {"name":"book_hotel"') for line in lines)
    unknown = call_message(DEFAULT_ROLE_PROMPTS, TOOLS, ToolCall("nope", {}), [])
    assert "Schema: null" in unknown["content"] and "(no new messages)" in unknown["content"]


def test_rehearse_stream_renders_without_tool_instructions(tiny_tokenizer):
    f = ChatFormatter(tiny_tokenizer)
    text = f.render(rehearse_context(DEFAULT_ROLE_PROMPTS, TOOLS, [Said("user", "q")], PARIS))
    assert "<tools>" not in text and text.endswith("<|im_start|>assistant\n")


def test_sft_targets_round_trip_through_wire_parsers():
    act = sft_act_target([PARIS], "ok")
    assert parse_tool_calls(act).calls == (PARIS,) and parse_tool_calls(act).content == "ok"
    assert parse_rehearsal(sft_rehearse_target([{"a": 1}])).result == [{"a": 1}]


def test_role_prompts_are_versioned_format_strings():
    assert isinstance(DEFAULT_ROLE_PROMPTS, RolePrompts) and DEFAULT_ROLE_PROMPTS.version
    custom = RolePrompts("test", "{task_system}!", "T:{tools}", "{name}|{arguments}|{schema}|{conversation}")
    assert (
        call_message(custom, (), PARIS, [Said("user", "c")])["content"] == 'get_weather|{"city":"Paris"}|null|User: c'
    )
