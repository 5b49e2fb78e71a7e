"""Test-time rehearsal prompts (docs/method.md §12): the versioned templates and what they are filled with.

``RehearsalPrompts`` holds the templates (critique, history note for sequential attempts, summary, memory
injection). The paper publishes none of these, so they are ours; each field is a ``str.format`` template
whose placeholders are checked at construction so that a Hydra override with a typo fails at start-up,
not mid-sweep. The rendering functions turn a ``RehearsalContext`` and ``AttemptRecord``s into the
compact, deterministic transcripts the critic, later sequential attempts and the summariser read, and
the memory into the note injected before the real turn.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.rehearsal import AttemptRecord, RehearsalContext
from envace.core.rehearsal_memory import MemoryBudget, RehearsalMemory
from envace.core.wire import strip_think

PROMPTS_VERSION = "rehearsal-v1"


_CRITIQUE_SYSTEM = (
    "You review a private rehearsal of a tool-using assistant. The tool results in the rehearsal were "
    "imagined, not real. Judge whether the assistant's plan would complete the user's requests, and say "
    "concretely what to do differently. Answer with exactly one block:\n"
    '<critique>{{"assessment": "<what went right or wrong>", "success_likely": true or false, '
    '"revision": "<concrete advice for the real attempt>"}}</critique>'
)
_CRITIQUE_USER = "Task:\n{task}\n\nRehearsal transcript:\n{transcript}\n\nWrite the critique now."
_HISTORY_NOTE = (
    "Earlier private rehearsals of this task (tool results were imagined) and their critiques. "
    "Improve on them:\n{history}"
)
_SUMMARY_SYSTEM = (
    "You condense private rehearsals of a task into a short memory for the assistant that will now "
    "perform the task for real. Keep only actionable lessons: which tools and arguments to use, in what "
    "order, pitfalls to avoid. At most {max_words} words. Answer inside <memory>...</memory>."
)
_SUMMARY_USER = "Task:\n{task}\n\nRehearsals:\n{attempts}\n\nWrite the memory now."
_MEMORY_NOTE = "Private rehearsal notes (from imagined runs; the real environment has not been touched yet):\n{memory}"


_TEMPLATE_FIELDS: dict[str, set[str]] = {
    "critique_system": set(),
    "critique_user": {"task", "transcript"},
    "history_note": {"history"},
    "summary_system": {"max_words"},
    "summary_user": {"task", "attempts"},
    "memory_note": {"memory"},
}


@dataclass(frozen=True)
class RehearsalPrompts:
    """Versioned prompt templates of test-time rehearsal (``str.format`` fields are checked)."""

    version: str = PROMPTS_VERSION
    critique_system: str = _CRITIQUE_SYSTEM
    critique_user: str = _CRITIQUE_USER
    history_note: str = _HISTORY_NOTE
    summary_system: str = _SUMMARY_SYSTEM
    summary_user: str = _SUMMARY_USER
    memory_note: str = _MEMORY_NOTE
    memory_role: str = "user"

    def __post_init__(self) -> None:
        for name, required in _TEMPLATE_FIELDS.items():
            template = getattr(self, name)
            try:
                found = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as exc:
                raise ValueError(f"RehearsalPrompts.{name} ({self.version}) is not a format string: {exc}") from None
            if found != required:
                raise ValueError(
                    f"RehearsalPrompts.{name} ({self.version}) has placeholders {sorted(found)}; expected "
                    f"exactly {sorted(required)} (escape literal braces as '{{{{' and '}}}}')"
                )
        if self.memory_role not in ("user", "system"):
            raise ValueError(f"RehearsalPrompts.memory_role={self.memory_role!r}: use 'user' or 'system'")


def clip(text: str, max_chars: int) -> str:
    """Deterministic clip to ``max_chars`` characters with an ellipsis."""
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "…"


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def render_task_brief(context: RehearsalContext, value_chars: int) -> str:
    lines = [f"Instructions: {clip(context.system_prompt.strip(), 4 * value_chars)}"]
    for offset, text in enumerate(context.user_turns):
        lines.append(f"User request {context.first_turn_index + offset + 1}: {clip(text, value_chars)}")
    return "\n".join(lines)


def render_attempt_transcript(attempt: AttemptRecord, context: RehearsalContext, value_chars: int) -> str:
    """Compact, deterministic transcript of one imagined attempt."""
    lines: list[str] = []
    shown_turn = -1
    for turn in attempt.turns:
        if turn.user_turn != shown_turn:
            shown_turn = turn.user_turn
            rel = shown_turn - context.first_turn_index
            if 0 <= rel < len(context.user_turns):
                lines.append(f"[user {shown_turn + 1}] {clip(context.user_turns[rel], value_chars)}")
        if not turn.tool_calls:
            lines.append(f"[assistant reply] {clip(turn.act_text.strip(), value_chars)}")
            continue
        for call, response in zip(turn.tool_calls, turn.responses):
            lines.append(f"[call] {call.name}({clip(_compact(call.arguments), value_chars)})")
            lines.append(f"[imagined result] {clip(_compact(response), value_chars)}")
    lines.append(f"[ended: {attempt.termination.value}]")
    return "\n".join(lines)


def render_attempt_with_critique(attempt: AttemptRecord, context: RehearsalContext, value_chars: int) -> str:
    head = f"Attempt {attempt.index + 1}:\n{render_attempt_transcript(attempt, context, value_chars)}"
    if attempt.critique is None:
        codes = ",".join(e.code.value for e in attempt.critique_errors) or "none"
        return f"{head}\nCritique: unavailable ({codes})"
    c = attempt.critique
    verdict = "likely success" if c.success_likely else "likely failure"
    return f"{head}\nCritique ({verdict}): {clip(c.assessment, value_chars)}\nRevision: {clip(c.revision, value_chars)}"


def critique_messages(
    prompts: RehearsalPrompts, context: RehearsalContext, attempt: AttemptRecord, value_chars: int
) -> tuple[dict[str, Any], ...]:
    transcript = render_attempt_transcript(attempt, context, value_chars)
    task = render_task_brief(context, value_chars)
    return (
        {"role": "system", "content": prompts.critique_system.format()},
        {"role": "user", "content": prompts.critique_user.format(task=task, transcript=transcript)},
    )


def history_message(
    prompts: RehearsalPrompts,
    context: RehearsalContext,
    previous: Sequence[AttemptRecord],
    value_chars: int,
) -> dict[str, Any] | None:
    """The note a sequential attempt k reads: attempts 1..k-1 with critiques (None for k = 1)."""
    if not previous:
        return None
    history = "\n\n".join(render_attempt_with_critique(a, context, value_chars) for a in previous)
    return {"role": prompts.memory_role, "content": prompts.history_note.format(history=history)}


def summary_word_limit(budget: MemoryBudget) -> int:
    limits = [150]
    if budget.max_tokens is not None:
        limits.append(max(1, (budget.max_tokens * 2) // 3))
    if budget.max_chars is not None:
        limits.append(max(1, budget.max_chars // 6))
    return min(limits)


def summary_messages(
    prompts: RehearsalPrompts,
    context: RehearsalContext,
    attempts: Sequence[AttemptRecord],
    budget: MemoryBudget,
    value_chars: int,
) -> tuple[dict[str, Any], ...]:
    rendered = "\n\n".join(render_attempt_with_critique(a, context, value_chars) for a in attempts)
    task = render_task_brief(context, value_chars)
    return (
        {"role": "system", "content": prompts.summary_system.format(max_words=summary_word_limit(budget))},
        {"role": "user", "content": prompts.summary_user.format(task=task, attempts=rendered)},
    )


def extract_memory_text(text: str) -> str:
    """The summariser's memory: the ``<memory>`` block when present, else the whole (think-free) text."""
    body = strip_think(text if isinstance(text, str) else "")
    start = body.find("<memory>")
    if start >= 0:
        body = body[start + len("<memory>") :]
        end = body.find("</memory>")
        body = body if end < 0 else body[:end]
    return body.strip()


def structured_memory(attempts: Sequence[AttemptRecord]) -> str:
    """Deterministic memory from the attempts and critiques (no generation)."""
    lines = []
    for a in attempts:
        calls = [c.name for t in a.turns for c in t.tool_calls]
        verdict = (
            "unreviewed"
            if a.critique is None
            else ("likely success" if a.critique.success_likely else "likely failure")
        )
        line = f"Attempt {a.index + 1} ({verdict}): calls {', '.join(calls) or 'none'}; ended {a.termination.value}."
        if a.critique is not None and a.critique.revision.strip():
            line += f" Advice: {a.critique.revision.strip()}"
        lines.append(line)
    return "\n".join(lines)


def memory_message(prompts: RehearsalPrompts, memory: RehearsalMemory) -> dict[str, Any] | None:
    """The note injected into the committed execution (None when there is no memory)."""
    if not memory.text:
        return None
    return {"role": prompts.memory_role, "content": prompts.memory_note.format(memory=memory.text)}
