"""Checklist judges as engine reward functions: ``checklist_reward_fn(judge)(spec, trajectory)``.

A trajectory's ACT steps (``Trajectory.turns``) are turned back into an OpenAI-style conversation -
system prompt, each replayed user turn, one assistant message per ACT step (``act_text`` as content,
its calls as ``tool_calls``) and one tool message per response, rehearsed or real - which the judge
grades against the episode's checklists. The result follows the engines' ``RewardFn`` contract:
``(reward, status, info)``; with ``TrajectoryStatus.JUDGE_FAILED`` the reward (0.0) is a placeholder the
engine ignores: the trajectory is excluded from the loss and counted.

A response that is a JSON object with the key ``error_tool_call`` marks a tool-call error (CM2's
convention, ``envace.core.checklist``); plain ``{"error": ...}`` tool answers are ordinary responses.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from envace.core.checklist import Checklist
from envace.core.records import Trajectory, TrajectoryStatus
from envace.judges.base import ChecklistJudge, evaluate_checklist


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
