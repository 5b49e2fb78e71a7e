"""Tool world: seeded task generation — determinism, split sizes and hold-out guarantees, task
structure, grounding of the gold answers, and the CM2 checklists derived from the gold calls."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from envace.core.checklist import Checklist
from envace.core.env import Task
from envace.data.cm2 import check_row
from envace.envs.toolworld import (
    DOMAINS,
    SPLITS,
    ToolWorldConfig,
    generate_tasks,
    mentions,
    to_cm2_row,
)
from envace.envs.toolworld.checklist import item_weights
from envace.envs.toolworld.generator import (
    DEFAULT_HELD_OUT_COMPOSITIONS,
    contains,
    recipe_tools,
)

CM2_KEYS = {
    "id",
    "question",
    "focus_on",
    "pass_condition",
    "failure_examples",
    "evidence",
    "weight",
    "required_for_next_turn",
    "dependence",
}
SAMPLE = Path(__file__).resolve().parents[4] / "shared" / "data" / "cm2" / "checklist_annotated_sample.json"


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Task]]:
    return generate_tasks()


def tasks_json(tasks_by_split: dict[str, list[Task]]) -> str:
    return json.dumps(
        {s: [to_cm2_row(t, include_state=True) for t in ts] for s, ts in tasks_by_split.items()}, sort_keys=True
    )


def tools_of(task: Task) -> set[str]:
    return {c.name for turn in task.gold_calls for step in turn for c in step}


def test_same_seed_same_tasks_different_seed_different() -> None:
    small = {"n_train": 30, "n_val": 10, "n_test": 20}
    first, again, other = (
        generate_tasks(seed=5, **small),
        generate_tasks(seed=5, **small),
        generate_tasks(seed=6, **small),
    )
    assert tasks_json(first) == tasks_json(again)
    assert tasks_json(first) != tasks_json(other)
    assert [t.user_turns for t in first["train"]] != [t.user_turns for t in other["train"]]


def test_generation_does_not_depend_on_hash_randomisation() -> None:
    code = (
        "import json,zlib;from envace.envs.toolworld import generate_tasks,to_cm2_row;"
        "t=generate_tasks(seed=3,n_train=20,n_val=5,n_test=10);"
        "print(zlib.crc32(json.dumps({s:[to_cm2_row(x,include_state=True) for x in v] for s,v in t.items()},"
        "sort_keys=True).encode()))"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=Path(__file__).resolve().parents[3],
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1 and digests.pop().strip().isdigit()


def test_split_sizes_and_test_composition(splits: dict[str, list[Task]]) -> None:
    config = ToolWorldConfig()
    assert [len(splits[s]) for s in SPLITS] == [config.n_train, config.n_val, config.n_test]
    held = {s: Counter(t.meta["held_out"] for t in ts) for s, ts in splits.items()}
    assert held["train"] == Counter({None: config.n_train})
    assert held["val"]["composition"] == round(config.n_val * config.val_composition_fraction)
    assert held["test"]["domain"] == round(config.n_test * config.test_domain_fraction)
    assert held["test"]["composition"] == round(config.n_test * config.test_composition_fraction)
    assert all(t.split == s for s, ts in splits.items() for t in ts)
    assert len({t.task_id for ts in splits.values() for t in ts}) == sum(map(len, splits.values()))


def test_held_out_domain_only_in_test(splits: dict[str, list[Task]]) -> None:
    held = ToolWorldConfig().held_out_domain
    assert all(t.domain != held for s in ("train", "val") for t in splits[s])
    for task in splits["test"]:
        assert (task.domain == held) == (task.meta["held_out"] == "domain")


def test_held_out_compositions_never_in_train(splits: dict[str, list[Task]]) -> None:
    for task in splits["train"]:
        assert not any(contains(tools_of(task), c) for c in DEFAULT_HELD_OUT_COMPOSITIONS), task.task_id
    for split in ("val", "test"):
        tagged = [t for t in splits[split] if t.meta["held_out"] == "composition"]
        assert {t.meta["held_out_composition"] for t in tagged} == set(DEFAULT_HELD_OUT_COMPOSITIONS)
        for task in splits[split]:
            has = any(contains(tools_of(task), c) for c in DEFAULT_HELD_OUT_COMPOSITIONS)
            assert has == (task.meta["held_out"] == "composition") or task.meta["held_out"] == "domain"
    # every tool of a held-out composition is still seen in train, only never together
    train_tools = set().union(*(tools_of(t) for t in splits["train"]))
    in_domains = {n for d, dom in DOMAINS.items() if d != ToolWorldConfig().held_out_domain for n in dom.tool_names}
    assert in_domains <= train_tools


def test_no_task_repeats_across_splits(splits: dict[str, list[Task]]) -> None:
    keys = [json.dumps([t.domain, t.user_turns, t.initial_state], sort_keys=True) for ts in splits.values() for t in ts]
    assert len(keys) == len(set(keys))


def test_task_structure(splits: dict[str, list[Task]]) -> None:
    tasks = [t for ts in splits.values() for t in ts]
    steps_per_turn = [len(turn) for t in tasks for turn in t.gold_calls]
    assert all(1 <= len(t.user_turns) <= 3 for t in tasks)
    assert max(steps_per_turn) <= 2 and steps_per_turn.count(1) / len(steps_per_turn) > 0.6
    assert sum(len(step) > 1 for t in tasks for turn in t.gold_calls for step in turn) > 20  # parallel calls
    assert sum(len(t.meta["bindings"]) for t in tasks) > 50  # ids flowing from one call into another
    assert Counter(len(t.user_turns) for t in splits["train"])[1] < len(splits["train"])
    for task in tasks:
        assert task.meta["composition"] == "+".join(sorted(tools_of(task)))
        assert set(recipe_tools(task.domain, tuple(task.meta["scenarios"]))) == tools_of(task)
        assert len(task.gold_calls) == len(task.gold_answers) == len(task.checklists) == len(task.user_turns)
        assert {s["function"]["name"] for s in task.tools} == set(DOMAINS[task.domain].tool_names)
        ids = [c.id for turn in task.gold_calls for step in turn for c in step]
        assert ids == [f"call_{i + 1}" for i in range(len(ids))]


def test_user_messages_have_paraphrase_variety(splits: dict[str, list[Task]]) -> None:
    openings = Counter(t.user_turns[0].split(" ", 1)[0] for t in splits["train"])
    assert len(openings) >= 25
    follow_ons = [u for t in splits["train"] for u in t.user_turns[1:]]
    assert any(u.startswith(("Also, ", "Next, ")) for u in follow_ons)


def test_gold_answers_are_grounded(splits: dict[str, list[Task]]) -> None:
    """Every key value is in the gold reply and comes from the user or from a tool response so far."""
    for task in (t for ts in splits.values() for t in ts):
        rows = to_cm2_row(task)["messages"]
        seen = ""
        turn = -1
        for message in rows:
            if message["role"] in ("user", "tool"):
                seen += "\n" + message["content"]
                turn += message["role"] == "user"
            elif message["role"] == "assistant" and not message["tool_calls"]:
                for value in task.meta["answer_values"][turn]:
                    assert mentions(message["content"], value), (task.task_id, value)
                    assert mentions(seen, value), (task.task_id, value)


def test_checklists_have_cm2_shape_and_weights_sum_to_one(splits: dict[str, list[Task]]) -> None:
    for task in (t for ts in splits.values() for t in ts):
        for turn, items in enumerate(task.checklists):
            assert math.isclose(sum(i["weight"] for i in items), 1.0, abs_tol=1e-9), task.task_id
            ids = [i["id"] for i in items]
            assert len(set(ids)) == len(ids)
            for item in items:
                assert CM2_KEYS <= set(item) and item["weight"] > 0
                assert set(item["dependence"]) <= set(ids) - {item["id"]}
                assert item["rule"]["kind"] in ("tool_call", "answer_contains")
                assert all(e["turn"] == turn for e in item["evidence"])
            answers = [i["rule"] for i in items if i["rule"]["kind"] == "answer_contains"]
            assert [r["text"] for r in answers] == task.meta["answer_values"][turn]
            assert all(r["values"] == [r["text"]] for r in answers) and items[-1]["rule"] == answers[-1]


@pytest.mark.parametrize("n_calls", range(7))
@pytest.mark.parametrize("n_values", range(1, 7))
def test_item_weights_sum_to_one(n_calls: int, n_values: int) -> None:
    calls, answers = item_weights(n_calls, n_values)
    assert len(calls) == n_calls and len(answers) == n_values and min(calls + answers) > 0
    assert math.isclose(sum(calls) + sum(answers), 1.0, abs_tol=1e-9)
    assert math.isclose(sum(answers), 0.3 if n_calls else 1.0, abs_tol=1e-9)


def test_checklist_evidence_points_at_the_gold_messages(splits: dict[str, list[Task]]) -> None:
    for task in splits["val"]:
        messages = to_cm2_row(task, include_system=False)["messages"]
        starts = [i for i, m in enumerate(messages) if m["role"] == "user"]
        for turn, items in enumerate(task.checklists):
            for item in items:
                evidence = item["evidence"][0]
                message = messages[starts[turn] + evidence["step"]]
                assert message["role"] == "assistant"
                if item["rule"]["kind"] == "tool_call":
                    assert item["rule"]["name"] in [c["function"]["name"] for c in message["tool_calls"]]
                else:
                    assert message["content"] == evidence["snippet"] == task.gold_answers[turn]


def test_rows_pass_the_data_stage_validator_and_checklist_parser() -> None:
    """Contract with envace.data.cm2 / envace.core.checklist."""
    for task in (t for ts in generate_tasks(n_train=40, n_val=10, n_test=20).values() for t in ts):
        row = to_cm2_row(task, include_state=True)
        check_row(row)
        Checklist.from_raw(row["checklists"][0])


@pytest.mark.skipif(not SAMPLE.exists(), reason="shared CM2 sample not present")
def test_checklist_items_carry_every_key_of_the_released_cm2_sample(splits: dict[str, list[Task]]) -> None:
    sample = json.loads(SAMPLE.read_text())[0]["checklists"][0][0][0]
    ours = splits["train"][0].checklists[0][0]
    assert set(sample) - {"extra_info"} <= set(ours)
    assert set(sample["evidence"][0]) == set(ours["evidence"][0])


@pytest.mark.parametrize(
    "override,match",
    [
        ({"held_out_domain": "weather"}, "valid domains"),
        ({"held_out_compositions": ("transfer+deposit",)}, "sorted"),
        ({"held_out_compositions": ("add_todo+complete_todo",)}, "non-held-out domain"),
        ({"held_out_compositions": ("deposit+list_files",)}, "one non-held-out domain"),
        ({"turn_weights": (1.0, 0.0)}, "turn_weights"),
        ({"test_domain_fraction": 0.9}, "fractions"),
        ({"n_val": -1}, "sizes"),
    ],
)
def test_config_errors_say_what_is_wrong(override: dict, match: str) -> None:
    with pytest.raises((ValueError, KeyError), match=match):
        dataclasses.replace(ToolWorldConfig(), **override)


def test_no_hold_out_configuration() -> None:
    splits = generate_tasks(n_train=40, n_val=10, n_test=10, held_out_domain=None, held_out_compositions=())
    assert {t.meta["held_out"] for ts in splits.values() for t in ts} == {None}
    assert {t.domain for t in splits["train"]} == set(DOMAINS)


def _instruction(task: Task) -> tuple[str, ...]:
    return tuple(task.user_turns)


def _gold_sequence(task: Task) -> str:
    return json.dumps(
        [[[[c.name, c.arguments] for c in step] for step in turn] for turn in task.gold_calls], sort_keys=True
    )


def test_splits_disjoint(splits: dict[str, list[Task]], caplog: pytest.LogCaptureFixture) -> None:
    """At default sizes no val/test task repeats a train task's instruction or gold-call sequence; the
    splits keep their sizes, the train draws redrawn for it are counted in the log, and val/test do not
    depend on ``n_train``."""
    config = ToolWorldConfig()
    assert [len(splits[s]) for s in SPLITS] == [config.n_train, config.n_val, config.n_test]
    texts = {_instruction(t) for t in splits["train"]}
    calls = {_gold_sequence(t) for t in splits["train"]}
    for split in ("val", "test"):
        assert not [t.task_id for t in splits[split] if _instruction(t) in texts], split
        assert not [t.task_id for t in splits[split] if _gold_sequence(t) in calls], split
    with caplog.at_level(logging.INFO, logger="envace.envs.toolworld.generator"):
        again = generate_tasks()
    assert tasks_json(again) == tasks_json(splits)
    found = (re.search(r"(\d+) train draws redrawn", r.getMessage()) for r in caplog.records)
    redrawn = [int(m.group(1)) for m in found if m]
    assert redrawn and redrawn[0] > 0
    fewer = generate_tasks(n_train=50)
    assert tasks_json({s: fewer[s] for s in ("val", "test")}) == tasks_json({s: splits[s] for s in ("val", "test")})
