"""The REHEARSE context: what the rehearser sees when it is asked for one tool response (docs/method.md §2).

One builder serves every path that asks the REHEARSE role for a response — the local engine's rollout,
the verl episode, the world-model fidelity probe (also run inside training) and test-time rehearsal —
so the role is evaluated and used on exactly the layout it is trained on. Pure: no tokenizer, no I/O.

**History.** A REHEARSE request is built from the trajectory's own history, a sequence of events:

* ``Said("user", text)`` — a user turn; ``Said("assistant", text)`` — the ACT role's visible text (what
  it wrote outside tool-call blocks: a final reply, or prose before its calls). Empty texts are skipped.
* ``Answered(call, result, text)`` — an earlier call of this trajectory and the response it got, real or
  rehearsed. ``text`` is the rehearser's own raw output when it generated the answer (so a training
  stream keeps the tokens it sampled); otherwise the result is rendered as an ``<execution_result>``
  block.

**Layout** (a chat conversation, rendered without ``tools=``)::

    system     RolePrompts.rehearse_system: the role, the tool schemas, the output format
    user       call message of the 1st answered call      ┐ one pair per ``Answered``,
    assistant  its answer                                 ┘ in history order
    ...
    user       call message of the call to answer now
    (generation prompt)

A call message is ``RolePrompts.rehearse_call`` with ``{conversation}`` = the ``Said`` events that came
*after the previous call message* (so the whole conversation so far is shown exactly once, spread over
the call messages, and the stream stays append-only: adding events never changes earlier messages),
then the call's name, arguments and schema. At most ``context_tokens`` of conversation go into one call
message; beyond it the oldest messages are dropped first and the oldest kept one is cut at its start
(marked ``…``). Tokens are estimated as 4 characters each, without a tokenizer, so that every path —
including chat endpoints that expose none — renders the same text.

**Decisions where the paper is silent** (docs/method.md §2).

* No few-shot block in the system message, and no reference pairs of turns the trajectory played
  itself: after a played turn they would contradict what the rehearser answered in it. Reference
  (real) pairs appear only as the history they are — a real conversation that precedes the first turn
  being played (fidelity probes a real record; turn-scope test-time rehearsal starts from the real
  conversation so far), as ``Answered`` events at their place in the conversation.
* Responses a responder made up in place of the real executor's (``Turn.stand_ins``) are left out of
  a history built from records (``conversation_events(..., skip_stand_ins=True)``), as fidelity does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.conversation import json_or_text
from envace.core.prompts import Message, RolePrompts, compact_json, tool_function
from envace.core.records import ToolCall, Turn
from envace.core.wire import as_result_object, parse_tool_calls, render_rehearsal

DEFAULT_CONTEXT_TOKENS = 512  # conversation per call message (≈ 4 characters per token)
CHARS_PER_TOKEN = 4
_SPEAKERS = {"user": "User", "assistant": "Assistant"}


@dataclass(frozen=True)
class Said:
    """A visible conversation message: a user turn or the ACT role's text outside tool calls."""

    role: str  # "user" | "assistant"
    text: str

    def __post_init__(self) -> None:
        if self.role not in _SPEAKERS:
            raise ValueError(f"Said.role={self.role!r}: use 'user' or 'assistant'")


@dataclass(frozen=True)
class Answered:
    """An earlier call and its response (real or rehearsed); ``text``: the rehearser's raw output, if any."""

    call: ToolCall
    result: Any
    text: str | None = None

    def answer_text(self) -> str:
        return self.text if self.text is not None else render_rehearsal(as_result_object(self.result))


Event = Said | Answered


def visible_text(act_text: str) -> str:
    """The ACT text a reader of the conversation sees: the output without its tool-call blocks."""
    return parse_tool_calls(act_text).content.strip()


def conversation_events(
    user_turns: Sequence[str],
    turns: Sequence[Turn],
    *,
    upto_turn: int | None = None,
    first_turn: int = 0,
    skip_stand_ins: bool = False,
) -> list[Event]:
    """The history events of recorded ``turns`` (user turns interleaved at their place).

    ``upto_turn``: also emit the user messages of turns up to it that have no record yet (the turn
    being played). ``first_turn``: index of ``user_turns[0]`` in the dialogue (a rehearsal attempt that
    starts mid-conversation).
    """
    events: list[Event] = []
    shown = first_turn - 1

    def user_until(turn: int) -> None:
        nonlocal shown
        while shown < turn:
            shown += 1
            if 0 <= shown - first_turn < len(user_turns):
                events.append(Said("user", user_turns[shown - first_turn]))

    for t in turns:
        user_until(t.user_turn)
        text = visible_text(t.act_text)
        if text:
            events.append(Said("assistant", text))
        for i, (call, response) in enumerate(zip(t.tool_calls, t.responses)):
            if skip_stand_ins and i in t.stand_ins:
                continue
            events.append(Answered(call, response))
    if upto_turn is not None:
        user_until(upto_turn)
    return events


def events_from_messages(messages: Sequence[Mapping[str, Any]]) -> list[Event]:
    """History events of an OpenAI-style conversation (system messages skipped; a tool message answers the
    call with its ``tool_call_id``, else the oldest unanswered one; its content is JSON-decoded when it can be)."""
    events: list[Event] = []
    waiting: list[tuple[str | None, ToolCall]] = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            events.append(Said("user", str(m.get("content") or "")))
        elif role == "assistant":
            text = visible_text(str(m.get("content") or ""))
            if text:
                events.append(Said("assistant", text))
            for raw in m.get("tool_calls") or ():
                waiting.append((raw.get("id"), _call_of(raw)))
        elif role == "tool" and waiting:
            index = next((i for i, (cid, _) in enumerate(waiting) if cid and cid == m.get("tool_call_id")), 0)
            _, call = waiting.pop(index)
            events.append(Answered(call, json_or_text(m.get("content"))))
    return [e for e in events if not (isinstance(e, Said) and not e.text.strip())]


def _call_of(raw: Mapping[str, Any]) -> ToolCall:
    fn = raw.get("function", raw)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        args = json_or_text(args)
    return ToolCall(str(fn.get("name", "")), args if isinstance(args, dict) else {"_raw": args}, id=raw.get("id"))


def _clip(lines: list[str], budget_chars: int) -> list[str]:
    """Keep the newest lines within ``budget_chars``; the oldest kept one may be cut at its start."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        room = budget_chars - used
        if room <= 0:
            break
        if len(line) > room:
            kept.append("…" + line[len(line) - room + 1 :] if room > 1 else "…")
            break
        kept.append(line)
        used += len(line) + 1
    return list(reversed(kept))


def conversation_text(said: Sequence[Said], context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> str:
    """``Speaker: text`` lines (whitespace collapsed), newest within the budget; ``(no new messages)``."""
    lines = [f"{_SPEAKERS[s.role]}: {' '.join(s.text.split())}" for s in said if s.text.strip()]
    kept = _clip(lines, max(0, context_tokens) * CHARS_PER_TOKEN)
    return "\n".join(kept) if kept else "(no new messages)"


def rehearse_system_message(prompts: RolePrompts, tools: Sequence[Mapping[str, Any]]) -> Message:
    """The REHEARSE system message: the role, one compact schema per tool, the output format."""
    tool_lines = "\n".join(compact_json(dict(tool_function(t))) for t in tools) or "(none)"
    return {"role": "system", "content": prompts.rehearse_system.format(tools=tool_lines)}


def call_message(
    prompts: RolePrompts,
    tools: Sequence[Mapping[str, Any]],
    call: ToolCall,
    said: Sequence[Said],
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> Message:
    """The user message asking for the response to ``call`` after the conversation messages ``said``.

    An unknown tool's schema is written as ``null``; the loops never ask for one (``envace.core.unknown_tool``
    answers such calls), but a history may hold one, and its call message is written the same way.
    """
    schema = next((t for t in tools if tool_function(t).get("name") == call.name), None)
    text = prompts.rehearse_call.format(
        conversation=conversation_text(said, context_tokens),
        name=call.name,
        arguments=compact_json(call.arguments),
        schema=compact_json(dict(tool_function(schema))) if schema is not None else "null",
    )
    return {"role": "user", "content": text}


def _pending_said(history: Sequence[Event]) -> list[Said]:
    """The ``Said`` events after the last ``Answered`` one (what the next call message carries)."""
    pending: list[Said] = []
    for event in history:
        if isinstance(event, Answered):
            pending = []
        else:
            pending.append(event)
    return pending


def next_call_message(
    prompts: RolePrompts,
    tools: Sequence[Mapping[str, Any]],
    history: Sequence[Event],
    call: ToolCall,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> Message:
    """The last message of ``rehearse_context(...)``: what an append-only stream appends for ``call``."""
    return call_message(prompts, tools, call, _pending_said(history), context_tokens)


def stream_text(
    fmt: Any, prompts: RolePrompts, tools: Sequence[Mapping[str, Any]], message: Message, after_generation: bool
) -> str:
    """The text an append-only REHEARSE token stream appends for a call ``message`` (then the generation
    prompt): a ``ChatFormatter.continuation`` after a generation, else — the stream still ends with the
    system prompt — the rendered difference, checked to leave the system prompt as it was."""
    if after_generation:
        return fmt.continuation([message])
    base = [rehearse_system_message(prompts, tools)]
    before = fmt.render(base, None, add_generation_prompt=False)
    after = fmt.render([*base, message], None, add_generation_prompt=True)
    if not after.startswith(before):
        raise ValueError(f"chat template of {fmt.name} rewrites the REHEARSE system prompt")
    return after[len(before) :]


def rehearse_context(
    prompts: RolePrompts,
    tools: Sequence[Mapping[str, Any]],
    history: Sequence[Event],
    call: ToolCall,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> list[Message]:
    """The full REHEARSE conversation asking for ``call``'s response (layout in the module docstring)."""
    messages: list[Message] = [rehearse_system_message(prompts, tools)]
    said: list[Said] = []
    for event in history:
        if isinstance(event, Said):
            said.append(event)
            continue
        messages.append(call_message(prompts, tools, event.call, said, context_tokens))
        messages.append({"role": "assistant", "content": event.answer_text()})
        said = []
    messages.append(call_message(prompts, tools, call, said, context_tokens))
    return messages
