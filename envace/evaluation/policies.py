"""Policies to evaluate, selected by name: ``hf`` (local model), ``openai`` (any OpenAI-compatible
endpoint) and ``oracle`` (replays the ground truth). All three are ``ChatBackend``s.

The oracle is stateless: it reads the conversation of each request, finds the task (system text, then
the task whose user turns match the most user messages in order — several tasks may share a first
request), the current user turn (the last user message equal to one of the task's user
turns — injected notes such as the rehearsal memory are skipped) and the number of assistant messages
since that turn, then answers with the next gold step's calls, or with the turn's gold answer when the
gold steps are used up. Tasks may share their requests but differ in state; given ``make_executor``,
the oracle tells them apart by the tool responses seen so far. On a task's real executor it must score
100% (a test), which also validates the environment's gold data. It answers any request it cannot place
(critique or summary prompts) with an empty string, which downstream parsers record as failures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envace.core.env import Executor, Task, gold_reply
from envace.core.prompts import compact_json
from envace.inference.base import ChatBackend, ChatOutput, ChatRequest, scripted_outputs
from envace.inference.openai_client import OpenAIChatBackend

PolicyFactory = Callable[..., ChatBackend]


class OracleBackend:
    """Replays each task's gold calls and answers (see the module docstring).

    ``make_executor``: when given, each task's gold calls are replayed once on a *fresh* executor of the
    oracle's own, and the expected tool responses disambiguate tasks that share their user requests but
    not their initial state (the evaluated episode's executor is never touched).
    """

    def __init__(
        self, tasks: Sequence[Task], name: str = "oracle", make_executor: Callable[[Task], Executor] | None = None
    ) -> None:
        self.name = name
        self._by_first_turn: dict[str, list[Task]] = {}
        self._responses: dict[int, list[str]] = {}
        for task in tasks:
            if task.user_turns:
                self._by_first_turn.setdefault(task.user_turns[0], []).append(task)
            if make_executor is not None:
                executor = make_executor(task)
                self._responses[id(task)] = [
                    compact_json(executor.execute(c)) for turn in task.gold_calls for step in turn for c in step
                ]

    def _fit(self, task: Task, system: str, users: list[str], tool_texts: list[str]) -> tuple[int, int]:
        """(user turns matched in order, tool responses matched in order); (0, 0) when inconsistent."""
        if task.system_prompt not in system:
            return (0, 0)
        own = [u for u in users if u in task.user_turns]
        if own != list(task.user_turns[: len(own)]):
            return (0, 0)
        expected = self._responses.get(id(task))
        if expected is None:
            return (len(own), 0)
        if tool_texts != expected[: len(tool_texts)]:
            return (0, 0)
        return (len(own), len(tool_texts))

    def _find_task(self, messages: Sequence[dict[str, Any]]) -> Task | None:
        """The task that explains the most user messages (then tool responses), in order; ties: first."""
        system = next((str(m.get("content", "")) for m in messages if m.get("role") == "system"), "")
        users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
        tools = [str(m.get("content", "")) for m in messages if m.get("role") == "tool"]
        best, best_fit = None, (0, 0)
        for task in {id(t): t for text in users for t in self._by_first_turn.get(text, [])}.values():
            fit = self._fit(task, system, users, tools)
            if fit[0] > 0 and fit > best_fit:
                best, best_fit = task, fit
        return best

    def answer(self, request: ChatRequest) -> str:
        messages = list(request.messages)
        task = self._find_task(messages)
        if task is None:
            return ""
        turn_at = [i for i, m in enumerate(messages) if m.get("role") == "user" and m.get("content") in task.user_turns]
        if not turn_at:
            return ""
        last = turn_at[-1]
        turn = task.user_turns.index(messages[last]["content"])
        step = sum(1 for m in messages[last + 1 :] if m.get("role") == "assistant")
        return gold_reply(task, turn, step)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return scripted_outputs(self.answer, requests)


def _hf_policy(**kwargs: Any) -> ChatBackend:
    # lazy: the local HF backend loads torch, transformers and the local engine; other policies need none of them
    from envace.inference.local import LocalHFBackend

    # lazy: envace.models imports transformers (its model kinds), which only a local policy needs
    from envace.models import ModelSpec

    spec = kwargs.pop("spec", None)
    if spec is None:
        spec = ModelSpec(**kwargs.pop("model", {"kind": "tiny"}))
    return LocalHFBackend.from_spec(spec, **kwargs)


def _openai_policy(**kwargs: Any) -> ChatBackend:
    return OpenAIChatBackend(**kwargs)


def _oracle_policy(*, tasks: Sequence[Task], **kwargs: Any) -> ChatBackend:
    """kwargs: ``name``, ``make_executor`` (e.g. ``adapter.real_executor``)."""
    return OracleBackend(tasks, **kwargs)


POLICIES: dict[str, PolicyFactory] = {"hf": _hf_policy, "openai": _openai_policy, "oracle": _oracle_policy}


def build_policy(kind: str, **kwargs: Any) -> ChatBackend:
    """``hf``: ``spec=ModelSpec`` or ``model={...}`` + LocalHFBackend kwargs; ``openai``: OpenAIChatBackend
    kwargs (base_url, model, …); ``oracle``: ``tasks=[...]`` and optionally ``make_executor``."""
    try:
        factory = POLICIES[kind]
    except KeyError:
        raise KeyError(f"unknown policy kind {kind!r}; valid kinds: {', '.join(sorted(POLICIES))}") from None
    return factory(**kwargs)
