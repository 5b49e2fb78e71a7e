"""The verifiable scorer of the tool world.

Exact rule (``score_breakdown``):

1. **State.** The task-relevant state is the task's domain entry of the state (``state[task.domain]``)
   without its id counters (``next_ids``). ``state_match`` holds when the episode's final state and
   the task's expected state (the gold calls replayed on a fresh executor) agree there exactly. So a
   missing write, a wrong value and an unrequested extra write all fail; read-only calls never
   matter. Ids are part of the state: recreating an object after deleting a wrong one shifts its id
   and fails (document-level strictness, like a real backend audit).
2. **Answers.** For user turn ``t`` the key values are ``task.meta["answer_values"][t]``; each must be
   *mentioned* in ``final_answers[t]`` (a missing turn counts as an empty reply): after case-folding,
   collapsing whitespace and dropping thousands separators (``1,250`` → ``1250``) on both sides, the
   value occurs with no letter, digit or underscore directly before or after it (``150`` matches
   "$150." and "150.00" but not "1500"; ``evt_3`` does not match ``evt_30``): the one rule of
   ``envace.core.answers.mentions``, which the training rewards use too. Evaluation checks the gold
   literals: the real environment returns them.
3. **Score.** Strict (default): 1.0 when the state matches and every key value of every turn is
   mentioned, else 0.0. Partial credit (``partial_credit=True``): ``(state_match + found/total) / 2``
   (``found/total`` is 1 when a task has no key values); it equals 1.0 exactly when strict does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envace.core.answers import mentions
from envace.core.env import EpisodeResult, Task
from envace.envs.toolworld.state import COUNTERS_KEY

__all__ = ["ScoreBreakdown", "mentions", "relevant_state", "score", "score_breakdown"]


def relevant_state(task: Task, state: dict[str, Any]) -> dict[str, Any]:
    """The part of ``state`` the scorer compares: the task's domain without id counters."""
    domain_state = state.get(task.domain, {})
    if not isinstance(domain_state, dict):
        return {"<invalid>": domain_state}
    return {k: v for k, v in domain_state.items() if k != COUNTERS_KEY}


@dataclass(frozen=True)
class ScoreBreakdown:
    state_match: bool
    values_found: int
    values_total: int
    missing: tuple[tuple[int, str], ...]  # (user turn, value) pairs not mentioned

    @property
    def answers_ok(self) -> bool:
        return self.values_found == self.values_total

    @property
    def strict(self) -> float:
        return 1.0 if self.state_match and self.answers_ok else 0.0

    @property
    def partial(self) -> float:
        answer_fraction = self.values_found / self.values_total if self.values_total else 1.0
        return (float(self.state_match) + answer_fraction) / 2.0


def score_breakdown(task: Task, result: EpisodeResult) -> ScoreBreakdown:
    state_match = relevant_state(task, result.final_state) == relevant_state(task, task.expected_state)
    missing: list[tuple[int, str]] = []
    total = 0
    for turn, values in enumerate(task.meta.get("answer_values", [])):
        reply = result.final_answers[turn] if turn < len(result.final_answers) else ""
        for value in values:
            total += 1
            if not mentions(reply or "", value):
                missing.append((turn, value))
    return ScoreBreakdown(state_match, total - len(missing), total, tuple(missing))


def score(task: Task, result: EpisodeResult, partial_credit: bool = False) -> float:
    """Verifiable score in [0, 1] (strict success by default; see the module docstring)."""
    breakdown = score_breakdown(task, result)
    return breakdown.partial if partial_credit else breakdown.strict
