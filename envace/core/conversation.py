"""OpenAI-style conversations as assistant steps grouped by user turn (what checklist judges grade).

"Tool-call error" means the harness-level marker CM2 uses - a tool message whose JSON object has the key
``error_tool_call`` (``TOOL_CALL_ERROR_KEY``) - or a step flagged ``tool_error=True`` by our own rollout.
An ``{"error": ...}`` returned by the *tool itself* is an ordinary response: CM2's annotated checklists
expect items about such responses to pass (the public sample's turn-0 item C1 asks precisely whether the
tool reported a type error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOOL_CALL_ERROR_KEY = "error_tool_call"


@dataclass(frozen=True)
class ConversationStep:
    """One assistant message of user turn ``turn`` (``step`` counts from 0 within the turn) and the
    tool messages that immediately follow it."""

    turn: int
    step: int
    message_index: int
    assistant: Mapping[str, Any]
    tool_messages: tuple[Mapping[str, Any], ...] = ()
    tool_error: bool = False


def json_or_text(content: Any) -> Any:
    """A message field as a JSON value: a string that parses as JSON, decoded; anything else as it is."""
    if isinstance(content, str):
        try:
            return json.loads(content)
        except (ValueError, RecursionError):
            return content
    return content


def is_tool_call_error(content: Any) -> bool:
    """True when a tool message's content carries the harness's tool-call error marker."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except (ValueError, RecursionError):
            return False
    return isinstance(content, Mapping) and TOOL_CALL_ERROR_KEY in content


_NOT_SET = (None, False, "", {}, [])


def is_error_response(response: Any) -> bool:
    """A tool response that reports a failure: a mapping whose ``error`` is set (not None, False or empty),
    or one carrying the harness's tool-call error marker (``TOOL_CALL_ERROR_KEY``). The checklist rules
    (``require_success``) and the fidelity scores (error agreement) both judge responses by it."""
    return isinstance(response, Mapping) and (response.get("error") not in _NOT_SET or TOOL_CALL_ERROR_KEY in response)


_THINK_BLOCK = re.compile(r"^\s*<think>(?P<thinking>.*?)</think>", re.DOTALL)


def split_thinking(content: Any) -> tuple[str, str]:
    """(thinking, user-visible reply) of assistant content; an unclosed ``<think>`` is all thinking.

    Content without think tags is all reply (CM2's reference treats it as thinking because its policy
    always thinks; small policies here often do not).
    """
    if not isinstance(content, str):
        return "", ""
    m = _THINK_BLOCK.match(content)
    if m:
        return m.group("thinking").strip(), content[m.end() :].strip()
    if "<think>" in content:
        return content.split("<think>", 1)[1].strip(), ""
    return "", content.strip()


def conversation_steps(messages: Sequence[Mapping[str, Any]]) -> tuple[ConversationStep, ...]:
    """Split an OpenAI-style conversation into assistant steps grouped by user turn.

    Assistant messages before the first user message belong to no turn and are skipped. A message
    with ``"tool_error": true`` (set by our rollouts) or an error-marked content flags its step.
    """
    steps: list[ConversationStep] = []
    turn, step = -1, 0
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role == "user":
            turn, step = turn + 1, 0
        elif role == "assistant" and turn >= 0:
            tools = []
            j = i + 1
            while j < len(messages) and messages[j].get("role") in ("tool", "observation"):
                tools.append(messages[j])
                j += 1
            error = any(bool(m.get("tool_error")) or is_tool_call_error(m.get("content")) for m in tools)
            steps.append(ConversationStep(turn, step, i, msg, tuple(tools), error))
            step += 1
    return tuple(steps)
