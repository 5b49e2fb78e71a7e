"""Chat rendering and the two role prompts (pure: no file or network I/O; takes a tokenizer object).

Three things live here:

1. ``CHATML_TOOL_TEMPLATE`` — a ChatML Jinja chat template with Hermes/Qwen-style tools. Tools are
   listed in the system turn inside ``<tools></tools>`` (one JSON schema per line); assistant
   ``tool_calls`` render as ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`` blocks
   (byte-identical to ``envace.core.wire.render_tool_calls`` for dict arguments without reserved
   tags; an ``arguments`` *string* is written verbatim); consecutive ``tool`` messages are grouped
   into one ``user`` turn of ``<tool_response>`` blocks; the generation prompt is
   ``<|im_start|>assistant\\n``. Every turn is closed by ``<|im_end|>\\n``, so the template is
   append-only (rendering more messages never changes the text of earlier ones).

2. ``ChatFormatter`` — renders/encodes with a tokenizer and computes ``continuation``: the exact
   text to append to a token stream whose last piece is an assistant generation that ended with
   the end-of-turn token, so that the stream continues with new messages and the next generation
   prompt. It is computed by rendering a probe conversation with and without the new messages and
   taking the difference, after checking that the template is append-only (else a
   ``TemplateNotAppendOnlyError`` names the template and what changed).

3. Role prompts (``RolePrompts``, versioned), the builders of the ACT stream, and the exact SFT target
   texts of both roles (rendered with ``envace.core.wire``). The REHEARSE conversation is laid out by
   ``envace.core.rehearse_context`` (one builder for every path).

The REHEARSE stream is rendered **without** ``tools=``: its system message already lists the tool
schemas, and the tool-calling instructions of the template would contradict the rehearser's job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.records import ToolCall
from envace.core.wire import render_rehearsal, render_tool_calls

CHATML_TOOL_TEMPLATE = r"""
{%- set ns = namespace(system="", start=0) -%}
{%- if messages and messages[0].role == "system" -%}
  {%- set ns.system = messages[0].content or "" -%}
  {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
  {{- "<|im_start|>system\n" -}}
  {%- if ns.system -%}{{- ns.system + "\n\n" -}}{%- endif -%}
  {{- "# Tools\nFunctions you can call (JSON schemas):\n<tools>" -}}
  {%- for tool in tools -%}
    {{- "\n" + ((tool.function if tool.function is defined else tool) | tojson) -}}
  {%- endfor -%}
  {{- "\n</tools>\nTo call functions, reply with one block per call:\n<tool_call>\n" -}}
  {{- '{"name": <function name>, "arguments": <JSON object>}' -}}
  {{- "\n</tool_call><|im_end|>\n" -}}
{%- elif ns.start == 1 -%}
  {{- "<|im_start|>system\n" + ns.system + "<|im_end|>\n" -}}
{%- endif -%}
{%- for m in messages[ns.start:] -%}
  {%- if m.role == "tool" -%}
    {%- if loop.first or loop.previtem.role != "tool" -%}{{- "<|im_start|>user" -}}{%- endif -%}
    {%- set body = m.content if m.content is string else (m.content | tojson) -%}
    {{- "\n<tool_response>\n" + body + "\n</tool_response>" -}}
    {%- if loop.last or loop.nextitem.role != "tool" -%}{{- "<|im_end|>\n" -}}{%- endif -%}
  {%- elif m.role == "assistant" -%}
    {{- "<|im_start|>assistant\n" -}}
    {%- if m.content -%}{{- m.content -}}{%- endif -%}
    {%- for call in (m.tool_calls or []) -%}
      {%- if m.content or not loop.first -%}{{- "\n" -}}{%- endif -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}
      {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' + args + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- "<|im_end|>\n" -}}
  {%- else -%}
    {{- "<|im_start|>" + m.role + "\n" + (m.content or "") + "<|im_end|>\n" -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\n" -}}{%- endif -%}
""".strip()

# markers of the probe conversation used by ChatFormatter.continuation (never shown to a model)
_PROBE_USER = "ENVACE_PROBE_USER_7f3a"
_PROBE_REPLY = "ENVACE_PROBE_REPLY_7f3a"
_PROBE_TOOL = "envace_probe_tool"
_END_OF_TURN_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")

Message = dict[str, Any]  # one chat message as chat templates take it (role, content, tool_calls, ...): envace-wide


class TemplateNotAppendOnlyError(ValueError):
    """The chat template rewrites earlier turns when messages are appended."""


def compact_json(value: Any) -> str:
    """JSON without spaces after separators, non-ASCII kept (short contexts for small models)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tool_function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The function schema of an OpenAI tool entry (``{"type": "function", "function": {...}}``) or bare schema."""
    inner = tool.get("function")
    return inner if isinstance(inner, Mapping) else tool


def probe_tool_schema() -> dict[str, Any]:
    """A dummy tool used to detect whether a chat template renders ``tools=``."""
    return {
        "type": "function",
        "function": {"name": _PROBE_TOOL, "description": "probe", "parameters": {"type": "object", "properties": {}}},
    }


def template_renders_tools(tokenizer: Any, template: str | None = None) -> bool:
    """True when the tokenizer's (or the given) chat template writes tool schemas into the prompt."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            tools=[probe_tool_schema()],
            chat_template=template,
            add_generation_prompt=True,
            tokenize=False,
        )
    except Exception:  # noqa: BLE001 - any template failure means "does not render tools"
        return False
    return _PROBE_TOOL in text


class ChatFormatter:
    """Renders chat messages with a tokenizer's chat template and cuts append-only continuations.

    Args:
        tokenizer: a HF tokenizer (anything with ``apply_chat_template`` and ``__call__``).
        template: a Jinja chat template overriding the tokenizer's own (``CHATML_TOOL_TEMPLATE`` …).
        verify: check at construction that the template is append-only for tool responses and for
            user messages (raises ``TemplateNotAppendOnlyError`` otherwise).
    """

    def __init__(self, tokenizer: Any, template: str | None = None, *, verify: bool = True) -> None:
        self.tokenizer = tokenizer
        self.template = template
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"ChatFormatter: tokenizer {self.name!r} has no chat template and none was given; "
                "pass template=CHATML_TOOL_TEMPLATE (envace.core.prompts)"
            )
        self.end_of_turn_text = self._detect_end_of_turn_text()
        self.end_of_turn_token_ids = self._end_of_turn_ids()
        if verify:
            self.continuation([{"role": "tool", "content": "{}"}], tools=[probe_tool_schema()])
            self.continuation([{"role": "user", "content": "next"}])

    @property
    def name(self) -> str:
        """Where the template comes from (for error messages)."""
        source = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
        return f"{source} ({'override template' if self.template is not None else 'own template'})"

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of ``messages`` (tools in OpenAI function-schema format)."""
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as written (special-token strings map to their ids; no BOS/EOS added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens kept."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def continuation(self, new_messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Text that continues a stream ending in an assistant generation (incl. its end-of-turn token).

        The result renders ``new_messages`` (tool responses and/or a user message) followed by the
        assistant generation prompt. Raises ``TemplateNotAppendOnlyError`` when the template rewrites
        the earlier conversation once the new messages are added.
        """
        if not new_messages:
            raise ValueError("ChatFormatter.continuation: new_messages is empty; pass at least one message")
        probe = _probe_conversation(calls=new_messages[0].get("role") == "tool")
        before = self.render(probe, tools, add_generation_prompt=False)
        after = self.render([*probe, *new_messages], tools, add_generation_prompt=True)
        cut = self._end_of_probe_reply(before)
        if after[:cut] != before[:cut]:
            raise TemplateNotAppendOnlyError(
                f"chat template of {self.name} is not append-only: adding "
                f"{[m.get('role') for m in new_messages]} messages changes the text of the earlier turns "
                f"(before: {before[:cut][-200:]!r}; after: {after[:cut][-200:]!r}). Use "
                "template=CHATML_TOOL_TEMPLATE or a template that never rewrites history."
            )
        return after[cut:]

    def _end_of_probe_reply(self, text: str) -> int:
        """Index just past the end-of-turn token closing the probe's assistant reply."""
        start = text.rfind(_PROBE_REPLY)
        end = text.find(self.end_of_turn_text, start + len(_PROBE_REPLY)) if start >= 0 else -1
        if end < 0:
            raise TemplateNotAppendOnlyError(
                f"chat template of {self.name} does not render the assistant reply followed by "
                f"{self.end_of_turn_text!r}; cannot cut continuations. Rendered: {text[-300:]!r}"
            )
        return end + len(self.end_of_turn_text)

    def _detect_end_of_turn_text(self) -> str:
        """The special-token string the template closes an assistant turn with."""
        text = self.render(_probe_conversation(calls=False), add_generation_prompt=False)
        tail = text[text.rfind(_PROBE_REPLY) + len(_PROBE_REPLY) :]
        eos = getattr(self.tokenizer, "eos_token", None)
        candidates = [c for c in (*_END_OF_TURN_CANDIDATES, eos) if c and c in tail]
        if not candidates:
            raise ValueError(
                f"chat template of {self.name} closes assistant turns with none of "
                f"{[*_END_OF_TURN_CANDIDATES, eos]}; rendered tail {tail[:100]!r}. Set the tokenizer's "
                "eos_token to the template's end-of-turn token."
            )
        return min(candidates, key=tail.find)

    def _end_of_turn_ids(self) -> tuple[int, ...]:
        """Ids that end a generation: the detected end-of-turn token and the tokenizer's eos."""
        ids: list[int] = []
        for text in (self.end_of_turn_text, getattr(self.tokenizer, "eos_token", None)):
            if not text:
                continue
            encoded = self.encode(text)
            if len(encoded) == 1 and encoded[0] not in ids:
                ids.append(encoded[0])
        if not ids:
            raise ValueError(
                f"tokenizer {self.name}: end-of-turn text {self.end_of_turn_text!r} is not a single token; "
                "add it as a special token"
            )
        return tuple(ids)


def _probe_conversation(*, calls: bool) -> list[Message]:
    """user → assistant (marker reply, optionally with a tool call): the dummy prefix of continuations."""
    # the thought makes templates that drop earlier reasoning (Qwen3-style) fail the append-only check
    reply: Message = {"role": "assistant", "content": f"<think>\nprobe\n</think>\n\n{_PROBE_REPLY}"}
    if calls:
        reply["tool_calls"] = [{"id": "call_0", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": {}}}]
    return [{"role": "user", "content": _PROBE_USER}, reply]


# ---- role prompts ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RolePrompts:
    """The texts that switch the one policy between its two roles (``str.format`` templates).

    Fields:
        act_system: ACT system message; fields ``{task_system}`` (the task's own system text).
        rehearse_system: REHEARSE system message; field ``{tools}`` (one compact JSON schema per line).
        rehearse_call: REHEARSE user message for one call; fields ``{conversation}`` (the conversation
            messages since the previous call message), ``{name}``, ``{arguments}`` and ``{schema}``.
            ``envace.core.rehearse_context`` lays the REHEARSE conversation out from them.
    Bump ``version`` whenever a text changes: it is logged with every run.
    """

    version: str
    act_system: str
    rehearse_system: str
    rehearse_call: str


DEFAULT_ROLE_PROMPTS = RolePrompts(
    version="v2",
    act_system=(
        "{task_system}\n"
        "Work on the user's request step by step. Call tools when you need information or must change "
        "something; when the request is done, answer the user directly without a tool call."
    ),
    rehearse_system=(
        "You are the execution backend of a tool-using application. You get one tool call at a time and "
        "return the response the real tool would return: consistent with its schema and with every "
        "earlier result of this session, and an error object when the call is invalid.\n"
        "Tools:\n{tools}\n"
        "Answer each call with exactly one block:\n"
        "<execution_result>\n{{JSON object or array}}\n</execution_result>\n"
        "You may reason briefly inside <think></think> before it."
    ),
    rehearse_call=(
        "Conversation since the previous call:\n{conversation}\n"
        "Call: {name}\n"
        "Arguments: {arguments}\n"
        "Schema: {schema}\n"
        "Return the result of this call."
    ),
)


def act_messages(prompts: RolePrompts, task_system: str, user_message: str) -> list[Message]:
    """Initial ACT-stream messages: role system prompt (with the task's system text), first user turn.

    Render them with ``tools=`` (the task's tool schemas) and the generation prompt.
    """
    system = prompts.act_system.format(task_system=task_system).strip()
    return [{"role": "system", "content": system}, {"role": "user", "content": user_message}]


def act_observation_messages(calls: Sequence[ToolCall], responses: Sequence[Any]) -> list[Message]:
    """One ``tool`` message per call (content = compact JSON of its response), in call order."""
    if len(calls) != len(responses):
        raise ValueError(
            f"act_observation_messages: {len(calls)} calls but {len(responses)} responses; "
            "every tool call needs exactly one response"
        )
    messages: list[Message] = []
    for i, (call, response) in enumerate(zip(calls, responses, strict=True)):
        messages.append(
            {
                "role": "tool",
                "name": call.name,
                "tool_call_id": call.id or f"call_{i}",
                "content": compact_json(response),
            }
        )
    return messages


def sft_act_target(calls: Sequence[ToolCall], content: str = "") -> str:
    """Exact ACT target text (what follows the generation prompt, before the end-of-turn token)."""
    return render_tool_calls(calls, content)


def sft_rehearse_target(result: dict[str, Any] | list[Any]) -> str:
    """Exact REHEARSE target text (what follows the generation prompt, before the end-of-turn token)."""
    return render_rehearsal(result)
