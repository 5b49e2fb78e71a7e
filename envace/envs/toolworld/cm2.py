"""Export of tool-world tasks to the raw CM2 row format, and the way back.

A row is ``{uuid, messages, tools, checklists}`` as in the CM2 release: ``messages`` is the gold
conversation — optional system message; per user turn the user message, then per gold step one
assistant message with OpenAI ``tool_calls`` (arguments as JSON strings, content "") followed by one
``tool`` message per call (JSON-string content, with ``tool_call_id`` and ``name``), then the final
assistant reply. Every message carries a ``tool_calls`` list, as CM2's do. ``checklists`` holds one
variant: ``[per_turn_items]``. Tool responses come from executing the gold calls on a fresh executor.

With ``include_state=True`` the row also carries ``"toolworld": {task_id, domain, split,
initial_state, expected_state, meta}`` so ``task_from_cm2_row`` restores the whole ``Task``.
"""

from __future__ import annotations

import json
from typing import Any

from envace.core.env import Task
from envace.core.records import ToolCall
from envace.envs.toolworld.executor import ToolWorldExecutor
from envace.envs.toolworld.oracle import oracle_transcript


def _message(role: str, content: str, tool_calls: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, "tool_calls": tool_calls or [], **extra}


def gold_messages(task: Task, include_system: bool = True) -> list[dict[str, Any]]:
    """The gold conversation in OpenAI chat format (tool responses from a real execution)."""
    transcripts = oracle_transcript(task, ToolWorldExecutor(task))
    messages = [_message("system", task.system_prompt)] if include_system and task.system_prompt else []
    for turn, user_text in enumerate(task.user_turns):
        messages.append(_message("user", user_text))
        responses = iter(transcripts[turn].responses)
        for step in task.gold_calls[turn]:
            messages.append(_message("assistant", "", [c.to_openai() for c in step]))
            for call in step:
                content = json.dumps(next(responses), sort_keys=True)
                messages.append(_message("tool", content, tool_call_id=call.to_openai()["id"], name=call.name))
        messages.append(_message("assistant", task.gold_answers[turn]))
    return messages


def to_cm2_row(task: Task, include_state: bool = False, include_system: bool = True) -> dict[str, Any]:
    row: dict[str, Any] = {
        "uuid": task.task_id,
        "messages": gold_messages(task, include_system),
        "tools": [json.loads(json.dumps(t)) for t in task.tools],
        "checklists": [[json.loads(json.dumps(list(items))) for items in task.checklists]],
    }
    if include_state:
        row["toolworld"] = json.loads(
            json.dumps(
                {
                    "task_id": task.task_id,
                    "domain": task.domain,
                    "split": task.split,
                    "initial_state": task.initial_state,
                    "expected_state": task.expected_state,
                    "meta": task.meta,
                }
            )
        )
    return row


def _parse_turns(messages: list[dict[str, Any]]) -> tuple[list[str], list[list[tuple[ToolCall, ...]]], list[str]]:
    users: list[str] = []
    steps: list[list[tuple[ToolCall, ...]]] = []
    answers: list[str] = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "user":
            users.append(message.get("content") or "")
            steps.append([])
            answers.append("")
        elif role == "assistant" and users:
            calls = message.get("tool_calls") or []
            if calls:
                steps[-1].append(tuple(_parse_call(c, position) for c in calls))
            else:
                answers[-1] = message.get("content") or ""
    return users, steps, answers


def _parse_call(entry: dict[str, Any], position: int) -> ToolCall:
    function = entry.get("function", {})
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as err:
        raise ValueError(f"CM2 row message {position}: tool call arguments are not JSON ({err})") from err
    return ToolCall(name=function.get("name", ""), arguments=arguments, id=entry.get("id"))


def task_from_cm2_row(row: dict[str, Any]) -> Task:
    """Rebuild a ``Task`` from a CM2 row (the full task when the row carries ``"toolworld"``)."""
    messages = row["messages"]
    users, steps, answers = _parse_turns(messages)
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    extra = row.get("toolworld", {})
    checklists = row.get("checklists") or [[]]
    return Task(
        task_id=extra.get("task_id", row["uuid"]),
        domain=extra.get("domain", ""),
        split=extra.get("split", ""),
        system_prompt=system,
        tools=tuple(row.get("tools", [])),
        user_turns=tuple(users),
        gold_calls=tuple(tuple(s) for s in steps),
        gold_answers=tuple(answers),
        checklists=tuple(tuple(items) for items in checklists[0]),
        initial_state=extra.get("initial_state", {}),
        expected_state=extra.get("expected_state", {}),
        meta=extra.get("meta", {}),
    )
