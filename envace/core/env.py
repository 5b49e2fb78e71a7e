"""The one interface every environment / benchmark adapter implements.

An environment exposes tasks, makes a *real executor* per task, and scores an episode. The executor is
the only object that touches real state; rehearsal code (training-time REHEARSE role and test-time
private rehearsal) never receives it — it only ever sees tool schemas and the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envace.core.records import ToolCall
from envace.core.wire import render_tool_calls


@dataclass(frozen=True)
class Task:
    """One episode's specification.

    ``user_turns``: the user messages, replayed in order (1..3 for the tool world).
    ``gold_calls``: per user turn, a list of steps; each step is a tuple of calls issued together
    (parallel calls). ``gold_answers``: per user turn, the reference final reply text (may be "").
    ``checklists``: CM2-format, per user turn a list of items whose weights sum to 1.
    """

    task_id: str
    domain: str
    split: str
    system_prompt: str
    tools: tuple[dict[str, Any], ...]  # OpenAI function schemas {"type":"function","function":{...}}
    user_turns: tuple[str, ...]
    gold_calls: tuple[tuple[tuple[ToolCall, ...], ...], ...] = ()
    gold_answers: tuple[str, ...] = ()
    checklists: tuple[tuple[dict[str, Any], ...], ...] = ()
    initial_state: dict[str, Any] = field(default_factory=dict)
    expected_state: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def gold_reply(task: Task, turn: int, step: int) -> str:
    """The gold assistant message at (user turn, assistant step since it): that step's calls, rendered;
    once the turn's gold steps are used up, the turn's gold answer, or "Done." when it has none."""
    steps = task.gold_calls[turn] if turn < len(task.gold_calls) else ()
    if step < len(steps):
        return render_tool_calls(steps[step])
    answers = task.gold_answers
    return (answers[turn] if turn < len(answers) else "") or "Done."


@runtime_checkable
class Executor(Protocol):
    """Real execution of tool calls against one task's live state."""

    def execute(self, call: ToolCall) -> Any:
        """Run one call; return its JSON-able response. Invalid calls return ``{"error": ...}``."""
        ...

    def state(self) -> dict[str, Any]:
        """A JSON-able snapshot of the current state (for scoring and isolation tests)."""
        ...


@dataclass(frozen=True)
class EpisodeResult:
    """What a policy produced in one episode, as the scorer sees it."""

    final_answers: tuple[str, ...]  # the final reply text of each user turn ("" when none)
    calls: tuple[tuple[ToolCall, ...], ...] = ()  # per user turn, every call made, in order
    final_state: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    name: str

    def tasks(self, split: str) -> list[Task]: ...

    def make_executor(self, task: Task) -> Executor: ...

    def score(self, task: Task, result: EpisodeResult) -> float:
        """Verifiable score in [0, 1]."""
        ...
