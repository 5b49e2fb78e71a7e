"""Evaluation: the policy loop, crash isolation, batching programs, metrics, registry, oracle policy.

A small key-value environment defined here (a real ``Environment``: executor with state, scorer) keeps
these tests independent of the tool world; the tool-world checks live in tests/integration.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import pytest

from envace.core.env import EpisodeResult, Task
from envace.core.records import Termination, ToolCall
from envace.evaluation import (
    ACTOR,
    EnvironmentAdapter,
    EpisodeRecord,
    OracleBackend,
    benchmark_names,
    build_policy,
    compute_metrics,
    drive,
    evaluate,
    gather,
    get_benchmark,
    sample_tasks,
)
from envace.evaluation.episode import ActLoopConfig
from envace.evaluation.programs import GenerationCall, GenerationLedger, dispatch, generate_one
from envace.inference.base import ChatOutput, ChatRequest

TOOLS = tuple(
    {"type": "function", "function": {"name": n, "description": d, "parameters": {"type": "object", "properties": p}}}
    for n, d, p in (
        ("get", "read a key", {"key": {"type": "string"}}),
        ("put", "write a key", {"key": {"type": "string"}, "value": {"type": "integer"}}),
    )
)


class KVExecutor:
    def __init__(self, state: dict[str, Any]) -> None:
        self._state = copy.deepcopy(state)

    def execute(self, call: ToolCall) -> Any:
        key = call.arguments.get("key")
        if call.name == "get":
            return {"key": key, "value": self._state[key]} if key in self._state else {"error": f"no key {key}"}
        if call.name == "put":
            self._state[key] = call.arguments.get("value")
            return {"ok": True}
        return {"error": f"unknown tool {call.name}"}

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)


class KVEnv:
    name = "kv"

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._tasks = list(tasks)

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def make_executor(self, task: Task) -> KVExecutor:
        return KVExecutor(task.initial_state)

    def score(self, task: Task, result: EpisodeResult) -> float:
        answers_ok = all(a in r for a, r in zip(task.gold_answers, result.final_answers))
        return 1.0 if result.final_state == task.expected_state and answers_ok else 0.0


def kv_task(i: int, domain: str, held_out: bool = False) -> Task:
    put = ToolCall("put", {"key": f"k{i}", "value": i})
    get = ToolCall("get", {"key": "base"})
    return Task(
        task_id=f"kv-{i}",
        domain=domain,
        split="test",
        system_prompt=f"You manage store {i}.",
        tools=TOOLS,
        user_turns=(f"Set k{i} to {i}.", "What is base?"),
        gold_calls=(((put,),), ((get,),)),
        gold_answers=(f"k{i}={i}", "base is 7"),
        initial_state={"base": 7},
        expected_state={"base": 7, f"k{i}": i},
        meta={"held_out": held_out},
    )


TASKS = [kv_task(0, "alpha"), kv_task(1, "alpha"), kv_task(2, "beta", held_out=True)]


class TextBackend:
    """Answers every request with the same text."""

    def __init__(self, text: str, name: str = "text") -> None:
        self.text, self.name = text, name

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(self.text, completion_tokens=3) for _ in requests]


class RaisingBackend:
    """Wraps a backend; raises when any request mentions ``trigger``. Counts ``generate`` calls."""

    def __init__(self, inner: Any, trigger: str) -> None:
        self.inner, self.trigger, self.name, self.batches = inner, trigger, "raising", []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.batches.append(len(requests))
        if any(self.trigger in json.dumps(r.messages) for r in requests):
            raise RuntimeError(f"backend exploded on {self.trigger}")
        return self.inner.generate(requests)


@pytest.fixture
def adapter() -> EnvironmentAdapter:
    return EnvironmentAdapter(KVEnv(TASKS), ActLoopConfig(max_steps_per_turn=3))


def test_oracle_scores_every_task_and_records_round_trip(adapter):
    run = evaluate(adapter, OracleBackend(TASKS), adapter.tasks("test"), progress=False)
    assert [r.success for r in run.records] == [True, True, True]
    assert run.metrics.success_rate == 1.0 and run.metrics.parse_failure_rate == 0.0
    rec = run.records[0]
    assert rec.final_answers == ("k0=0", "base is 7") and rec.real_calls == 2 and rec.act_generations == 4
    assert rec.turns[0].responses == ({"ok": True},) and rec.turns[0].rehearsed is False
    assert rec.final_state == {"base": 7, "k0": 0}
    line = json.dumps(rec.to_json())
    assert EpisodeRecord.from_json(json.loads(line)) == rec
    assert adapter.score(TASKS[0], rec) == 1.0


@pytest.mark.parametrize("concurrency", [1, 3])
def test_crashing_task_is_a_failure_not_an_abort(adapter, concurrency):
    backend = RaisingBackend(OracleBackend(TASKS), trigger="store 1.")
    run = evaluate(adapter, backend, TASKS, concurrency=concurrency, progress=False)
    assert [r.success for r in run.records] == [True, False, True]
    failed = run.records[1]
    assert failed.termination is Termination.ERROR and "backend exploded" in failed.error
    assert "traceback" in failed.info and failed.score == 0.0
    assert run.metrics.error_rate == pytest.approx(1 / 3)
    if concurrency == 3:
        assert backend.batches[0] == 3  # the three tasks' first ACT requests shared one batch


def test_parse_failure_ends_the_episode(adapter):
    run = evaluate(adapter, TextBackend('<tool_call>{"name": "put", "arguments": {'), TASKS[:1], progress=False)
    rec = run.records[0]
    assert rec.termination is Termination.ACT_PARSE_ERROR and rec.parse_failures == 1
    assert rec.parse_error_codes == ("UNCLOSED_TAG",) and rec.final_answers == ("", "")
    assert run.metrics.parse_failure_rate == 1.0 and run.metrics.episode_parse_failure_rate == 1.0


def test_step_limit_ends_the_episode_and_unknown_tools_never_reach_the_executor(adapter):
    looping = TextBackend('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>')
    rec = evaluate(adapter, looping, TASKS[:1], progress=False).records[0]
    assert rec.termination is Termination.MAX_STEPS and rec.real_calls == 0  # envace.core.unknown_tool answers
    unknown = {"error": {"code": "UNKNOWN_TOOL", "message": "unknown tool 'nope'; available: get, put"}}
    assert rec.turns[0].responses == (unknown,)
    assert rec.costs["act"]["calls"] == 3 and rec.costs["act"]["completion_tokens"] == 9


def test_final_reply_without_calls_scores_zero_state(adapter):
    rec = evaluate(adapter, TextBackend("k0=0 base is 7"), TASKS[:1], progress=False).records[0]
    assert rec.termination is Termination.FINAL_REPLY and rec.final_answers == ("k0=0 base is 7",) * 2
    assert rec.score == 0.0 and rec.real_calls == 0  # state unchanged: k0 never written


def test_sample_tasks_is_deterministic_and_keeps_order():
    many = [kv_task(i, "alpha") for i in range(20)]
    a, b = sample_tasks(many, 5, seed=3), sample_tasks(many, 5, seed=3)
    assert [t.task_id for t in a] == [t.task_id for t in b] and len(a) == 5
    assert [t.task_id for t in a] == sorted((t.task_id for t in a), key=lambda s: int(s.split("-")[1]))
    assert [t.task_id for t in sample_tasks(many, 5, seed=4)] != [t.task_id for t in a]


def test_sample_tasks_samples_raw_entries_by_a_key_function():
    """Raw entries (here plain dicts) sample exactly as the tasks carrying their ids would."""
    many = [kv_task(i, "alpha") for i in range(20)]
    entries = [{"id": t.task_id, "n": i} for i, t in enumerate(many)]
    chosen = sample_tasks(entries, 5, seed=3, task_id=lambda e: e["id"])
    assert [e["id"] for e in chosen] == [t.task_id for t in sample_tasks(many, 5, seed=3)]


def test_sample_tasks_where_equals_filtering_first_and_asks_lazily():
    many = [kv_task(i, "alpha") for i in range(20)]
    even = [t for t in many if int(t.task_id.split("-")[1]) % 2 == 0]
    asked = []

    def is_even(task: Task) -> bool:
        asked.append(task.task_id)
        return int(task.task_id.split("-")[1]) % 2 == 0

    chosen = sample_tasks(many, 3, seed=3, where=is_even)
    assert [t.task_id for t in chosen] == [t.task_id for t in sample_tasks(even, 3, seed=3)]
    assert len(asked) < len(many)  # stopped once 3 were found
    assert sample_tasks(many, None, seed=3, where=is_even) == even
    with pytest.raises(ValueError, match="limit=-1"):
        sample_tasks(many, -1, seed=3)


def test_metrics_per_domain_and_transfer():
    def rec(task: Task, score: float, parse_failures: int = 0, gens: int = 2) -> EpisodeRecord:
        return EpisodeRecord(
            "kv",
            task.task_id,
            task.domain,
            "test",
            bool(task.meta["held_out"]),
            score,
            score >= 1.0,
            act_generations=gens,
            parse_failures=parse_failures,
        )

    records = [
        rec(TASKS[0], 1.0),
        rec(TASKS[1], 0.5, parse_failures=1),
        rec(TASKS[2], 1.0, gens=4),
        EpisodeRecord.failed("kv", TASKS[2], "boom"),
    ]
    m = compute_metrics(records)
    assert m.n_tasks == 4 and m.success_rate == 0.5 and m.mean_score == pytest.approx(2.5 / 4)
    assert m.parse_failure_rate == pytest.approx(1 / 8) and m.error_rate == 0.25
    assert m.per_domain["alpha"].success_rate == 0.5 and m.per_domain["beta"].n == 2
    assert m.transfer.n == 2 and m.transfer.success_rate == 0.5 and m.in_domain.mean_score == 0.75
    flat = m.flat()
    assert flat["transfer/success_rate"] == 0.5 and flat["domain/alpha/mean_score"] == 0.75


def test_registry_lists_names_on_unknown():
    assert "toolworld" in benchmark_names()
    with pytest.raises(KeyError, match="registered benchmarks: .*toolworld"):
        get_benchmark("nonexistent")
    with pytest.raises(KeyError, match="valid kinds: hf, openai, oracle"):
        build_policy("gpt9")


def test_gather_batches_programs_and_dispatch_names_missing_seats():
    backend = RaisingBackend(TextBackend("x"), trigger="never")
    ledger = GenerationLedger()

    def two_calls(tag: str):
        a = yield from generate_one(
            GenerationCall(ACTOR, "act", ChatRequest(({"role": "user", "content": tag},))), ledger
        )
        b = yield from generate_one(
            GenerationCall(ACTOR, "act", ChatRequest(({"role": "user", "content": tag},))), ledger
        )
        return a.text + b.text

    assert drive(gather([two_calls("a"), two_calls("b"), two_calls("c")]), {ACTOR: backend}) == ["xx"] * 3
    assert backend.batches == [3, 3] and ledger.snapshot()["act"].calls == 6
    with pytest.raises(KeyError, match="seats given: \\['actor'\\]"):
        dispatch([GenerationCall("rehearser", "rehearse", ChatRequest(()))], {ACTOR: backend})


class SeedRecorder(TextBackend):
    """TextBackend that records each request's sampling seed."""

    def __init__(self) -> None:
        super().__init__("no tool needed")
        self.seeds: list[int] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.seeds += [r.seed for r in requests]
        return super().generate(requests)


def test_each_trial_samples_with_its_own_seeds_and_trial_zero_keeps_the_single_trial_ones(adapter):
    """Trials of a sampled evaluation (``with_trials``) must not replay one another: pass^k over identical
    episodes would be meaningless. Trial 0 keeps the seeds of an evaluation without trials."""
    from envace.evaluation import with_trials

    single, trials = SeedRecorder(), SeedRecorder()
    evaluate(adapter, single, TASKS[:1], progress=False)
    evaluate(adapter, trials, with_trials(TASKS[:1], 3), progress=False)
    n = len(single.seeds)  # one generation per user turn (the backend never calls a tool)
    assert n >= 1 and len(trials.seeds) == 3 * n
    per_trial = [tuple(trials.seeds[k * n : (k + 1) * n]) for k in range(3)]
    assert per_trial[0] == tuple(single.seeds) and len(set(trials.seeds)) == 3 * n


def test_a_dialogue_of_a_task_carries_its_trial_through_changes():
    """``Dialogue.of_task`` is how adapters build the ACT loop's dialogue: the trial comes with the task, so
    an adapter that replaces the user turns (FinMCP's gold-history mode) still seeds each trial apart."""
    from envace.evaluation import with_trials
    from envace.evaluation.episode import Dialogue

    task = with_trials(TASKS[:1], 3)[2]
    dialogue = Dialogue.of_task(task, user_turns=("only this",), first_turn_index=1)
    assert (dialogue.trial, dialogue.user_turns, dialogue.first_turn_index) == (2, ("only this",), 1)
    assert (dialogue.task_id, dialogue.tools) == (task.task_id, tuple(task.tools))
    assert Dialogue.of_task(TASKS[0]).trial == 0
