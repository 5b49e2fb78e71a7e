"""Test-time rehearsal drivers with scripted backends on a small key-value environment.

Scripted backends are real ``ChatBackend`` classes producing deterministic text: the actor replays the
gold calls (or, when told, a harmful write while it has no rehearsal memory), critiques and summarises
with fixed formats; the rehearser imagines fixed responses. Each records the requests it received.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from envace.core.critique import Critique, CritiqueErrorCode, render_critique
from envace.core.env import EpisodeResult, Task
from envace.core.records import ToolCall
from envace.core.rehearsal import RehearsalConfig
from envace.core.rehearsal_memory import MemoryBudget, count_approx_tokens
from envace.core.rehearsal_prompts import RehearsalPrompts
from envace.core.wire import render_rehearsal, render_tool_calls
from envace.evaluation import ACTOR, REHEARSER, EnvironmentAdapter, OracleBackend, evaluate
from envace.evaluation.episode import ActLoopConfig
from envace.evaluation.programs import GenerationLedger, drive
from envace.inference.base import ChatOutput, ChatRequest
from envace.rehearsal import (
    RehearsalSettings,
    evaluate_with_rehearsal,
    rehearse,
    run_rehearsal_sweep,
)

PROMPTS = RehearsalPrompts()
TOOLS = tuple(
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("get", "put")
)


class KVExecutor:
    def __init__(self, state: dict[str, Any]) -> None:
        self._state = copy.deepcopy(state)

    def execute(self, call: ToolCall) -> Any:
        key = call.arguments.get("key")
        if call.name == "put":
            self._state[key] = call.arguments.get("value")
            return {"ok": True}
        return {"key": key, "value": self._state[key]} if key in self._state else {"error": f"no key {key}"}

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)


class RecordingKVExecutor(KVExecutor):
    """A real executor that also logs every call it receives into a shared list."""

    def __init__(self, state: dict[str, Any], log: list[ToolCall]) -> None:
        super().__init__(state)
        self.log = log

    def execute(self, call: ToolCall) -> Any:
        self.log.append(call)
        return super().execute(call)


class RecordingKVEnv:
    name = "kv"

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._tasks, self.calls, self.executors = list(tasks), [], []

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def make_executor(self, task: Task) -> RecordingKVExecutor:
        executor = RecordingKVExecutor(task.initial_state, self.calls)
        self.executors.append(executor)
        return executor

    def score(self, task: Task, result: EpisodeResult) -> float:
        return float(result.final_state == task.expected_state)


def kv_task(i: int) -> Task:
    put = ToolCall("put", {"key": f"k{i}", "value": i})
    return Task(
        task_id=f"kv-{i}",
        domain="alpha",
        split="test",
        system_prompt=f"You manage store {i}.",
        tools=TOOLS,
        user_turns=(f"Set k{i} to {i}.", "Thanks, that is all."),
        gold_calls=(((put,),), ()),
        gold_answers=("done", "bye"),
        initial_state={"base": 7},
        expected_state={"base": 7, f"k{i}": i},
    )


TASKS = [kv_task(0), kv_task(1)]
HARMFUL = ToolCall("put", {"key": "base", "value": 999})


class ScriptedPolicy:
    """ACT: replays gold (``harmful_without_memory``: writes base=999 while no memory note is present).
    Critique: numbered critiques (or ``bad_critique`` text). Summary: a fixed memory of ``memory_words``."""

    def __init__(self, tasks, *, harmful_without_memory=False, bad_critique=None, memory_words=5, silent_summary=False):
        self.oracle = OracleBackend(tasks)
        self.harmful, self.bad_critique = harmful_without_memory, bad_critique
        self.memory_words, self.silent_summary = memory_words, silent_summary
        self.name, self.requests, self.batches, self.critiques = "scripted", [], [], 0

    def _answer(self, request: ChatRequest) -> str:
        system = request.messages[0]["content"]
        if system == PROMPTS.critique_system.format():
            self.critiques += 1
            if self.bad_critique is not None:
                return self.bad_critique
            return render_critique(Critique(f"assessment {self.critiques}", True, f"revision-{self.critiques}"))
        if system.startswith("You condense private rehearsals"):
            return "" if self.silent_summary else "<memory>" + " ".join(["lesson"] * self.memory_words) + "</memory>"
        has_memory = any("Private rehearsal notes" in str(m.get("content")) for m in request.messages)
        if self.harmful and not has_memory and request.messages[-1]["role"] == "user":
            return render_tool_calls([HARMFUL])
        return self.oracle.answer(request)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.batches.append(len(requests))
        self.requests.extend(requests)
        return [ChatOutput(self._answer(r), prompt_tokens=10, completion_tokens=4) for r in requests]


class ScriptedRehearser:
    """Imagines ``{"ok": true, "imagined": n}`` for every call; records requests."""

    def __init__(self, name="rehearser", text=None):
        self.name, self.text, self.requests, self.batches = name, text, [], []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.batches.append(len(requests))
        outs = []
        for r in requests:
            self.requests.append(r)
            text = (
                self.text if self.text is not None else render_rehearsal({"ok": True, "imagined": len(self.requests)})
            )
            outs.append(ChatOutput(text, completion_tokens=2))
        return outs


def settings_for(n: int, mode: str = "parallel", **kw: Any) -> RehearsalSettings:
    config = RehearsalConfig(n_attempts=n, mode=mode, act_temperature=0.7, max_steps_per_turn=3, **kw)
    return RehearsalSettings(config=config, prompts=PROMPTS)


def adapter_for(tasks=TASKS) -> tuple[EnvironmentAdapter, RecordingKVEnv]:
    env = RecordingKVEnv(tasks)
    return EnvironmentAdapter(env, ActLoopConfig(max_steps_per_turn=3)), env


# ---- isolation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
@pytest.mark.parametrize("scope", ["task", "turn"])
def test_rehearsed_writes_never_reach_the_real_executor(mode, scope):
    adapter, env = adapter_for(TASKS[:1])
    actor = ScriptedPolicy(TASKS, harmful_without_memory=True)
    rehearser = ScriptedRehearser()
    run = evaluate_with_rehearsal(
        adapter, actor, rehearser, TASKS[:1], settings_for(2, mode, scope=scope), progress=False
    )
    rec = run.records[0]
    # the attempts before the first user turn wrote base=999 in imagination ...
    attempts = rec.info["rehearsal"]["outcomes"][0]["attempts"]
    assert attempts and all(
        a["turns"][0]["tool_calls"][0]["arguments"] == {"key": "base", "value": 999} for a in attempts
    )
    assert all(a["turns"][0]["rehearsed"] for a in attempts)
    # ... but the one real executor only saw the committed execution's (gold) call
    assert len(env.executors) == 1
    assert env.calls == [ToolCall("put", {"key": "k0", "value": 0}, "call_0_0_0")]
    assert env.executors[0].state() == {"base": 7, "k0": 0} and rec.success
    assert rec.info["rehearsal"]["costs"]["committed_executions"] == 1
    assert rec.info["rehearsal"]["costs"]["real_env_calls"] == 1 == rec.real_calls


def test_rehearsal_program_has_no_executor_to_reach():
    """``rehearse`` runs on a RehearsalContext and two seats; no environment exists anywhere."""
    adapter, env = adapter_for(TASKS[:1])
    context = adapter.rehearsal_context(TASKS[0])
    assert not any(isinstance(v, KVExecutor) for v in vars(context).values())
    assert "gold" not in json.dumps([f for f in vars(context)])
    actor, rehearser = ScriptedPolicy(TASKS, harmful_without_memory=True), ScriptedRehearser()
    outcome = drive(rehearse(context, settings_for(2), GenerationLedger()), {ACTOR: actor, REHEARSER: rehearser})
    assert len(outcome.attempts) == 2 and env.executors == [] and env.calls == []


# ---- modes ----------------------------------------------------------------------------------------


def _history_notes(actor: ScriptedPolicy) -> list[str | None]:
    """For each rehearsal attempt's first ACT request: its history note (None when absent)."""
    notes = []
    for r in actor.requests:
        contents = [str(m.get("content")) for m in r.messages]
        is_first_act = r.tools is not None and r.messages[-1]["role"] == "user" and "Set k0" in contents[-1]
        if is_first_act and not any("Private rehearsal notes" in c for c in contents):
            notes.append(next((c for c in contents if c.startswith("Earlier private rehearsals")), None))
    return notes


def test_sequential_attempt_k_sees_attempts_before_it():
    adapter, _ = adapter_for(TASKS[:1])
    actor = ScriptedPolicy(TASKS)
    evaluate_with_rehearsal(
        adapter, actor, ScriptedRehearser(), TASKS[:1], settings_for(3, "sequential"), progress=False
    )
    notes = _history_notes(actor)
    assert len(notes) == 3 and notes[0] is None
    assert "Attempt 1:" in notes[1] and "revision-1" in notes[1] and "Attempt 2:" not in notes[1]
    assert "Attempt 1:" in notes[2] and "Attempt 2:" in notes[2] and "revision-2" in notes[2]
    assert "Attempt 3:" not in notes[2]


def test_parallel_attempts_are_independent_and_batched():
    adapter, _ = adapter_for(TASKS[:1])
    actor, rehearser = ScriptedPolicy(TASKS), ScriptedRehearser()
    rec = evaluate_with_rehearsal(adapter, actor, rehearser, TASKS[:1], settings_for(3), progress=False).records[0]
    assert _history_notes(actor) == [None, None, None]
    assert actor.batches[0] == 3 and rehearser.batches[0] == 3  # lock-step attempts share batches
    firsts = [r for r in actor.requests[:3]]
    assert len({r.seed for r in firsts}) == 3 and len({json.dumps(r.messages) for r in firsts}) == 1
    outcome = rec.info["rehearsal"]["outcomes"][0]
    assert [a["index"] for a in outcome["attempts"]] == [0, 1, 2]
    assert outcome["memory"] == {
        "text": "lesson lesson lesson lesson lesson",
        "source": "policy",
        "truncated": False,
        "source_chars": 34,
    }


def test_each_trial_rehearses_with_its_own_seeds_and_trial_zero_keeps_the_single_trial_ones():
    """With ``with_trials``, every trial's private attempts, critiques and summary draw their own seeds (the
    trial is on the task's ``RehearsalContext``); trial 0 rehearses exactly as an evaluation without trials."""
    from envace.evaluation import with_trials

    def seeds(tasks):
        adapter, _ = adapter_for(TASKS[:1])
        actor, rehearser = ScriptedPolicy(TASKS), ScriptedRehearser()
        evaluate_with_rehearsal(adapter, actor, rehearser, tasks, settings_for(2), progress=False)
        return [r.seed for r in actor.requests], [r.seed for r in rehearser.requests]

    single_act, single_rehearse = seeds(TASKS[:1])
    trial_act, trial_rehearse = seeds(with_trials(TASKS[:1], 2))
    n, m = len(single_act), len(single_rehearse)
    assert n > 0 and m > 0 and (len(trial_act), len(trial_rehearse)) == (2 * n, 2 * m)
    assert (trial_act[:n], trial_rehearse[:m]) == (single_act, single_rehearse)
    assert not set(trial_act[:n]) & set(trial_act[n:]) and not set(trial_rehearse[:m]) & set(trial_rehearse[m:])


def test_rehearser_seat_answers_every_imagined_call():
    adapter, _ = adapter_for(TASKS[:1])
    actor, rehearser = ScriptedPolicy(TASKS), ScriptedRehearser()
    rec = evaluate_with_rehearsal(adapter, actor, rehearser, TASKS[:1], settings_for(2), progress=False).records[0]
    assert len(rehearser.requests) == 2 and all(r.tools is None for r in rehearser.requests)
    assert all(r.messages[0]["content"].startswith("You are the execution backend") for r in rehearser.requests)
    assert not any(r.messages[0]["content"].startswith("You are the execution backend") for r in actor.requests)
    attempt = rec.info["rehearsal"]["outcomes"][0]["attempts"][0]
    assert attempt["turns"][0]["responses"][0]["imagined"] in (1, 2)


# ---- memory, critiques, costs ---------------------------------------------------------------------


def test_memory_is_bounded_and_injected_before_the_user_turn():
    adapter, _ = adapter_for(TASKS[:1])
    actor = ScriptedPolicy(TASKS, memory_words=500)
    settings = settings_for(1, memory=MemoryBudget(max_chars=None, max_tokens=30))
    rec = evaluate_with_rehearsal(adapter, actor, ScriptedRehearser(), TASKS[:1], settings, progress=False).records[0]
    memory = rec.info["rehearsal"]["outcomes"][0]["memory"]
    assert memory["truncated"] and count_approx_tokens(memory["text"]) <= 30 and memory["source"] == "policy"
    committed = [r for r in actor.requests if any("Private rehearsal notes" in str(m["content"]) for m in r.messages)]
    assert committed, "the committed execution must see the memory"
    first = committed[0].messages
    note_at = next(i for i, m in enumerate(first) if "Private rehearsal notes" in str(m["content"]))
    assert first[note_at]["role"] == "user" and first[note_at + 1]["content"] == "Set k0 to 0."
    assert memory["text"] in first[note_at]["content"]


def test_failed_critique_is_recorded_not_fatal_and_summary_falls_back():
    adapter, _ = adapter_for(TASKS[:1])
    actor = ScriptedPolicy(TASKS, bad_critique="looks good!", silent_summary=True)
    rec = evaluate_with_rehearsal(
        adapter, actor, ScriptedRehearser(), TASKS[:1], settings_for(2), progress=False
    ).records[0]
    assert rec.success and rec.error is None
    outcome = rec.info["rehearsal"]["outcomes"][0]
    assert all(a["critique"] is None and a["critique_text"] == "looks good!" for a in outcome["attempts"])
    assert all(a["critique_errors"][0]["code"] == CritiqueErrorCode.NO_CRITIQUE_TAG.value for a in outcome["attempts"])
    assert outcome["memory"]["source"] == "structured_fallback"
    assert outcome["memory"]["text"].startswith("Attempt 1 (unreviewed): calls put; ended final_reply.")


def test_unparseable_rehearsal_ends_the_attempt_only():
    adapter, _ = adapter_for(TASKS[:1])
    run = evaluate_with_rehearsal(
        adapter, ScriptedPolicy(TASKS), ScriptedRehearser(text="no idea"), TASKS[:1], settings_for(1), progress=False
    )
    attempt = run.records[0].info["rehearsal"]["outcomes"][0]["attempts"][0]
    assert attempt["termination"] == "rehearse_parse_error" and attempt["rehearse_parse_failures"] == 1
    assert run.records[0].success


def test_costs_per_task():
    adapter, _ = adapter_for(TASKS[:1])
    rec = evaluate_with_rehearsal(  # task scope: one rehearsal of both user turns
        adapter, ScriptedPolicy(TASKS), ScriptedRehearser(), TASKS[:1], settings_for(2, scope="task"), progress=False
    ).records[0]
    costs = rec.info["rehearsal"]["costs"]
    # per attempt: 3 ACT generations (call, reply turn 1, reply turn 2) x4 tokens + 1 rehearse x2 + critique 4
    assert rec.costs["rehearsal_act"]["calls"] == 6 and rec.costs["rehearse"]["calls"] == 2
    assert rec.costs["critique"]["calls"] == 2 and rec.costs["summary"]["calls"] == 1
    assert costs["rehearsal_completion_tokens"] == 6 * 4 + 2 * 2 + 2 * 4 + 4
    assert costs["committed_completion_tokens"] == 3 * 4
    assert costs["real_env_calls"] == 1 and costs["committed_executions"] == 1
    assert costs["rehearsal_wall_s"] >= 0 and costs["committed_wall_s"] >= 0


def test_turn_scope_rehearses_each_turn_with_real_history():
    adapter, _ = adapter_for(TASKS[:1])
    actor, rehearser = ScriptedPolicy(TASKS), ScriptedRehearser()
    rec = evaluate_with_rehearsal(
        adapter, actor, rehearser, TASKS[:1], settings_for(1, scope="turn"), progress=False
    ).records[0]
    outcomes = rec.info["rehearsal"]["outcomes"]
    assert [o["turn_index"] for o in outcomes] == [0, 1]
    assert [t["user_turn"] for t in outcomes[1]["attempts"][0]["turns"]] == [1]
    # the turn-1 attempt starts from the real conversation, which holds the real put response
    turn1_acts = [r for r in actor.requests if r.messages[-1].get("content") == "Thanks, that is all."]
    assert any(m.get("role") == "tool" and m["content"] == '{"ok":true}' for m in turn1_acts[0].messages)


# ---- N = 0 and sweeps -----------------------------------------------------------------------------


def test_zero_attempts_is_plain_evaluation():
    adapter, _ = adapter_for()
    plain = evaluate(adapter, ScriptedPolicy(TASKS), TASKS, progress=False)
    actor = ScriptedPolicy(TASKS)
    zero = evaluate_with_rehearsal(adapter, actor, None, TASKS, settings_for(0), progress=False)

    def strip(r):
        return replace(r, wall_s=0.0, info={}, costs={k: {**v, "seconds": 0} for k, v in r.costs.items()})

    assert [strip(r) for r in zero.records] == [strip(r) for r in plain.records]
    assert zero.metrics.success_rate == plain.metrics.success_rate == 1.0
    assert set(zero.records[0].costs) == {"act"} and zero.records[0].info["rehearsal"]["outcomes"] == []
    with pytest.raises(ValueError, match="needs a rehearser"):
        evaluate_with_rehearsal(adapter, actor, None, TASKS, settings_for(1), progress=False)


def test_sweep_caps_n_per_mode(caplog):
    adapter, env = adapter_for()
    rehearsers = {"trained": ScriptedRehearser("trained")}
    cells = run_rehearsal_sweep(
        adapter,
        ScriptedPolicy(TASKS),
        rehearsers,
        [0, 1, 2, 4],
        ["sequential", "parallel"],
        TASKS,
        settings_for(1),
        progress=False,
        max_n_by_mode={"sequential": 2},
    )
    assert [(c.key, c.same_as) for c in cells] == [
        ("n0-none-none", None),
        ("n1-sequential-trained", None),
        ("n1-parallel-trained", "n1-sequential-trained"),
        ("n2-sequential-trained", None),
        ("n2-parallel-trained", None),
        ("n4-parallel-trained", None),
    ]
    assert len(env.executors) == 5 * len(TASKS)
    for bad, match in (({"sequentail": 2}, "sequentail"), ({"parallel": 0}, "must be >= 1")):
        with pytest.raises(ValueError, match=match):
            run_rehearsal_sweep(
                adapter,
                ScriptedPolicy(TASKS),
                rehearsers,
                [0, 1],
                ["parallel"],
                TASKS,
                settings_for(1),
                progress=False,
                max_n_by_mode=bad,
            )
    with caplog.at_level(logging.WARNING, logger="envace.rehearsal.sweep"):
        cells = run_rehearsal_sweep(
            adapter,
            ScriptedPolicy(TASKS),
            rehearsers,
            [0, 2],
            ["parallel"],
            TASKS,
            settings_for(1),
            progress=False,
            max_n_by_mode={"sequential": 1},
        )
    assert [c.key for c in cells] == ["n0-none-none", "n2-parallel-trained"]  # a cap on another mode: no effect
    assert "caps sequential, which the sweep does not run (modes: parallel)" in caplog.text


def test_sweep_grid_runs_zero_once():
    adapter, env = adapter_for()
    actor = ScriptedPolicy(TASKS)
    rehearsers = {"trained": ScriptedRehearser("trained"), "base": ScriptedRehearser("base")}
    cells = run_rehearsal_sweep(
        adapter, actor, rehearsers, [0, 1, 2], ["parallel", "sequential"], TASKS, settings_for(1), progress=False
    )
    assert [c.key for c in cells] == [
        "n0-none-none",
        "n1-parallel-trained",
        "n1-parallel-base",
        "n1-sequential-trained",
        "n1-sequential-base",
        "n2-parallel-trained",
        "n2-parallel-base",
        "n2-sequential-trained",
        "n2-sequential-base",
    ]
    assert all(c.metrics.success_rate == 1.0 and c.costs.committed_executions == 1.0 for c in cells)
    assert cells[0].costs.rehearsal_completion_tokens == 0 and cells[-1].costs.rehearsal_completion_tokens > 0
    # one real executor per task per cell run, nothing more: N=1 runs once (its sequential cells copy it)
    assert len(env.executors) == 7 * len(TASKS)
    copies = {c.key: c.same_as for c in cells if c.same_as is not None}
    assert copies == {"n1-sequential-trained": "n1-parallel-trained", "n1-sequential-base": "n1-parallel-base"}
    assert cells[3].metrics == cells[1].metrics and cells[3].records == cells[1].records
    assert cells[3].to_json()["same_as"] == "n1-parallel-trained" and "same_as" not in cells[1].to_json()
    assert json.loads(json.dumps(cells[1].to_json(with_records=True)))["records"][0]["task_id"] == "kv-0"
