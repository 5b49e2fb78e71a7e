"""Checklist judges as engine reward functions: ``checklist_reward_fn(judge)(spec, trajectory)``.

A trajectory's ACT steps (``Trajectory.turns``) are turned back into an OpenAI-style conversation -
system prompt, each replayed user turn, one assistant message per ACT step (``act_text`` as content,
its calls as ``tool_calls``) and one tool message per response, rehearsed or real - which the judge
grades against the episode's checklists. The result follows the engines' ``RewardFn`` contract:
``(reward, status, info)``; with ``TrajectoryStatus.JUDGE_FAILED`` the reward (0.0) is a placeholder the
engine ignores: the trajectory is excluded from the loss and counted.

A response that is a JSON object with the key ``error_tool_call`` marks a tool-call error (CM2's
convention, ``envace.core.conversation``); plain ``{"error": ...}`` tool answers are ordinary responses.

``required_items_gate()`` enforces CM2's ``required_for_next_turn`` *during* a rollout (docs/method.md §6: the
episode ends after a turn whose required item did not pass): at the end of user turn t the rule judge
grades turn t's required items on the conversation so far (rehearsed or real responses, bound
arguments resolved against them). It answers only when every required item of the turn is
machine-checkable (the tool world writes a rule on each); otherwise it returns None and the rollout
goes on — the judge's full score then reports ``terminated_after`` and the engine drops the outputs
after that turn from the loss and the baselines (``truncate_after_turn``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from envace.core.checklist import Checklist
from envace.core.checklist_reward import continue_after_turn
from envace.core.records import Trajectory, TrajectoryStatus, Turn
from envace.judges.base import ChecklistJudge, evaluate_checklist
from envace.judges.rule import RuleJudge, item_rule


def trajectory_messages(spec: Any, trajectory: Trajectory) -> list[dict[str, Any]]:
    """The conversation a judge reads: ``spec`` gives ``system_prompt`` and ``user_turns``."""
    messages: list[dict[str, Any]] = []
    if spec.system_prompt:
        messages.append({"role": "system", "content": spec.system_prompt})
    user = -1
    for k, turn in enumerate(trajectory.turns):
        while user < turn.user_turn:
            user += 1
            messages.append({"role": "user", "content": spec.user_turns[user]})
        ids = [call.id or f"call_{k}_{j}" for j, call in enumerate(turn.tool_calls)]
        assistant: dict[str, Any] = {"role": "assistant", "content": turn.act_text}
        if turn.tool_calls:
            assistant["tool_calls"] = [
                {**call.to_openai(), "id": cid} for call, cid in zip(turn.tool_calls, ids, strict=True)
            ]
        messages.append(assistant)
        for cid, response in zip(ids, turn.responses, strict=False):
            content = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
            messages.append({"role": "tool", "tool_call_id": cid, "content": content})
    return messages


def spec_checklist(spec: Any) -> Checklist:
    """The checklist of an episode spec (``checklist`` object or CM2-format ``checklists`` dicts)."""
    checklist = getattr(spec, "checklist", None)
    if isinstance(checklist, Checklist):
        return checklist
    raw = getattr(spec, "checklists", ())
    if not raw:
        episode = getattr(spec, "task_id", getattr(spec, "uuid", "?"))
        raise ValueError(
            f"episode {episode!r} has no checklists; a checklist judge cannot score it "
            "(use judge=verifiable, or data whose rows carry CM2 checklists)"
        )
    return Checklist.from_raw([list(items) for items in raw])


def checklist_reward_fn(
    judge: ChecklistJudge,
) -> Callable[[Any, Trajectory], tuple[float, TrajectoryStatus, dict]]:
    """A reward function ``(spec, trajectory) -> (reward, status, info)`` backed by ``judge``."""

    def reward(spec: Any, trajectory: Trajectory) -> tuple[float, TrajectoryStatus, dict[str, Any]]:
        score, report = evaluate_checklist(judge, trajectory_messages(spec, trajectory), spec_checklist(spec))
        info = {
            "judge": judge.name,
            "turn_scores": list(score.turn_scores),
            "terminated_after": score.terminated_after,
            "judge_requests": report.n_requests,
            "judge_retries": report.n_retries,
            "judge_errors": report.n_errors,
            "judge_undecidable": report.n_undecidable,
        }
        return (score.reward if score.reward is not None else 0.0), score.status, info

    return reward


def required_items_gate(parse_pass_conditions: bool = True) -> Callable[[Any, Sequence[Turn], int], bool | None]:
    """A rollout turn gate ``(spec, turns so far, finished turn) -> False | True | None`` (module docstring)."""
    judge = RuleJudge(parse_pass_conditions=parse_pass_conditions)

    def gate(spec: Any, turns: Sequence[Turn], turn: int) -> bool | None:
        if not getattr(spec, "checklists", ()) and not isinstance(getattr(spec, "checklist", None), Checklist):
            return None
        checklist = spec_checklist(spec)
        if turn >= checklist.n_turns:
            return None
        items = checklist.turns[turn]
        required = [it for it in items if it.required_for_next_turn]
        if not required:
            return True
        if any(item_rule(it, parse_pass_conditions) is None for it in required):
            return None  # an LLM judge would be needed: decided after the episode instead
        partial = Trajectory(prompt_id=str(getattr(spec, "task_id", "")), sample_index=0, turns=tuple(turns))
        report = judge.judge(trajectory_messages(spec, partial), checklist, turns=[turn])
        return continue_after_turn(items, report.step_verdicts)

    return gate
