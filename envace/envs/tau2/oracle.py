"""The τ² oracle: a ``ChatBackend`` that replays each task's gold actions (``Task.gold_calls``).

A request is placed by its system message (tau2's agent prompt; in solo mode it holds the ticket) and,
outside solo mode, by the customer's first message (the scripted customer states the reason for the
call, ``Task.user_turns[0]``). The step is the number of agent messages since the start (solo) or since
the customer's first message. It answers gold step ``k`` with that one call; after the last one, with
the information the agent must communicate (or "Done."). In solo mode the last gold step is ``done``.
Among tasks with the same prompt, the one whose generation seed for this step equals the request's
seed is chosen (build the oracle with the adapter's ``seed`` and number of ``trials``).
"""

from __future__ import annotations

from collections.abc import Sequence

from envace.core.env import Task
from envace.core.prompts import Message
from envace.core.wire import render_tool_calls
from envace.envs.tau2.episode import generation_seed
from envace.inference.base import ChatOutput, ChatRequest, scripted_outputs


def _step(task: Task, messages: Sequence[Message]) -> int | None:
    """Agent steps already taken in ``messages`` (None when the request does not belong to ``task``)."""
    if task.meta.get("tau2_mode") == "solo":
        return sum(1 for m in messages if m.get("role") == "assistant")
    users = [i for i, m in enumerate(messages) if m.get("role") == "user" and m.get("content")]
    if not users or messages[users[0]].get("content") != task.user_turns[0]:
        return None
    return sum(1 for m in messages[users[0] + 1 :] if m.get("role") == "assistant")


class Tau2Oracle:
    """Replays the gold actions of τ² tasks (see the module docstring)."""

    def __init__(self, tasks: Sequence[Task], name: str = "oracle", seed: int = 0, trials: int = 1) -> None:
        self.name = name
        self.seed = seed
        self.trials = trials
        self._by_system: dict[str, list[Task]] = {}
        for task in tasks:
            self._by_system.setdefault(task.system_prompt, []).append(task)

    def find(self, request: ChatRequest) -> tuple[Task, int] | None:
        """The task of a request and the agent step it asks for."""
        messages = list(request.messages)
        system = next((str(m.get("content", "")) for m in messages if m.get("role") == "system"), "")
        found = [(t, s) for t in self._by_system.get(system, []) if (s := _step(t, messages)) is not None]
        if len(found) > 1:
            seeded = [
                (t, s)
                for t, s in found
                if request.seed in {generation_seed(self.seed, t.task_id, trial, s) for trial in range(self.trials)}
            ]
            found = seeded or found
        return found[0] if found else None

    def answer(self, request: ChatRequest) -> str:
        hit = self.find(request)
        if hit is None:
            return ""
        task, step = hit
        steps = task.gold_calls[0] if task.gold_calls else ()
        if step < len(steps):
            return render_tool_calls(steps[step])
        return (task.gold_answers[0] if task.gold_answers else "") or "Done."

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return scripted_outputs(self.answer, requests)
