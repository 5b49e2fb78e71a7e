"""The checklist reward of docs/method.md §4 (pure: no I/O, no judge calls).

A judge (``envace.judges``) returns one verdict per (assistant step, checklist item); this module turns
those verdicts into the trajectory reward:

    pass(t, i)  = 1 if ANY assistant step of user turn t passed item i, else 0
    R           = Σ_t Σ_i w_{t,i} · pass(t, i)  /  T          (T = number of checklist turns)

* Early termination: turns the episode never reached contribute 0 (the denominator stays T).
* ``required_for_next_turn``: if such an item did not pass in turn t, the episode ends after turn t
  (``continue_after_turn`` tells a rollout whether to replay the next user message); any verdicts for
  later turns are ignored.
* Tool-call errors: an item focused on ``assistant.tool_calls`` or ``tool.content`` fails at a step
  whose tool message reports a tool-call error (``envace.core.conversation``), whatever the judge said.
* A verdict that could not be obtained (judge error, or an item no configured judge could decide) makes
  the reward unknown: the score gets ``TrajectoryStatus.JUDGE_FAILED`` and ``reward=None`` - never 0.

Deliberate choices, where the CM2 reference code is loose or silent:
* An item whose verdicts are unknown at some step still passes if another step of the turn passed it
  (ANY semantics); it is unknown only when no step passed and at least one step was undecided.
* The reference silently scores judge failures 0 and stops the episode; we report JUDGE_FAILED so the
  trajectory is excluded from the loss and counted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from envace.core.checklist import Checklist, ChecklistItem
from envace.core.records import TrajectoryStatus


class Verdict(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNDECIDABLE = "undecidable"  # no configured judge can decide this item
    ERROR = "error"  # the judge was asked and failed (timeouts, malformed output, ...)


@dataclass(frozen=True)
class ItemVerdict:
    item_id: str
    verdict: Verdict
    source: str = ""  # "rule", "llm", "tool_error", ...
    analysis: str = ""


@dataclass(frozen=True)
class StepVerdicts:
    """Verdicts on one assistant step (one assistant message + its tool responses)."""

    turn: int
    step: int
    verdicts: tuple[ItemVerdict, ...]
    tool_error: bool = False

    def get(self, item_id: str) -> ItemVerdict | None:
        for v in self.verdicts:
            if v.item_id == item_id:
                return v
        return None


class ItemOutcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ChecklistScore:
    """The reward of one trajectory and how it came about."""

    reward: float | None  # None iff status is JUDGE_FAILED
    status: TrajectoryStatus
    turn_scores: tuple[float, ...]  # per checklist turn: Σ w·pass (0 for turns after termination)
    item_outcomes: tuple[tuple[ItemOutcome, ...], ...]  # per turn, per item (in checklist order)
    terminated_after: int | None  # turn after which a required item ended the episode
    n_unknown: int  # item outcomes that count and could not be decided

    @property
    def ok(self) -> bool:
        return self.status is TrajectoryStatus.OK


def step_forces_fail(item: ChecklistItem, tool_error: bool) -> bool:
    """True when ``item`` fails at a step regardless of the judge (tool-focused item, tool-call error)."""
    return tool_error and item.is_tool_focused


def item_outcomes_for_turn(items: Sequence[ChecklistItem], steps: Sequence[StepVerdicts]) -> tuple[ItemOutcome, ...]:
    """Per item of one turn: PASSED if any step passed it, UNKNOWN if none passed and one was undecided."""
    outcomes = []
    for item in items:
        outcome = ItemOutcome.FAILED
        for st in steps:
            if step_forces_fail(item, st.tool_error):
                continue
            v = st.get(item.id)
            if v is not None and v.verdict is Verdict.PASS:
                outcome = ItemOutcome.PASSED
                break
            if v is None or v.verdict in (Verdict.UNDECIDABLE, Verdict.ERROR):
                outcome = ItemOutcome.UNKNOWN
        outcomes.append(outcome)
    return tuple(outcomes)


def continue_after_turn(items: Sequence[ChecklistItem], steps: Sequence[StepVerdicts]) -> bool:
    """Whether the episode goes on to the next user turn: every required item of this turn passed.

    An undecided required item also stops the episode (its reward is unknown anyway: JUDGE_FAILED).
    """
    outcomes = item_outcomes_for_turn(items, steps)
    return all(o is ItemOutcome.PASSED for it, o in zip(items, outcomes) if it.required_for_next_turn)


def score_checklist(checklist: Checklist, step_verdicts: Iterable[StepVerdicts]) -> ChecklistScore:
    """R = Σ_turns Σ_items w·pass / number of checklist turns, with early termination (docs/method.md §4)."""
    if checklist.n_turns == 0:
        raise ValueError("score_checklist: the checklist has no turns; it cannot define a reward")
    by_turn: list[list[StepVerdicts]] = [[] for _ in checklist.turns]
    for sv in step_verdicts:
        if not 0 <= sv.turn < checklist.n_turns:
            raise ValueError(
                f"score_checklist: verdicts for turn {sv.turn}, but the checklist has turns "
                f"0..{checklist.n_turns - 1}; the conversation and the checklist do not match"
            )
        by_turn[sv.turn].append(sv)
    scores: list[float] = []
    outcomes_all: list[tuple[ItemOutcome, ...]] = []
    terminated_after: int | None = None
    n_unknown = 0
    for t, items in enumerate(checklist.turns):
        if terminated_after is not None:
            scores.append(0.0)
            outcomes_all.append((ItemOutcome.FAILED,) * len(items))
            continue
        outcomes = item_outcomes_for_turn(items, by_turn[t])
        n_unknown += sum(o is ItemOutcome.UNKNOWN for o in outcomes)
        scores.append(sum(it.weight for it, o in zip(items, outcomes) if o is ItemOutcome.PASSED))
        outcomes_all.append(outcomes)
        if not continue_after_turn(items, by_turn[t]):
            terminated_after = t
    failed = n_unknown > 0
    return ChecklistScore(
        reward=None if failed else sum(scores) / checklist.n_turns,
        status=TrajectoryStatus.JUDGE_FAILED if failed else TrajectoryStatus.OK,
        turn_scores=tuple(scores),
        item_outcomes=tuple(outcomes_all),
        terminated_after=terminated_after,
        n_unknown=n_unknown,
    )
