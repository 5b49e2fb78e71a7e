"""Test-time rehearsal on the real tool world: isolation with a recording executor, a small sweep,
and an end-to-end run of the tiny random model as actor, rehearser and fidelity subject."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from envace.core.critique import Critique, render_critique
from envace.core.env import Task
from envace.core.records import ToolCall
from envace.core.rehearsal import RehearsalConfig
from envace.core.rehearsal_memory import MemoryBudget, count_approx_tokens
from envace.core.wire import render_rehearsal, render_tool_calls
from envace.envs.toolworld import ToolWorldEnv, ToolWorldExecutor
from envace.envs.toolworld.evaluation import ToolWorldAdapter
from envace.evaluation import OracleBackend, build_policy, evaluate, measure_fidelity
from envace.evaluation.episode import ActLoopConfig
from envace.inference.base import ChatOutput, ChatRequest
from envace.rehearsal import RehearsalSettings, evaluate_with_rehearsal, run_rehearsal_sweep
from envace.rehearsal.oracle import ORACLE_REHEARSER

torch.set_num_threads(1)


class RecordingExecutor(ToolWorldExecutor):
    """The real tool-world executor, also logging every call it executes into a shared list."""

    def __init__(self, task: Task, log: list[ToolCall]) -> None:
        super().__init__(task)
        self.calls = log

    def execute(self, call: ToolCall) -> Any:
        self.calls.append(call)
        return super().execute(call)


class RecordingToolWorldEnv(ToolWorldEnv):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[ToolCall] = []
        self.executors: list[RecordingExecutor] = []

    def make_executor(self, task: Task) -> RecordingExecutor:
        executor = RecordingExecutor(task, self.calls)
        self.executors.append(executor)
        return executor


class SandboxedAdapter(ToolWorldAdapter):
    """The tool world whose fresh executors for rehearsal sandboxes log into ``sandbox_calls`` (the committed
    execution's executors still come from ``env``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sandbox_calls: list[ToolCall] = []

    def real_executor(self, task: Task) -> RecordingExecutor:
        return RecordingExecutor(task, self.sandbox_calls)


HARMFUL = ToolCall("transfer", {"from_account_id": "acc_2", "to_account_id": "acc_1", "amount": 999})


class RehearsingActor:
    """Replays gold when it holds a rehearsal memory; without one (i.e. while rehearsing) it always
    starts with a harmful write. Critiques and memories in the expected formats."""

    name = "rehearsing-actor"

    def __init__(self, oracle: OracleBackend) -> None:
        self.oracle = oracle

    def _answer(self, request: ChatRequest) -> str:
        system = str(request.messages[0]["content"])
        if system.startswith("You review a private rehearsal"):
            return render_critique(Critique("the transfer of 999 was not requested", False, "move 450 only"))
        if system.startswith("You condense private rehearsals"):
            return "<memory>Do not transfer 999; list accounts, then transfer 450 from acc_1 to acc_3.</memory>"
        remembers = any("Private rehearsal notes" in str(m.get("content")) for m in request.messages)
        if not remembers and request.messages[-1]["role"] == "user":
            return render_tool_calls([HARMFUL])
        return self.oracle.answer(request)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(self._answer(r), completion_tokens=5) for r in requests]


class ConfirmingRehearser:
    name = "confirming-rehearser"

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(render_rehearsal({"status": "ok", "imagined": True}), completion_tokens=3) for _ in requests]


@pytest.fixture(scope="module")
def bank_task() -> Task:
    task = next(t for t in ToolWorldEnv().tasks("test") if t.task_id == "toolworld-s0-test-0003")
    assert any(c.name == "transfer" for turn in task.gold_calls for step in turn for c in step)
    return task


@pytest.mark.parametrize("mode, scope", [("parallel", "task"), ("sequential", "task"), ("parallel", "turn")])
def test_rehearsed_transfer_never_reaches_the_real_bank(bank_task, mode, scope):
    env = RecordingToolWorldEnv()
    adapter = ToolWorldAdapter(ActLoopConfig(max_steps_per_turn=4), env=env)
    oracle = OracleBackend([bank_task], make_executor=ToolWorldExecutor)  # its own executors, not env's
    settings = RehearsalSettings(RehearsalConfig(n_attempts=2, mode=mode, scope=scope, act_temperature=0.7))
    rec = evaluate_with_rehearsal(
        adapter, RehearsingActor(oracle), ConfirmingRehearser(), [bank_task], settings, progress=False
    ).records[0]
    attempts = rec.info["rehearsal"]["outcomes"][0]["attempts"]
    assert [a["turns"][0]["tool_calls"][0]["arguments"]["amount"] for a in attempts] == [999, 999]
    gold = [c for turn in bank_task.gold_calls for step in turn for c in step]
    assert len(env.executors) == 1  # exactly one committed execution
    assert [(c.name, c.arguments) for c in env.calls] == [(c.name, c.arguments) for c in gold]
    assert all(c.arguments.get("amount") != 999 for c in env.calls)
    final = env.executors[0].state()["bank"]["accounts"]
    assert final["acc_1"]["balance"] == 550 - 450 and final["acc_2"]["balance"] == 1590
    assert rec.success and rec.real_calls == len(gold)
    assert rec.info["rehearsal"]["costs"]["committed_executions"] == 1


def test_small_sweep_on_the_tool_world():
    env = ToolWorldEnv()
    adapter = ToolWorldAdapter(ActLoopConfig(max_steps_per_turn=4), env=env)
    tasks = adapter.tasks("test", limit=4, seed=0)
    oracle = OracleBackend(tasks, make_executor=adapter.real_executor)
    cells = run_rehearsal_sweep(
        adapter,
        oracle,
        {"scripted": ConfirmingRehearser()},
        [0, 1],
        ["parallel", "sequential"],
        tasks,
        RehearsalSettings(RehearsalConfig(summarizer="structured")),
        concurrency=4,
        progress=False,
    )
    assert [c.key for c in cells] == ["n0-none-none", "n1-parallel-scripted", "n1-sequential-scripted"]
    gold_calls = sum(len(step) for t in tasks for turn in t.gold_calls for step in turn) / len(tasks)
    for cell in cells:  # the oracle ignores its memory, so every cell replays gold exactly once per task
        assert cell.metrics.success_rate == 1.0 and cell.costs.real_env_calls == pytest.approx(gold_calls)
    assert cells[1].records[0].info["rehearsal"]["outcomes"][0]["memory"]["source"] == "structured"


@pytest.mark.parametrize("mode, scope", [("parallel", "turn"), ("sequential", "task")])
def test_oracle_rehearser_answers_from_a_sandbox_never_the_committed_executor(bank_task, mode, scope):
    """The oracle rehearser: the attempts' calls get the real environment's answers from sandboxed copies
    (fresh executors, the real conversation replayed), counted apart; the committed execution stays one."""
    env = RecordingToolWorldEnv()  # the committed executions' executors
    adapter = SandboxedAdapter(ActLoopConfig(max_steps_per_turn=4), env=env)
    oracle = OracleBackend([bank_task], make_executor=ToolWorldExecutor)  # its own executors, not env's
    settings = RehearsalSettings(RehearsalConfig(n_attempts=2, mode=mode, scope=scope, act_temperature=0.7))
    cells = run_rehearsal_sweep(
        adapter,
        RehearsingActor(oracle),
        {"oracle": ORACLE_REHEARSER},
        [2],
        [mode],
        [bank_task],
        settings,
        progress=False,
        reuse_generations=False,
    )
    rec = cells[-1].records[0]
    gold = [c for turn in bank_task.gold_calls for step in turn for c in step]
    attempts = [a for o in rec.info["rehearsal"]["outcomes"] for a in o["attempts"]]
    # the harmful transfer of every attempt got the bank's real answer (an error: acc_2 cannot cover it)
    first = [a["turns"][0] for a in attempts if a["turns"] and a["turns"][0]["user_turn"] == 0]  # fresh state
    assert first and all(t["tool_calls"][0]["arguments"]["amount"] == 999 for t in first)
    real_answer = ToolWorldExecutor(bank_task).execute(HARMFUL)
    assert all(t["responses"][0] == real_answer for t in first)
    costs = rec.info["rehearsal"]["costs"]
    assert costs["committed_executions"] == 1 and costs["real_env_calls"] == rec.real_calls == len(gold)
    assert costs["rehearsal_sandbox_calls"] >= len(first) and cells[-1].costs.rehearsal_sandbox_calls > 0
    # one committed execution, whose calls are exactly gold; the rehearsed transfers ran on sandboxes only
    assert len(env.executors) == 1
    assert [(c.name, c.arguments) for c in env.calls] == [(c.name, c.arguments) for c in gold]
    sandboxed = [(c.name, c.arguments) for c in adapter.sandbox_calls]
    assert (HARMFUL.name, HARMFUL.arguments) in sandboxed and len(sandboxed) == costs["rehearsal_sandbox_calls"]
    final = rec.final_state["bank"]["accounts"]
    assert final["acc_1"]["balance"] == 550 - 450 and final["acc_2"]["balance"] == 1590 and rec.success


@pytest.fixture(scope="module")
def tiny():
    return build_policy("hf", model={"kind": "tiny"}, name="tiny")


def test_tiny_model_rehearses_and_commits_end_to_end(tiny):
    adapter = ToolWorldAdapter(ActLoopConfig(max_steps_per_turn=2, max_new_tokens=24))
    tasks = adapter.tasks("test", limit=2, seed=0)
    config = RehearsalConfig(
        n_attempts=1,
        max_steps_per_turn=2,
        act_max_new_tokens=24,
        rehearse_max_new_tokens=24,
        critique_max_new_tokens=24,
        summary_max_new_tokens=24,
        act_temperature=1.0,
        memory=MemoryBudget(max_chars=200, max_tokens=20),
    )
    run = evaluate_with_rehearsal(adapter, tiny, tiny, tasks, RehearsalSettings(config), concurrency=2, progress=False)
    for rec in run.records:
        assert rec.error is None, rec.error
        costs = rec.info["rehearsal"]["costs"]
        assert costs["rehearsal_completion_tokens"] > 0 and costs["committed_executions"] == 1
        memory = rec.info["rehearsal"]["outcomes"][0]["memory"]
        assert len(memory["text"]) <= 200 and count_approx_tokens(memory["text"]) <= 20
        attempt = rec.info["rehearsal"]["outcomes"][0]["attempts"][0]
        # random text never holds a <critique> block: the failure is recorded and rehearsal went on
        assert attempt["critique"] is None and attempt["critique_text"] is not None
        assert attempt["critique_errors"][0]["code"] in {"NO_CRITIQUE_TAG", "EMPTY_OUTPUT"}
    assert 0.0 <= run.metrics.parse_failure_rate <= 1.0


def test_tiny_model_fidelity_against_real_responses(tiny):
    adapter = ToolWorldAdapter()
    tasks = adapter.tasks("test", limit=2, seed=3)
    records = evaluate(
        adapter, OracleBackend(tasks, make_executor=adapter.real_executor), tasks, progress=False
    ).records
    n_calls = sum(len(t.tool_calls) for r in records for t in r.turns)
    report = measure_fidelity(tiny, records, tasks, max_new_tokens=16, progress=False)
    assert report.overall.n == n_calls > 0
    assert report.overall.parse_failure_rate == 1.0  # a random model never writes <execution_result>
    assert report.overall.exact_match == 0.0 and set(report.per_tool) == {p.tool for p in report.pairs}
