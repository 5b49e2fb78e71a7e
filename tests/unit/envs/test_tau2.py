"""τ²-Bench through tau2: the solo oracle on telecom, the standard mode with a user-simulator endpoint
(a local scripted one), modes that cannot run and why, pass^k, parse failures, crash isolation, the
real executor and its recording wrapper. The full telecom set is in tests/slow/test_tau2_full.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from envace.core.records import Termination, ToolCall
from envace.envs.tau2 import Tau2Adapter, Tau2Oracle, run_tau2, with_trials
from envace.envs.tau2.adapter import pass_hat_ks
from envace.evaluation import evaluate, get_benchmark
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatOutput, ChatRequest


@pytest.fixture(scope="module")
def solo() -> tuple[Tau2Adapter, list[Any]]:
    adapter = Tau2Adapter()
    return adapter, adapter.tasks("telecom", limit=4, seed=0)


def test_solo_oracle_scores_100_percent_on_telecom_with_pass_hat_k(solo: tuple[Tau2Adapter, list[Any]]) -> None:
    adapter, tasks = solo
    report = run_tau2(Tau2Oracle(tasks, trials=2), "telecom", trials=2, limit=4, adapter=adapter, progress=False)
    row = report.domains["telecom:base"]
    assert row["status"] == "ran" and row["n_tasks"] == 4 and row["crashed"] == 0
    assert row["avg_reward"] == 1.0 and row["pass^1"] == 1.0 and row["pass^2"] == 1.0
    record = report.run.records[0]
    assert record.termination is Termination.FINAL_REPLY and record.info["termination_reason"] == "agent_stop"
    assert record.real_calls == len(tasks[0].gold_calls[0]) - 1 and record.final_state["user_db_hash"]  # not `done`
    assert adapter.score(tasks[0], record) == record.score == 1.0  # re-scored from the stored simulation


def test_modes_that_cannot_run_say_why() -> None:
    standard = Tau2Adapter(mode="user_llm")
    assert standard.tasks("airline,telecom") == []
    assert "user-simulator LLM" in standard.skipped["airline:base"]
    report = run_tau2(Tau2Oracle([]), "airline", adapter=standard, progress=False)
    assert report.domains["airline:base"]["status"] == "not_runnable" and not report.run.records
    solo = Tau2Adapter()
    assert solo.tasks("airline", limit=1) == [] and "no solo mode" in solo.skipped["airline:base"]
    with pytest.raises(KeyError, match="airline, retail, telecom"):
        solo.tasks("banking")


class ScriptedCustomer:
    """A customer LLM: states the reason for the call (found in tau2's user-simulator prompt), then ends it.
    (In the simulator's flipped view the customer's own messages are the ``assistant`` ones.)"""

    name = "scripted-customer"

    def __init__(self, openings: Sequence[str]) -> None:
        self.openings = list(openings)
        self.batches: list[int] = []

    def reply(self, request: ChatRequest) -> str:
        if any(m["role"] == "assistant" for m in request.messages):
            return "###STOP###"
        system = request.messages[0]["content"]
        return next(o for o in self.openings if o.splitlines()[0][:80] in system)

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.batches.append(len(requests))
        return [ChatOutput(self.reply(r)) for r in requests]


def test_standard_mode_runs_tau2_user_simulator_against_an_openai_endpoint() -> None:
    from envace.envs.tau2.agent import opening_text
    from envace.inference.openai_server import ChatCompletionServer

    probe = Tau2Adapter(mode="scripted_user").tasks("retail", limit=1, seed=2)[0]
    customer = ScriptedCustomer([opening_text(probe.meta["tau2_task"])])
    with ChatCompletionServer(customer, "scripted-customer") as server:
        adapter = Tau2Adapter(mode="user_llm", user_base_url=server.base_url, user_model="scripted-customer")
        tasks = adapter.tasks("retail", limit=1, seed=2)
        record = evaluate(adapter, Tau2Oracle(tasks), tasks, progress=False).records[0]
    assert record.error is None and record.info["termination_reason"] == "user_stop"
    messages = record.info["tau2_simulation"]["messages"]
    assert [m["role"] for m in messages][:2] == ["assistant", "user"] and messages[1]["content"] == customer.openings[0]
    assert record.score == 1.0


def test_customer_seat_batches_the_user_simulator_across_episodes() -> None:
    from envace.envs.tau2.agent import opening_text

    adapter = Tau2Adapter(mode="user_seat")
    tasks = adapter.tasks("retail", limit=3, seed=4)
    customer = ScriptedCustomer([opening_text(t.meta["tau2_task"]) for t in tasks])
    report = run_tau2(
        Tau2Oracle(tasks), "retail", limit=3, seed=4, adapter=adapter, customer=customer, concurrency=3, progress=False
    )
    assert report.domains["retail:base"]["avg_reward"] == 1.0 and max(customer.batches) == 3
    assert all(r.info["termination_reason"] == "user_stop" for r in report.run.records)
    with pytest.raises(ValueError, match="customer"):
        run_tau2(Tau2Oracle(tasks), "retail", adapter=adapter, progress=False)


def test_scripted_customer_replays_airline_offline() -> None:
    adapter = Tau2Adapter(mode="scripted_user")
    tasks = adapter.tasks("airline", limit=1, seed=1)
    report = run_tau2(Tau2Oracle(tasks), "airline", limit=1, seed=1, adapter=adapter, progress=False)
    assert (
        report.domains["airline:base"]["avg_reward"] == 1.0
        and report.domains["airline:base"]["mode"] == "scripted_user"
    )


def _record(task_id: str, success: bool) -> EpisodeRecord:
    return EpisodeRecord("tau2", task_id, "telecom", "base", False, float(success), success)


def test_pass_hat_k_is_taus_formula() -> None:
    records = [_record("a", True), _record("a", False), _record("b", True), _record("b", True)]
    # task a: 1 of 2 → pass^1 = 0.5, pass^2 = 0; task b: 2 of 2 → 1, 1
    assert pass_hat_ks(records, 2) == {"pass^1": 0.75, "pass^2": 0.5}
    with pytest.raises(ValueError, match="trials"):
        with_trials([], 0)


class Scripted:
    """Always answers with the same text."""

    name = "scripted"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(self.text) for _ in requests]


def test_malformed_tool_call_ends_the_simulation_as_an_agent_error(solo: tuple[Tau2Adapter, list[Any]]) -> None:
    adapter, tasks = solo
    record = adapter.run_episode(Scripted("<tool_call>\n{not json}\n</tool_call>"), tasks[0])
    assert record.termination is Termination.ACT_PARSE_ERROR and record.score == 0.0
    assert record.parse_error_codes == ("JSON_DECODE_ERROR",) and record.info["termination_reason"] == "agent_error"


def test_a_crashing_task_is_recorded_and_the_others_still_run(solo: tuple[Tau2Adapter, list[Any]]) -> None:
    from envace.envs.tau2.episode import generation_seed

    adapter, tasks = solo
    oracle, victim = Tau2Oracle(tasks), tasks[1]
    doomed = {generation_seed(0, victim.task_id, 0, k) for k in range(50)}  # tickets repeat: match by seed

    class CrashOne:
        name = "crash-one"

        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            if any(r.seed in doomed for r in requests):
                raise RuntimeError("backend exploded")
            return oracle.generate(requests)

    run = evaluate(adapter, CrashOne(), tasks, concurrency=3, progress=False)
    by_id = {r.task_id: r for r in run.records}
    assert by_id[victim.task_id].crashed and "backend exploded" in by_id[victim.task_id].error
    assert all(r.success for r in run.records if r.task_id != victim.task_id)
    assert run.metrics.error_rate == pytest.approx(1 / len(tasks))


class Recording:
    def __init__(self, inner: Any, log: list[str]) -> None:
        self.inner, self.log = inner, log

    def tool_message(self, call: Any) -> Any:
        self.log.append(call.name)
        return self.inner.tool_message(call)

    def execute(self, call: ToolCall) -> Any:
        self.log.append(call.name)
        return self.inner.execute(call)

    def state(self) -> dict[str, Any]:
        return self.inner.state()


def test_real_calls_go_through_the_executor_wrapper_and_executors_are_isolated(
    solo: tuple[Tau2Adapter, list[Any]],
) -> None:
    _, tasks = solo
    log: list[str] = []
    adapter = Tau2Adapter(executor_wrapper=lambda ex: Recording(ex, log))
    record = evaluate(adapter, Tau2Oracle(tasks[:1]), tasks[:1], progress=False).records[0]
    gold = [c.name for step in tasks[0].gold_calls[0] for c in step][:-1]  # all but ``done``
    assert record.success and log == gold
    first, second = adapter.real_executor(tasks[0]), adapter.real_executor(tasks[0])
    before = second.state()
    response = first.execute(ToolCall(gold[0], dict(tasks[0].gold_calls[0][0][0].arguments)))
    assert response is not None and second.state() == before != first.state()
    assert log[-1] == gold[0]


def test_registered_under_tau2() -> None:
    assert isinstance(get_benchmark("tau2", mode="solo"), Tau2Adapter)
