"""Tool world: the oracle scores 1.0 everywhere, the scorer and the checklist rules fail what they
should, executors are isolated, the CM2 export round-trips, and ``ToolWorldEnv`` fits the interface."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from envace.core.records import ToolCall, Turn
from envace.envs.base import EpisodeResult, Executor, Task
from envace.envs.toolworld import (
    SPLITS,
    ToolWorldConfig,
    ToolWorldEnv,
    ToolWorldExecutor,
    TurnTranscript,
    checklist_score,
    describe_domains,
    evaluate_checklists,
    generate_tasks,
    mentions,
    oracle_transcript,
    run_oracle,
    score,
    score_breakdown,
    split_stats,
    stats_markdown,
    task_from_cm2_row,
    to_cm2_row,
    transcripts_from_turns,
)


@pytest.fixture(scope="module")
def default_splits() -> dict[str, list[Task]]:
    return generate_tasks()


def all_tasks(splits: dict[str, list[Task]]) -> list[Task]:
    return [t for s in SPLITS for t in splits[s]]


def first_task(splits: dict[str, list[Task]], predicate) -> Task:
    return next(t for t in all_tasks(splits) if predicate(t))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_oracle_scores_one_on_every_task_of_every_split(seed: int, default_splits: dict[str, list[Task]]) -> None:
    splits = default_splits if seed == 0 else generate_tasks(seed=seed)
    for task in all_tasks(splits):
        result = run_oracle(task, ToolWorldExecutor(task))
        assert score(task, result) == 1.0, (task.task_id, score_breakdown(task, result))
        assert score(task, result, partial_credit=True) == 1.0
        assert result.final_state == task.expected_state
        transcripts = oracle_transcript(task, ToolWorldExecutor(task))
        assert all(all(row) for row in evaluate_checklists(task, transcripts)), task.task_id
        assert checklist_score(task, transcripts) == pytest.approx(1.0)


def test_scorer_fails_a_wrong_final_state(default_splits: dict[str, list[Task]]) -> None:
    task = first_task(default_splits, lambda t: t.expected_state != t.initial_state)
    result = run_oracle(task, ToolWorldExecutor(task))
    untouched = dataclasses.replace(result, final_state=copy.deepcopy(task.initial_state))
    assert score(task, untouched) == 0.0
    assert 0.0 < score(task, untouched, partial_credit=True) < 1.0
    extra = copy.deepcopy(result.final_state)
    extra[task.domain]["unrequested"] = {"x": 1}
    assert score(task, dataclasses.replace(result, final_state=extra)) == 0.0
    counters_only = copy.deepcopy(result.final_state)
    counters_only[task.domain]["next_ids"] = {"anything": 99}  # id counters are not compared
    assert score(task, dataclasses.replace(result, final_state=counters_only)) == 1.0


def test_scorer_fails_a_missing_answer_value(default_splits: dict[str, list[Task]]) -> None:
    task = first_task(default_splits, lambda t: len(t.user_turns) == 2)
    result = run_oracle(task, ToolWorldExecutor(task))
    value = task.meta["answer_values"][1][0]
    dropped = result.final_answers[1].replace(value, "")
    partial = dataclasses.replace(result, final_answers=(result.final_answers[0], dropped))
    breakdown = score_breakdown(task, partial)
    assert breakdown.state_match and (1, value) in breakdown.missing
    assert score(task, partial) == 0.0 and 0.5 < score(task, partial, partial_credit=True) < 1.0
    truncated = dataclasses.replace(result, final_answers=result.final_answers[:1])
    assert score(task, truncated) == 0.0


def test_mentions_rules() -> None:
    assert mentions("You now have $1,250.", "1250") and mentions("balance 1250.00", "1250")
    assert not mentions("balance 12500", "1250") and not mentions("id evt_30", "evt_3")
    assert mentions("Booked as EVT_3.", "evt_3") and mentions('It says "Buy milk".', "buy milk")
    assert not mentions("", "x") and mentions("anything", "")


def test_executing_one_task_never_changes_another(default_splits: dict[str, list[Task]]) -> None:
    tasks = default_splits["val"][:10]
    before = [copy.deepcopy(t.initial_state) for t in tasks]
    executors = [ToolWorldExecutor(t) for t in tasks]
    shared = ToolWorldExecutor(tasks[0])
    for task, executor in zip(tasks, executors):
        run_oracle(task, executor)
    assert [t.initial_state for t in tasks] == before
    assert shared.state() == tasks[0].initial_state
    regenerated = generate_tasks()["val"][:10]
    assert [t.initial_state for t in regenerated] == before


def test_checklist_rules_follow_the_agents_own_ids(default_splits: dict[str, list[Task]]) -> None:
    task = first_task(default_splits, lambda t: t.meta["scenarios"][0] == "create_and_invite")
    (create,), (invite,) = task.gold_calls[0]
    executor = ToolWorldExecutor(task)
    detour = executor.execute(ToolCall("create_event", {**create.arguments, "time": "07:00"}))  # an extra event first
    created = executor.execute(create)
    assert created["event_id"] != create_id(task)
    own_invite = ToolCall("add_attendee", {**invite.arguments, "event_id": created["event_id"]})
    calls = (ToolCall("create_event", {}), create, own_invite)
    responses = ({"error": {"code": "X", "message": ""}}, created, executor.execute(own_invite))
    passes = evaluate_checklists(task, [TurnTranscript(calls, responses, task.gold_answers[0])])
    assert passes[0][:2] == (True, True) and detour["event_id"] == create_id(task)
    stale = ToolCall("add_attendee", {**invite.arguments, "event_id": "evt_99"})
    wrong = evaluate_checklists(task, [TurnTranscript((create, stale), (created, {"event_id": "evt_99"}), "")])
    assert wrong[0][1] is False and wrong[0][-1] is False  # wrong id and no reply
    errored = evaluate_checklists(task, [TurnTranscript((create,), ({"error": {"code": "CONFLICT"}},), "")])
    assert errored[0][0] is False  # a call whose response is an error does not pass


def create_id(task: Task) -> str:
    return task.gold_answers[0].split(" as ")[1].split(" ")[0]


def test_transcripts_from_rollout_turns() -> None:
    calls = (ToolCall("get_balance", {"account_id": "acc_1"}, "c1"),)
    turns = [Turn("a", calls, ({"balance": 5},), False, 0), Turn("b", calls, ({"balance": 6},), False, 1),
             Turn("c", (), (), False, 1)]
    out = transcripts_from_turns(turns, ("r0", "r1"))
    assert [t.reply for t in out] == ["r0", "r1"] and out[1].responses == ({"balance": 6},)


def test_cm2_round_trip(default_splits: dict[str, list[Task]]) -> None:
    for task in default_splits["test"]:
        row = json.loads(json.dumps(to_cm2_row(task, include_state=True)))
        assert set(row) == {"uuid", "messages", "tools", "checklists", "toolworld"}
        assert task_from_cm2_row(row) == task
        bare = task_from_cm2_row(json.loads(json.dumps(to_cm2_row(task))))
        assert (bare.user_turns, bare.gold_calls, bare.gold_answers, bare.checklists, bare.tools) == (
            task.user_turns, task.gold_calls, task.gold_answers, task.checklists, task.tools)
        for message in row["messages"]:
            for call in message["tool_calls"]:
                assert isinstance(call["function"]["arguments"], str)
            if message["role"] == "tool":
                assert isinstance(json.loads(message["content"]), dict)


def test_cm2_row_rejects_broken_arguments(default_splits: dict[str, list[Task]]) -> None:
    row = to_cm2_row(default_splits["train"][0])
    call_message = next(m for m in row["messages"] if m["tool_calls"])
    call_message["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(ValueError, match="not JSON"):
        task_from_cm2_row(row)


def test_env_implements_the_interface() -> None:
    env = ToolWorldEnv(ToolWorldConfig(n_train=12, n_val=4, n_test=8))
    assert env.name == "toolworld"
    assert [len(env.tasks(s)) for s in SPLITS] == [12, 4, 8]
    with pytest.raises(ValueError, match="valid splits"):
        env.tasks("dev")
    task = env.tasks("test")[0]
    executor = env.make_executor(task)
    assert isinstance(executor, Executor) and env.task(task.task_id) is task
    assert env.score(task, run_oracle(task, executor)) == 1.0
    assert env.score(task, EpisodeResult(final_answers=(), final_state={})) == 0.0
    assert 0.0 <= ToolWorldEnv(env.config, partial_credit=True).score(task, EpisodeResult(())) < 1.0


def test_report_helpers(default_splits: dict[str, list[Task]]) -> None:
    domains = describe_domains()
    assert len(domains) >= 4 and sum(d["n_tools"] for d in domains.values()) >= 20
    stats = split_stats(default_splits)
    assert stats["test"]["by_held_out"]["domain"] == 25 and stats["train"]["n_parallel_steps"] > 0
    assert sum(stats["train"]["by_composition"].values()) == len(default_splits["train"])
    assert stats_markdown(default_splits).count("\n") == 1 + len(SPLITS)
