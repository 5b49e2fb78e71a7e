"""Texts of the VitaBench loop (our own wording of the reference's roles): the agent's system prompt, the
opening greeting, the user simulator's instructions, and the stop markers.

Reference behaviour kept: the conversation opens with a fixed agent greeting; the agent's system prompt
carries the current time and weekday of the task's world and asks for ``###STOP###`` once the user needs
nothing more; the user simulator plays the persona, reveals the instruction gradually, never invents facts
and ends with ``###STOP###`` (``###TRANSFER###`` / ``###OUT-OF-SCOPE###`` also end the conversation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

STOP = "###STOP###"
STOP_MARKERS = (STOP, "###TRANSFER###", "###OUT-OF-SCOPE###")

GREETING = {"english": "Hello, how can I help you?", "chinese": "你好，请问需要什么服务？"}
_WEEKDAYS = {
    "english": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "chinese": ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"),
}

AGENT_PROMPT = {
    "english": (
        "# Environment\n- Current time: {time}\n"
        "# Using tools\n"
        "- Before calling a tool, make sure you know every argument: take it from the conversation, look it "
        "up with another tool, or ask the user.\n"
        "- Follow each tool's preconditions and postconditions.\n"
        "# Talking to the user\n"
        "- Say only what the conversation and tool results support; never make information up.\n"
        "- Work on what the user asked for; do not push them towards new requests.\n"
        "- When the request is done, ask whether they need anything else; if not, reply with ###STOP### to "
        "end the conversation."
    ),
    "chinese": (
        "# 环境\n- 当前时间：{time}\n"
        "# 工具\n"
        "- 调用工具前确认所有参数都已知：从对话中提取、用其他工具查询，或向用户询问。\n"
        "- 遵循每个工具的前置条件和后置条件。\n"
        "# 对话\n"
        "- 只陈述对话和工具结果能支持的内容，不要编造信息。\n"
        "- 专注于用户提出的需求，不要引导用户提出新需求。\n"
        "- 完成需求后询问用户是否还需要其他帮助；如果不需要，回复 ###STOP### 结束对话。"
    ),
}

USER_PROMPT = (
    "You play a customer talking to a service assistant. Stay in character for the whole conversation.\n"
    "<persona>\n"
    "{persona}\n"
    "</persona>\n"
    "<instructions>\n"
    "{instructions}\n"
    "</instructions>\n"
    "How to talk:\n"
    "- Write only your next message, a line or two, in {language}. Speak as the persona would (tone, patience, word "
    "choice).\n"
    "- Describe your situation, then what you need. Spread the details of the instructions over several messages, "
    "but make sure every detail is mentioned before the end, background included.\n"
    "- When a choice is needed, give the conditions and preferences from the instructions and ask the assistant to "
    "recommend.\n"
    "- Answer the assistant's questions from the persona and instructions only. If they hold no answer, say you "
    "don't know or don't remember; never invent order ids or other facts. If asked who you are, give your user id.\n"
    "- Keep to the needs as stated: do not broaden, replace or drop them, even if the assistant tries to talk you "
    "out of them. If the assistant offers to place an order for you, accept.\n"
    "- If the assistant asks again something you already answered several times, show impatience and refuse to "
    "repeat it.\n"
    "When to stop:\n"
    "- Not before you have expressed every need and constraint, and not while the assistant's results are missing, "
    "wrong or incomplete.\n"
    "- Once everything is done correctly, or the assistant states clearly that it cannot do it, reply with exactly "
    "###STOP###."
)


def weekday(time_text: str, language: str) -> str:
    try:
        day = datetime.strptime(time_text, "%Y-%m-%d %H:%M:%S").weekday()
    except ValueError:
        return ""
    return _WEEKDAYS.get(language, _WEEKDAYS["english"])[day]


def agent_system_prompt(time_text: str, language: str) -> str:
    return AGENT_PROMPT.get(language, AGENT_PROMPT["english"]).format(
        time=f"{time_text} {weekday(time_text, language)}".strip()
    )


def user_system_prompt(persona: Mapping[str, Any], instructions: str, language: str) -> str:
    return USER_PROMPT.format(
        persona=json.dumps(dict(persona), ensure_ascii=False),
        instructions=instructions,
        language="Chinese" if language == "chinese" else "English",
    )


def is_stop(text: str) -> bool:
    return any(marker in text for marker in STOP_MARKERS)


def flip_for_user(transcript: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The conversation as the user simulator sees it: agent texts become ``user``, its own ``assistant``;
    tool calls and tool results are hidden (as in the reference)."""
    out = []
    for message in transcript:
        role, text = message.get("role"), str(message.get("content") or "")
        if role == "user":
            out.append({"role": "assistant", "content": text})
        elif role == "assistant" and not message.get("tool_calls") and text:
            out.append({"role": "user", "content": text})
    return out
