"""The BFCL oracle: a ``ChatBackend`` that replays each task's gold (``Task.gold_*``, see ``data``).

It reads a request the way ``envace.evaluation.OracleBackend`` does — the task from its messages, the
user turn, the number of assistant steps since — but BFCL needs a sharper task lookup: the multi-turn
categories share their conversations (``base``, ``long_context`` and ``miss_param`` start alike, with
the same tools) and single-turn categories reuse questions. Among the tasks whose first user turn and
system text occur in the request, it keeps the one whose generation seed for this position equals the
request's seed (``episode.generation_seed``; build the oracle with the adapter's ``seed`` and number of
``trials``), else those whose documented functions are exactly the offered tools (or a subset, for
``miss_func`` after a holdout turn).

What it replays: AST entries — one call per gold function with the first allowed values; irrelevance —
a refusal; relevance — a call of the first documented function; multi-turn — each turn's gold calls in
one step, then "Done."; memory — the gold answer (prerequisite conversations get an empty reply).

``PerturbedOracle`` wraps it with deterministic mistakes (wrong values, missing or extra calls, malformed
blocks, thinking and chatter, empty replies), chosen by the request seed: a fixed, mixed set of outputs
for checking our scores against ``bfcl evaluate``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from envace.core.env import Task, gold_reply
from envace.core.prompts import Message, tool_function
from envace.core.records import ToolCall
from envace.core.wire import parse_tool_calls, render_tool_calls
from envace.envs.bfcl.episode import generation_seed
from envace.inference.base import ChatOutput, ChatRequest, scripted_outputs


def _tool_names(tools: Sequence[dict[str, Any]] | None) -> frozenset[str]:
    return frozenset(str(tool_function(t).get("name", "")) for t in tools or ())


def position(task: Task, messages: Sequence[Message]) -> tuple[int, int] | None:
    """(user turn, assistant steps since it) of a request in ``task``; None if no turn text occurs.

    User messages that are not the task's next turn text (injected notes, earlier messages of the first
    turn) are skipped."""
    turn, last = -1, -1
    for i, message in enumerate(messages):
        nxt = turn + 1
        if (
            message.get("role") == "user"
            and nxt < len(task.user_turns)
            and message.get("content") == task.user_turns[nxt]
        ):
            turn, last = nxt, i
    if turn < 0:
        return None
    return turn, sum(1 for m in messages[last + 1 :] if m.get("role") == "assistant")


class BfclOracle:
    """Replays the gold of BFCL tasks (see the module docstring)."""

    def __init__(self, tasks: Sequence[Task], name: str = "oracle", seed: int = 0, trials: int = 1) -> None:
        self.name = name
        self.seed = seed
        self.trials = trials
        self._by_first_turn: dict[str, list[Task]] = {}
        for task in tasks:
            if task.user_turns:
                self._by_first_turn.setdefault(task.user_turns[0], []).append(task)

    def _candidates(self, request: ChatRequest) -> list[tuple[Task, tuple[int, int]]]:
        messages = list(request.messages)
        system = next((str(m.get("content", "")) for m in messages if m.get("role") == "system"), "")
        users = dict.fromkeys(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        found = []
        for text in users:
            for task in self._by_first_turn.get(text, []):
                where = position(task, messages)
                if where is not None and task.system_prompt in system:
                    found.append((task, where))
        return found

    def find(self, request: ChatRequest) -> tuple[Task, tuple[int, int]] | None:
        """The task and position of a request (None when it belongs to no task)."""
        found = self._candidates(request)
        if len(found) > 1:
            seeded = [
                (t, w)
                for t, w in found
                if request.seed in {generation_seed(self.seed, t.task_id, trial, *w) for trial in range(self.trials)}
            ]
            found = seeded or found
        offered = _tool_names(request.tools)
        for narrow in (lambda t: _tool_names(t.tools) == offered, lambda t: _tool_names(t.tools) <= offered):
            if len(found) > 1 and any(narrow(t) for t, _ in found):
                found = [(t, w) for t, w in found if narrow(t)]
        return found[0] if found else None

    def answer(self, request: ChatRequest) -> str:
        hit = self.find(request)
        if hit is None:
            return ""
        task, (turn, step) = hit
        return gold_reply(task, turn, step)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return scripted_outputs(self.answer, requests)


def _altered(value: Any) -> Any:
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return [] if value else ["x"]


class PerturbedOracle:
    """``BfclOracle`` answers, perturbed by ``crc32(seed) % 6`` (0: kept, 1: first argument altered,
    2: last call dropped — or a stray call added, 3: thinking, chatter and a malformed extra block,
    4: empty reply, 5: trailing chatter)."""

    name = "perturbed-oracle"

    def __init__(self, oracle: BfclOracle) -> None:
        self.oracle = oracle

    @staticmethod
    def perturb(text: str, key: int) -> str:
        parse = parse_tool_calls(text)
        calls = list(parse.calls)
        mode = key % 6
        if mode == 1 and calls and calls[0].arguments:
            first = min(calls[0].arguments)
            calls[0] = ToolCall(calls[0].name, {**calls[0].arguments, first: _altered(calls[0].arguments[first])})
            return render_tool_calls(calls, parse.content)
        if mode == 2:
            return render_tool_calls(calls[:-1] or [ToolCall("get_weather", {"city": "Paris"})], parse.content)
        if mode == 3:
            return "<think>plan</think>Sure.\n" + render_tool_calls(calls) + "\n<tool_call>\n{oops\n</tool_call>"
        if mode == 4:
            return ""
        return text + ("\nAnything else?" if mode == 5 else "")

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        outputs = self.oracle.generate(requests)
        return [ChatOutput(self.perturb(o.text, zlib.crc32(str(r.seed).encode()))) for o, r in zip(outputs, requests)]
