"""What every checklist judge shares: the interface, the report, tool-error auto-fail and the registry.

A judge reads a conversation (OpenAI-style messages) and a ``Checklist`` and returns one
``ItemVerdict`` per (assistant step, item of that step's turn), as ``StepVerdicts``. Turning verdicts
into a reward is ``envace.core.checklist_reward.score_checklist``; ``evaluate_checklist`` does both. Items
focused on ``assistant.tool_calls`` / ``tool.content`` at a step with a tool-call error fail without
asking anybody (``forced_verdict``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from envace.core.checklist import Checklist, ChecklistItem
from envace.core.checklist_reward import (
    ChecklistScore,
    ItemVerdict,
    StepVerdicts,
    Verdict,
    score_checklist,
    step_forces_fail,
)
from envace.core.conversation import ConversationStep, conversation_steps
from envace.core.registry import Registry

Messages = Sequence[Mapping[str, Any]]

# keyword settings of an LLM judge; judges without an LLM accept and ignore them (one config block for all)
LLM_SETTING_NAMES = frozenset(
    {
        "base_url",
        "model",
        "api_key_env",
        "timeout_s",
        "backend",
        "max_retries",
        "backoff_s",
        "max_backoff_s",
        "concurrency",
        "temperature",
        "max_new_tokens",
        "max_message_chars",
        "max_failure_rate",
        "failure_window",
    }
)


@dataclass(frozen=True)
class JudgeReport:
    """Verdicts of one conversation plus counters for monitoring."""

    step_verdicts: tuple[StepVerdicts, ...]
    n_requests: int = 0  # LLM requests sent (retries included)
    n_retries: int = 0
    n_errors: int = 0  # item verdicts that ended in Verdict.ERROR
    n_undecidable: int = 0  # item verdicts that ended in Verdict.UNDECIDABLE

    @property
    def complete(self) -> bool:
        """True when every (step, item) got PASS or FAIL."""
        return self.n_errors == 0 and self.n_undecidable == 0


@dataclass(frozen=True)
class JudgeCounters:
    n_requests: int = 0
    n_retries: int = 0

    def __add__(self, other: JudgeCounters) -> JudgeCounters:
        return JudgeCounters(self.n_requests + other.n_requests, self.n_retries + other.n_retries)


class ChecklistJudge(Protocol):
    name: str

    def judge(self, messages: Messages, checklist: Checklist, turns: Iterable[int] | None = None) -> JudgeReport:
        """Verdicts for every assistant step of the selected user turns (all turns when None)."""
        ...


def steps_to_judge(
    messages: Messages, checklist: Checklist, turns: Iterable[int] | None = None
) -> tuple[ConversationStep, ...]:
    """The conversation's assistant steps in the selected turns, checked against the checklist."""
    selected = None if turns is None else set(turns)
    steps = []
    for step in conversation_steps(messages):
        if step.turn >= checklist.n_turns:
            raise ValueError(
                f"judge: the conversation has user turn {step.turn} but the checklist only "
                f"{checklist.n_turns} turn(s); pass the checklist that belongs to this conversation"
            )
        if selected is None or step.turn in selected:
            steps.append(step)
    return tuple(steps)


def forced_verdict(item: ChecklistItem, step: ConversationStep) -> ItemVerdict | None:
    """FAIL for a tool-focused item at a step whose tool message reports a tool-call error."""
    if step_forces_fail(item, step.tool_error):
        return ItemVerdict(item.id, Verdict.FAIL, source="tool_error", analysis="the tool call failed")
    return None


def assemble_report(
    steps: Sequence[ConversationStep],
    verdicts: Mapping[tuple[int, str], ItemVerdict],
    checklist: Checklist,
    counters: JudgeCounters = JudgeCounters(),
) -> JudgeReport:
    """Group per-(message index, item id) verdicts into ``StepVerdicts`` in checklist item order."""
    out = []
    n_err = n_und = 0
    for step in steps:
        items = checklist.turns[step.turn]
        row = tuple(verdicts[(step.message_index, it.id)] for it in items)
        n_err += sum(v.verdict is Verdict.ERROR for v in row)
        n_und += sum(v.verdict is Verdict.UNDECIDABLE for v in row)
        out.append(StepVerdicts(step.turn, step.step, row, tool_error=step.tool_error))
    return JudgeReport(tuple(out), counters.n_requests, counters.n_retries, n_err, n_und)


def evaluate_checklist(
    judge: ChecklistJudge, messages: Messages, checklist: Checklist
) -> tuple[ChecklistScore, JudgeReport]:
    """Judge a whole conversation and aggregate the reward (JUDGE_FAILED when verdicts are missing)."""
    report = judge.judge(messages, checklist)
    return score_checklist(checklist, report.step_verdicts), report


# ---- registry -----------------------------------------------------------------------------------

JUDGES: Registry[Callable[..., ChecklistJudge]] = Registry(
    "judge", unknown="unknown judge {name!r}; valid judges: {known}"
)


def register_judge(name: str) -> Callable[[Callable[..., ChecklistJudge]], Callable[..., ChecklistJudge]]:
    """Decorator: make a judge factory available to ``get_judge(name, **kwargs)``."""
    return JUDGES.register(name)


def judge_names() -> list[str]:
    return JUDGES.names()


def get_judge(name: str, **kwargs: Any) -> ChecklistJudge:
    """Build the judge registered as ``name`` with ``kwargs``."""
    return JUDGES.get(name)(**kwargs)
