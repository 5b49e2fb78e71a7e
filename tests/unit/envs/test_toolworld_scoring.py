"""Tool world: the oracle scores 1.0 everywhere, the scorer and the checklist rules fail what they
should, executors are isolated, the CM2 export round-trips, and ``ToolWorldEnv`` fits the interface."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
from typing import Any

import pytest

from envace.core.env import EpisodeResult, Executor, Task
from envace.core.records import EpisodeSpec, GoldStep, ToolCall, Trajectory, Turn
from envace.data.specs import episode_spec_from_task
from envace.envs.toolworld import (
    DOMAINS,
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
from envace.envs.toolworld.reward import toolworld_verifiable_reward, verifiable_reward
from envace.judges.reward import checklist_reward_fn
from envace.judges.rule import RuleJudge


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
    turns = [
        Turn("a", calls, ({"balance": 5},), False, 0),
        Turn("b", calls, ({"balance": 6},), False, 1),
        Turn("c", (), (), False, 1),
    ]
    out = transcripts_from_turns(turns, ("r0", "r1"))
    assert [t.reply for t in out] == ["r0", "r1"] and out[1].responses == ({"balance": 6},)


def test_cm2_round_trip(default_splits: dict[str, list[Task]]) -> None:
    for task in default_splits["test"]:
        row = json.loads(json.dumps(to_cm2_row(task, include_state=True)))
        assert set(row) == {"uuid", "messages", "tools", "checklists", "toolworld"}
        assert task_from_cm2_row(row) == task
        bare = task_from_cm2_row(json.loads(json.dumps(to_cm2_row(task))))
        assert (bare.user_turns, bare.gold_calls, bare.gold_answers, bare.checklists, bare.tools) == (
            task.user_turns,
            task.gold_calls,
            task.gold_answers,
            task.checklists,
            task.tools,
        )
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


# ---- the built-in verifiable reward follows ids through the trajectory's own responses ----------
_ID_LIKE = re.compile(r"^(?:[a-z]+_\d+|[a-z]+/[\w.-]+)$")  # counter ids (evt_3) and file paths (a/b.md)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _fresh(old: str, n: int) -> str:
    if "/" in old:
        folder, name = old.rsplit("/", 1)
        return f"{folder}/renamed{n}_{name}"
    return f"{old.rsplit('_', 1)[0]}_{700 + n}"


def gold_trajectory(spec: EpisodeSpec, names: dict[str, str] | None = None) -> Trajectory:
    """The gold conversation as a rollout: one ``Turn`` per gold step, then the gold reply. With
    ``names`` (old id -> new id), ids are renamed in every response, in every *later* argument and in
    the replies, as a rehearser that invents its own ids and an actor that follows them would produce."""
    return world_trajectory(spec, {_world_key(old): new for old, new in (names or {}).items()})


def response_ids(spec: EpisodeSpec) -> dict[str, str]:
    """A consistent renaming of every id that first appears in a response (ids the user states are
    kept: a replayed user turn would state them anyway)."""
    users = " ".join(spec.user_turns)
    known = {
        s
        for s in _strings([[r for st in steps for r in st.responses] for steps in spec.gold])
        if re.search(rf"(?<![\w/]){re.escape(s)}(?![\w/])", users)
    }
    names: dict[str, str] = {}
    for steps in spec.gold:
        for step in steps:
            known |= {s for c in step.calls for s in _strings(c.arguments) if s not in names}
            for s in (s for r in step.responses for s in _strings(r)):
                if _ID_LIKE.match(s) and s not in known and s not in names:
                    names[s] = _fresh(s, len(names))
    return names


def bound_tasks(tasks: list[Task], n: int) -> list[tuple[Task, EpisodeSpec]]:
    """Up to ``n`` tasks whose gold calls take ids from earlier responses, domains taken in turn."""
    by_domain: dict[str, list[Task]] = {}
    for task in tasks:
        if task.meta["bindings"]:
            by_domain.setdefault(task.domain, []).append(task)
    picked = [t for group in itertools.zip_longest(*by_domain.values()) for t in group if t is not None][:n]
    return [(t, episode_spec_from_task(t, ToolWorldExecutor(t))) for t in picked]


def _replace_bound_argument(traj: Trajectory, call_id: str, argument: str, value: Any) -> Trajectory:
    turns = []
    for turn in traj.turns:
        calls = tuple(
            ToolCall(c.name, {**c.arguments, argument: value}, c.id) if c.id == call_id else c for c in turn.tool_calls
        )
        turns.append(dataclasses.replace(turn, tool_calls=calls))
    return dataclasses.replace(traj, turns=tuple(turns))


def test_reward_binding_aware(default_splits: dict[str, list[Task]]) -> None:
    pairs = bound_tasks(all_tasks(default_splits), 40)
    assert {t.domain for t, _ in pairs} == set(DOMAINS)
    checked = collided = swapped = 0
    for task, spec in pairs:
        gold = toolworld_verifiable_reward(spec, gold_trajectory(spec)).reward
        assert gold == 1.0, task.task_id
        names = response_ids(spec)
        bound = [
            (cid, arg)
            for cid, args in task.meta["bindings"].items()
            for arg in args
            if value_of(task, cid, arg) in names
        ]  # ids a user turn states are not renamed
        assert bound or any(
            value_of(task, c, a) in " ".join(task.user_turns) for c, args in task.meta["bindings"].items() for a in args
        ), task.task_id
        renamed = gold_trajectory(spec, names)
        assert toolworld_verifiable_reward(spec, renamed).reward == gold, task.task_id  # consistent: exactly gold
        if not bound:
            continue
        checked += 1
        cid, arg = bound[0]
        for wrong in (
            value_of(task, cid, arg),  # the real id, which no response of this trajectory returned
            "zzz_999",
        ):  # an id nobody returned
            broken = _replace_bound_argument(renamed, cid, arg, wrong)
            assert toolworld_verifiable_reward(spec, broken).reward < gold, (task.task_id, wrong)
        olds = sorted({value_of(task, c, a) for c, a in bound})
        if len(olds) > 1:  # two gold ids renamed to one id: the responses and the arguments agree, yet not gold
            merged = gold_trajectory(spec, {**names, olds[1]: names[olds[0]]})
            assert toolworld_verifiable_reward(spec, merged).reward < gold, task.task_id
            collided += 1
            # an id of the wrong earlier response / field: two bound arguments exchange their ids
            other = next((c, a) for c, a in bound if value_of(task, c, a) != value_of(task, cid, arg))
            exchanged = _replace_bound_argument(renamed, cid, arg, names[value_of(task, *other)])
            exchanged = _replace_bound_argument(exchanged, other[0], other[1], names[value_of(task, cid, arg)])
            assert toolworld_verifiable_reward(spec, exchanged).reward < gold, task.task_id
            swapped += 1
    assert checked >= 30 and collided >= 3 and swapped >= 3


def value_of(task: Task, call_id: str, argument: str) -> Any:
    """The gold literal of a bound argument."""
    call = next(c for turn in task.gold_calls for step in turn for c in step if c.id == call_id)
    return call.arguments[argument]


def test_reward_bound_ids_come_from_earlier_steps_only() -> None:
    """A call cannot use the response of a call issued in the same step; real ids still match as gold."""
    spec = EpisodeSpec(
        task_id="t",
        system_prompt="",
        user_turns=("Book it and invite Ann.",),
        tools=({"type": "function", "function": {"name": "create_event"}},),
        gold=(
            (
                GoldStep((ToolCall("create_event", {"title": "x"}, "call_1"),), ({"event_id": "evt_1"},)),
                GoldStep((ToolCall("add_attendee", {"event_id": "evt_1"}, "call_2"),), ({},)),
            ),
        ),
        meta={"bindings": {"call_2": {"event_id": {"call": "call_1", "path": ["event_id"]}}}},
    )
    create, invite = ToolCall("create_event", {"title": "x"}), ToolCall("add_attendee", {"event_id": "evt_9"})
    reply = Turn("done", user_turn=0)
    later = Trajectory("t", 0, turns=(Turn("", (create,), ({"event_id": "evt_9"},)), Turn("", (invite,), ({},)), reply))
    same_step = Trajectory("t", 0, turns=(Turn("", (create, invite), ({"event_id": "evt_9"}, {})), reply))
    assert toolworld_verifiable_reward(spec, later).reward == 1.0
    assert toolworld_verifiable_reward(spec, same_step).reward == 0.5  # add_attendee is not paired


def _one_turn_spec(gold_calls: list[ToolCall], bindings: dict | None = None) -> EpisodeSpec:
    steps = tuple(GoldStep((call,), ({"ok": True},)) for call in gold_calls)
    return EpisodeSpec(
        task_id="t",
        system_prompt="",
        user_turns=("Move the money.",),
        tools=(),
        gold=(steps,),
        meta={"bindings": bindings or {}},
    )


def _calls(*calls: ToolCall) -> Trajectory:
    turns = tuple(Turn("", (call,), ({"ok": True},)) for call in calls)
    return Trajectory("t", 0, turns=(*turns, Turn("done", user_turn=0)))


def test_argument_credit_pays_a_share_of_a_near_miss_call() -> None:
    """judge.argument_credit: an unpaired gold call earns the weight times the share of arguments its closest
    made call got right; 0 keeps the exact-call reward; a near miss never earns a full call."""
    gold = ToolCall("transfer", {"from_id": "acc_1", "to_id": "acc_2", "amount": 2650}, "call_1")
    spec = _one_turn_spec([gold])
    two_of_three = _calls(ToolCall("transfer", {"from_id": "acc_1", "to_id": "acc_2", "amount": 270}))
    wrong_tool = _calls(ToolCall("deposit", {"from_id": "acc_1", "to_id": "acc_2", "amount": 2650}))
    extra_arg = _calls(ToolCall("transfer", {**gold.arguments, "memo": "x"}))
    exact = _calls(ToolCall("transfer", dict(gold.arguments)))
    assert toolworld_verifiable_reward(spec, two_of_three).reward == 0.0
    assert toolworld_verifiable_reward(spec, two_of_three, argument_credit=0.5).reward == pytest.approx(0.5 * 2 / 3)
    assert verifiable_reward(0.5)(spec, two_of_three).reward == pytest.approx(1 / 3)
    assert toolworld_verifiable_reward(spec, wrong_tool, argument_credit=0.5).reward == 0.0
    assert toolworld_verifiable_reward(spec, extra_arg, argument_credit=0.9).reward == pytest.approx(0.9 * 3 / 4)
    assert toolworld_verifiable_reward(spec, exact, argument_credit=0.5).reward == 1.0
    # a later exact call replaces the near miss's credit; the extra call still costs (2 made, 1 gold)
    retried = _calls(two_of_three.turns[0].tool_calls[0], exact.turns[0].tool_calls[0])
    assert toolworld_verifiable_reward(spec, retried, argument_credit=0.5).reward == 0.5
    assert verifiable_reward(0.0) is toolworld_verifiable_reward
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="judge.argument_credit"):
            verifiable_reward(bad)


def test_a_near_miss_credits_one_gold_call_and_bound_arguments_follow_the_responses() -> None:
    deposits = [
        ToolCall("deposit", {"account_id": "acc_1", "amount": 10}, "call_1"),
        ToolCall("deposit", {"account_id": "acc_2", "amount": 20}, "call_2"),
    ]
    half_of_each = _calls(ToolCall("deposit", {"account_id": "acc_1", "amount": 20}))
    # one made call, two gold calls it half-matches: it credits the first only -> 0.5 * 0.5 / 2 gold calls
    reward = toolworld_verifiable_reward(_one_turn_spec(deposits), half_of_each, argument_credit=0.5).reward
    assert reward == pytest.approx(0.125)
    # a bound argument must hold the id the corresponding earlier response returned, not the gold literal
    create = ToolCall("create_event", {"title": "x"}, "call_1")
    invite = ToolCall("add_attendee", {"event_id": "evt_1", "name": "Ann"}, "call_2")
    spec = EpisodeSpec(
        task_id="t",
        system_prompt="",
        user_turns=("Book it and invite Ann.",),
        tools=(),
        gold=((GoldStep((create,), ({"event_id": "evt_1"},)), GoldStep((invite,), ({},))),),
        meta={"bindings": {"call_2": {"event_id": {"call": "call_1", "path": ["event_id"]}}}},
    )

    def invited(event_id: str) -> Trajectory:
        made = ToolCall("add_attendee", {"event_id": event_id, "name": "Bob"})
        turns = (
            Turn("", (ToolCall("create_event", {"title": "x"}),), ({"event_id": "evt_9"},)),
            Turn("", (made,), ({},)),
            Turn("done", user_turn=0),
        )
        return Trajectory("t", 0, turns=turns)

    # create pairs (1 of 2 calls); the invite's right id (evt_9, its own response's) earns half its arguments
    assert toolworld_verifiable_reward(spec, invited("evt_9"), argument_credit=0.5).reward == pytest.approx(
        (1 + 0.5 * 0.5) / 2
    )
    assert toolworld_verifiable_reward(spec, invited("evt_1"), argument_credit=0.5).reward == 0.5


def test_near_miss_credit_does_not_depend_on_call_order_and_ignores_repeats() -> None:
    deposits = [
        ToolCall("deposit", {"account_id": "acc_1", "amount": 10}, "call_1"),
        ToolCall("deposit", {"account_id": "acc_2", "amount": 20}, "call_2"),
    ]
    spec = _one_turn_spec(deposits)
    near, right = (
        ToolCall("deposit", {"account_id": "acc_2", "amount": 10}),
        ToolCall("deposit", dict(deposits[0].arguments)),
    )
    first, second = (
        toolworld_verifiable_reward(spec, _calls(*order), argument_credit=0.5).reward
        for order in ((near, right), (right, near))
    )
    assert first == second == pytest.approx((1 + 0.5 * 0.5) / 2)  # the near miss credits the gold call left unpaired
    transfers = [
        ToolCall("transfer", {"from_id": "acc_1", "to_id": "acc_2", "amount": 5}, "call_1"),
        ToolCall("transfer", {"from_id": "acc_1", "to_id": "acc_3", "amount": 7}, "call_2"),
    ]
    again = ToolCall("transfer", dict(transfers[0].arguments))
    repeated = _calls(again, again)  # a repeat of a paired call is no attempt at the other transfer
    assert toolworld_verifiable_reward(_one_turn_spec(transfers), repeated, argument_credit=0.5).reward == 0.5


# ---- the answer part of both training rewards follows the trajectory's own responses --------------
def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _world_key(value: Any) -> Any:
    return (type(value).__name__, value)


def imagined_world(spec: EpisodeSpec) -> dict[Any, Any]:
    """A consistent imagined world: every id and number a response returns that neither a user turn
    states nor an earlier call argument holds is replaced by a fresh one (the same old value always by
    the same new one), as a rehearser that invents its own world and an actor that follows it would."""
    users = " ".join(spec.user_turns)
    names: dict[Any, Any] = {}
    known: set[Any] = set()
    for steps in spec.gold:
        for step in steps:
            known |= {_world_key(x) for c in step.calls for x in _leaves(c.arguments) if _world_key(x) not in names}
            for x in (x for r in step.responses for x in _leaves(r)):
                key = _world_key(x)
                if key in known or key in names or isinstance(x, bool) or mentions(users, str(x)):
                    continue
                if isinstance(x, (int, float)):
                    names[key] = x + 7000 + len(names)
                elif isinstance(x, str) and _ID_LIKE.match(x):
                    names[key] = _fresh(x, len(names))
    return names


def _world(value: Any, names: dict[Any, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _world(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_world(v, names) for v in value]
    return names.get(_world_key(value), value) if not isinstance(value, bool) else value


def _restate(text: str, names: dict[Any, Any]) -> str:
    """``text`` with every renamed value written as its new value (whole tokens only, longest first)."""
    pairs = sorted(((str(k[1]), str(v)) for k, v in names.items()), key=lambda p: -len(p[0]))
    pattern = re.compile("|".join(rf"(?<![0-9A-Za-z_.]){re.escape(old)}(?![0-9A-Za-z_])" for old, _ in pairs))
    table = dict(pairs)
    return pattern.sub(lambda m: table[m.group(0)], text) if pairs else text


def world_trajectory(spec: EpisodeSpec, names: dict[Any, Any], replies: list[str] | None = None) -> Trajectory:
    """The gold calls played in the world ``names`` (renamed responses, later arguments following
    them), ending each turn with the given reply, or by default with the gold reply restating what the
    trajectory's own responses returned so far."""
    introduced: set[Any] = set()
    turns = []
    for t, steps in enumerate(spec.gold):
        for step in steps:
            visible = {k: v for k, v in names.items() if k in introduced}
            calls = tuple(ToolCall(c.name, _world(c.arguments, visible), c.id) for c in step.calls)
            turns.append(Turn("", calls, tuple(_world(r, names) for r in step.responses), True, t))
            introduced |= {_world_key(x) for r in step.responses for x in _leaves(r)} & set(names)
        said = {k: v for k, v in names.items() if k in introduced}
        turns.append(Turn(replies[t] if replies else _restate(spec.gold_answers[t], said), user_turn=t))
    return Trajectory(prompt_id=spec.task_id, sample_index=0, turns=tuple(turns))


def own_replies(trajectory: Trajectory) -> list[str]:
    return [turn.act_text for turn in trajectory.turns if not turn.tool_calls]


def both_rewards(task: Task, spec: EpisodeSpec, trajectory: Trajectory) -> tuple[float, float]:
    """(verifiable reward, rule-judge checklist reward) of one trajectory."""
    rule = checklist_reward_fn(RuleJudge())(spec, trajectory)[0]
    return toolworld_verifiable_reward(spec, trajectory).reward, rule


def test_answer_reward_binding_aware() -> None:
    by_domain: dict[str, int] = {}
    checked = 0
    for task in all_tasks(generate_tasks(seed=1, held_out_domain=None)):  # every domain in every split
        if by_domain.get(task.domain, 0) >= 40:
            continue
        spec = episode_spec_from_task(task, ToolWorldExecutor(task))
        names = imagined_world(spec)
        gold = both_rewards(task, spec, world_trajectory(spec, {}, list(spec.gold_answers)))
        assert gold == pytest.approx((1.0, 1.0)), task.task_id
        imagined = world_trajectory(spec, names)
        own = own_replies(imagined)
        assert both_rewards(task, spec, imagined) == gold, (task.task_id, own)  # consistent: exactly gold
        by_domain[task.domain] = by_domain.get(task.domain, 0) + 1
        restated = [(t, v) for t, vs in enumerate(spec.answer_values) for v in vs if not mentions(own[t], v)]
        if not restated:
            continue
        checked += 1
        # the real values, where the trajectory's own responses said otherwise
        real = world_trajectory(spec, names, list(spec.gold_answers))
        assert all(r < g for r, g in zip(both_rewards(task, spec, real), gold)), task.task_id
        # a value its own responses never returned: one restated value replaced by an invented one
        t, value = restated[0]
        invented = list(own)
        invented[t] = _restate(spec.gold_answers[t], {_world_key(value): "zzz_999"})
        assert all(r < g for r, g in zip(both_rewards(task, spec, world_trajectory(spec, names, invented)), gold))
    assert set(by_domain) == set(DOMAINS) and min(by_domain.values()) >= 40, by_domain
    assert checked >= 100, checked


def test_mentions_is_token_aware_in_training_and_evaluation() -> None:
    """One rule for the training answer check and the evaluation scorer: '1250' is not in '12507'."""
    spec = EpisodeSpec(
        task_id="t",
        system_prompt="",
        user_turns=("What is my balance?",),
        tools=(),
        gold=((),),
        gold_answers=("Your balance is 1250.",),
        answer_values=(("1250",),),
    )
    inside = Trajectory("t", 0, turns=(Turn("Your balance is 12507.", user_turn=0),))
    exact = Trajectory("t", 0, turns=(Turn("Your balance is 1,250.", user_turn=0),))
    assert toolworld_verifiable_reward(spec, inside).reward == 0.5  # the call part (no calls) only
    assert toolworld_verifiable_reward(spec, exact).reward == 1.0
    assert not mentions("Your balance is 12507.", "1250") and mentions("Your balance is 1,250.", "1250")
