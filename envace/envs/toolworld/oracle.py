"""The oracle policy: replays a task's gold calls on an executor, step by step, and answers with the
gold replies.

Bound arguments (``task.meta["bindings"]``) are re-resolved against the responses this execution
actually returned, so the oracle follows ids produced at run time instead of trusting the recorded
literals (falling back to the literal when the path is absent). It must score 1.0 on every task; a
unit test checks that over all splits and several seeds (the "validate your gold" rule of STYLE.md).
"""

from __future__ import annotations

from typing import Any

from envace.core.env import EpisodeResult, Executor, Task
from envace.core.json_paths import resolve_path
from envace.core.records import ToolCall
from envace.envs.toolworld.checklist import TurnTranscript


def _rebind(call: ToolCall, bindings: dict[str, Any], seen: dict[str, Any]) -> ToolCall:
    arguments = dict(call.arguments)
    for name, source in bindings.get(str(call.id), {}).items():
        if source["call"] in seen:
            try:
                arguments[name] = resolve_path(seen[source["call"]], source["path"])
            except LookupError:
                pass
    return ToolCall(name=call.name, arguments=arguments, id=call.id)


def oracle_transcript(task: Task, executor: Executor) -> tuple[TurnTranscript, ...]:
    """Run the gold calls on ``executor``; per user turn, the calls made, responses and gold reply."""
    bindings = task.meta.get("bindings", {})
    seen: dict[str, Any] = {}
    transcripts = []
    for turn, steps in enumerate(task.gold_calls):
        calls, responses = [], []
        for step in steps:
            for gold in step:
                call = _rebind(gold, bindings, seen)
                response = executor.execute(call)
                seen[str(call.id)] = response
                calls.append(call)
                responses.append(response)
        reply = task.gold_answers[turn] if turn < len(task.gold_answers) else ""
        transcripts.append(TurnTranscript(tuple(calls), tuple(responses), reply))
    return tuple(transcripts)


def run_oracle(task: Task, executor: Executor) -> EpisodeResult:
    transcripts = oracle_transcript(task, executor)
    return EpisodeResult(
        final_answers=tuple(t.reply for t in transcripts),
        calls=tuple(t.calls for t in transcripts),
        final_state=executor.state(),
    )
