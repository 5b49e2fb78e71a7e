"""Tool world: tool schemas, argument validation, every tool's success and error paths, executor
atomicity and isolation."""

from __future__ import annotations

import copy
import dataclasses
import json

import jsonschema
import pytest

from envace.core.env import Executor
from envace.core.records import ToolCall
from envace.envs.toolworld import (
    DOMAINS,
    TOOLS,
    ToolError,
    ToolWorldExecutor,
    generate_tasks,
    is_error,
)

SUPPORTED_KEYWORDS = {"type", "description", "enum", "pattern", "minLength", "minimum", "maximum", "default"}

FIXTURES = {
    "bank": {
        "accounts": {"acc_1": {"name": "checking", "balance": 500}, "acc_2": {"name": "savings", "balance": 100}},
        "transactions": [
            {"transaction_id": "txn_1", "kind": "deposit", "from_account": None, "to_account": "acc_1", "amount": 50}
        ],
        "next_ids": {"txn": 2},
    },
    "calendar": {
        "events": {
            "evt_1": {"title": "Standup", "date": "2025-03-04", "time": "09:00", "attendees": ["ana@example.com"]},
            "evt_2": {"title": "Dentist", "date": "2025-03-04", "time": "14:00", "attendees": []},
        },
        "next_ids": {"evt": 3},
    },
    "shop": {
        "products": {
            "prd_1": {"name": "desk lamp", "price": 30, "stock": 2},
            "prd_2": {"name": "coffee mug", "price": 10, "stock": 0},
        },
        "cart": {},
        "orders": {
            "ord_1": {"items": {"prd_1": 1}, "total": 30, "status": "shipped"},
            "ord_2": {"items": {"prd_1": 1}, "total": 30, "status": "placed"},
        },
        "next_ids": {"ord": 3},
    },
    "files": {
        "folders": ["docs", "archive"],
        "files": {
            "docs/notes.txt": {"content": "hello"},
            "archive/notes.txt": {"content": "old"},
            "docs/plan.md": {"content": "ship it"},
        },
    },
    "todo": {
        "todos": {
            "todo_1": {"title": "pay rent", "due": "2025-03-05", "priority": "normal", "done": False},
            "todo_2": {"title": "call mom", "due": "2025-03-06", "priority": "low", "done": True},
        },
        "next_ids": {"todo": 3},
    },
}

# (tool, arguments, exact response) on the fixture state of the tool's domain
SUCCESSES = [
    (
        "list_accounts",
        {},
        {
            "accounts": [
                {"account_id": "acc_1", "name": "checking", "balance": 500},
                {"account_id": "acc_2", "name": "savings", "balance": 100},
            ]
        },
    ),
    ("get_balance", {"account_id": "acc_2"}, {"account_id": "acc_2", "balance": 100}),
    (
        "transfer",
        {"from_account_id": "acc_1", "to_account_id": "acc_2", "amount": 200},
        {"transaction_id": "txn_2", "from_balance": 300, "to_balance": 300},
    ),
    ("deposit", {"account_id": "acc_2", "amount": 5.0}, {"transaction_id": "txn_2", "balance": 105}),
    (
        "get_transactions",
        {"account_id": "acc_1"},
        {"account_id": "acc_1", "transactions": [{"transaction_id": "txn_1", "kind": "deposit", "amount": 50}]},
    ),
    (
        "create_event",
        {"title": "Yoga", "date": "2025-03-04", "time": "10:00"},
        {"event_id": "evt_3", "title": "Yoga", "date": "2025-03-04", "time": "10:00"},
    ),
    (
        "list_events",
        {"date": "2025-03-04"},
        {
            "date": "2025-03-04",
            "events": [
                {"event_id": "evt_1", "title": "Standup", "time": "09:00"},
                {"event_id": "evt_2", "title": "Dentist", "time": "14:00"},
            ],
        },
    ),
    (
        "add_attendee",
        {"event_id": "evt_1", "email": "ben@example.com"},
        {"event_id": "evt_1", "email": "ben@example.com", "attendee_count": 2},
    ),
    (
        "reschedule_event",
        {"event_id": "evt_1", "date": "2025-03-05", "time": "14:00"},
        {"event_id": "evt_1", "date": "2025-03-05", "time": "14:00"},
    ),
    ("cancel_event", {"event_id": "evt_2"}, {"event_id": "evt_2", "status": "cancelled"}),
    (
        "search_products",
        {"query": "LAMP"},
        {"products": [{"product_id": "prd_1", "name": "desk lamp", "price": 30, "stock": 2}]},
    ),
    ("add_to_cart", {"product_id": "prd_1", "quantity": 2}, {"product_id": "prd_1", "quantity": 2, "cart_total": 60}),
    ("view_cart", {}, {"items": [], "total": 0}),
    ("get_order", {"order_id": "ord_1"}, {"order_id": "ord_1", "status": "shipped", "total": 30}),
    ("cancel_order", {"order_id": "ord_2"}, {"order_id": "ord_2", "status": "cancelled"}),
    ("list_files", {"folder": "docs"}, {"folder": "docs", "files": ["docs/notes.txt", "docs/plan.md"]}),
    ("read_file", {"path": "docs/plan.md"}, {"path": "docs/plan.md", "content": "ship it"}),
    (
        "write_file",
        {"path": "docs/notes.txt", "content": "new", "overwrite": True},
        {"path": "docs/notes.txt", "size": 3},
    ),
    (
        "move_file",
        {"path": "docs/plan.md", "folder": "archive"},
        {"old_path": "docs/plan.md", "new_path": "archive/plan.md"},
    ),
    ("delete_file", {"path": "docs/notes.txt"}, {"path": "docs/notes.txt", "deleted": True}),
    (
        "add_todo",
        {"title": "call mom", "due": "2025-03-09"},
        {"todo_id": "todo_3", "title": "call mom", "due": "2025-03-09"},
    ),
    ("list_todos", {}, {"status": "open", "todos": [{"todo_id": "todo_1", "title": "pay rent", "due": "2025-03-05"}]}),
    ("complete_todo", {"todo_id": "todo_1"}, {"todo_id": "todo_1", "done": True}),
    ("set_todo_priority", {"todo_id": "todo_2", "priority": "high"}, {"todo_id": "todo_2", "priority": "high"}),
    ("delete_todo", {"todo_id": "todo_2"}, {"todo_id": "todo_2", "deleted": True}),
]

# (tool, arguments, error code) — the domain-level failures of each tool
DOMAIN_ERRORS = [
    ("get_balance", {"account_id": "acc_9"}, "NOT_FOUND"),
    ("transfer", {"from_account_id": "acc_1", "to_account_id": "acc_9", "amount": 10}, "NOT_FOUND"),
    ("transfer", {"from_account_id": "acc_1", "to_account_id": "acc_1", "amount": 10}, "INVALID_VALUE"),
    ("transfer", {"from_account_id": "acc_2", "to_account_id": "acc_1", "amount": 101}, "INSUFFICIENT_FUNDS"),
    ("transfer", {"from_account_id": "acc_2", "to_account_id": "acc_1", "amount": 0}, "INVALID_VALUE"),
    ("deposit", {"account_id": "acc_9", "amount": 5}, "NOT_FOUND"),
    ("deposit", {"account_id": "acc_1", "amount": -5}, "INVALID_VALUE"),
    ("get_transactions", {"account_id": "acc_9"}, "NOT_FOUND"),
    ("get_transactions", {"account_id": "acc_1", "limit": 11}, "INVALID_VALUE"),
    ("create_event", {"title": "Yoga", "date": "March 4", "time": "10:00"}, "INVALID_VALUE"),
    ("create_event", {"title": "Yoga", "date": "2025-02-30", "time": "10:00"}, "INVALID_VALUE"),
    ("create_event", {"title": "Yoga", "date": "2025-03-04", "time": "9am"}, "INVALID_VALUE"),
    ("create_event", {"title": "", "date": "2025-03-04", "time": "10:00"}, "INVALID_VALUE"),
    ("create_event", {"title": "Yoga", "date": "2025-03-04", "time": "09:00"}, "CONFLICT"),
    ("list_events", {"date": "tomorrow"}, "INVALID_VALUE"),
    ("add_attendee", {"event_id": "evt_9", "email": "ben@example.com"}, "NOT_FOUND"),
    ("add_attendee", {"event_id": "evt_1", "email": "ana@example.com"}, "ALREADY_EXISTS"),
    ("add_attendee", {"event_id": "evt_1", "email": "bob"}, "INVALID_VALUE"),
    ("reschedule_event", {"event_id": "evt_9", "date": "2025-03-05", "time": "10:00"}, "NOT_FOUND"),
    ("reschedule_event", {"event_id": "evt_1", "date": "2025-03-04", "time": "14:00"}, "CONFLICT"),
    ("cancel_event", {"event_id": "evt_9"}, "NOT_FOUND"),
    ("search_products", {"query": ""}, "INVALID_VALUE"),
    ("add_to_cart", {"product_id": "prd_9", "quantity": 1}, "NOT_FOUND"),
    ("add_to_cart", {"product_id": "prd_2", "quantity": 1}, "OUT_OF_STOCK"),
    ("add_to_cart", {"product_id": "prd_1", "quantity": 3}, "OUT_OF_STOCK"),
    ("add_to_cart", {"product_id": "prd_1", "quantity": 0}, "INVALID_VALUE"),
    ("place_order", {}, "EMPTY_CART"),
    ("get_order", {"order_id": "ord_9"}, "NOT_FOUND"),
    ("cancel_order", {"order_id": "ord_9"}, "NOT_FOUND"),
    ("cancel_order", {"order_id": "ord_1"}, "INVALID_STATE"),
    ("list_files", {"folder": "music"}, "NOT_FOUND"),
    ("read_file", {"path": "docs/missing.txt"}, "NOT_FOUND"),
    ("read_file", {"path": "notes"}, "INVALID_VALUE"),
    ("write_file", {"path": "docs/notes.txt", "content": "x"}, "ALREADY_EXISTS"),
    ("write_file", {"path": "music/song.txt", "content": "x"}, "NOT_FOUND"),
    ("move_file", {"path": "docs/missing.txt", "folder": "archive"}, "NOT_FOUND"),
    ("move_file", {"path": "docs/plan.md", "folder": "music"}, "NOT_FOUND"),
    ("move_file", {"path": "docs/plan.md", "folder": "docs"}, "INVALID_VALUE"),
    ("move_file", {"path": "docs/notes.txt", "folder": "archive"}, "ALREADY_EXISTS"),
    ("delete_file", {"path": "docs/missing.txt"}, "NOT_FOUND"),
    ("add_todo", {"title": "pay rent", "due": "2025-03-09"}, "ALREADY_EXISTS"),
    ("add_todo", {"title": "x", "due": "soon"}, "INVALID_VALUE"),
    ("list_todos", {"status": "pending"}, "INVALID_VALUE"),
    ("complete_todo", {"todo_id": "todo_9"}, "NOT_FOUND"),
    ("complete_todo", {"todo_id": "todo_2"}, "INVALID_STATE"),
    ("set_todo_priority", {"todo_id": "todo_9", "priority": "high"}, "NOT_FOUND"),
    ("set_todo_priority", {"todo_id": "todo_1", "priority": "urgent"}, "INVALID_VALUE"),
    ("delete_todo", {"todo_id": "todo_9"}, "NOT_FOUND"),
]
NO_DOMAIN_ERRORS = {"list_accounts", "view_cart"}  # argument-less reads: only validation errors apply


def fixture_executor(domain: str) -> ToolWorldExecutor:
    return ToolWorldExecutor.from_state({domain: copy.deepcopy(FIXTURES[domain])}, DOMAINS[domain].tool_names)


def run_tool(name: str, arguments: object) -> tuple[ToolWorldExecutor, object]:
    executor = fixture_executor(TOOLS[name].domain)
    return executor, executor.execute(ToolCall(name=name, arguments=arguments))  # type: ignore[arg-type]


def test_world_size_and_schema_shape() -> None:
    assert len(DOMAINS) >= 4 and len(TOOLS) >= 20
    assert sum(len(d.tools) for d in DOMAINS.values()) == len(TOOLS)  # names are unique across domains
    for spec in TOOLS.values():
        schema = spec.openai_schema()
        assert schema["type"] == "function" and set(schema["function"]) == {"name", "description", "parameters"}
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        assert schema["function"]["description"]
        for prop in params["properties"].values():
            assert set(prop) <= SUPPORTED_KEYWORDS and prop["description"]
        assert json.loads(json.dumps(schema)) == schema


def test_schemas_are_valid_json_schema_and_validator_agrees_with_jsonschema() -> None:
    cases = [(name, args) for name, args, _ in SUCCESSES + DOMAIN_ERRORS]
    cases += [(name, {**args, "extra": 1}) for name, args, _ in SUCCESSES]
    cases += [(name, {k: [v] for k, v in args.items()}) for name, args, _ in SUCCESSES]
    for spec in TOOLS.values():
        jsonschema.Draft202012Validator.check_schema(spec.openai_schema()["function"]["parameters"])
    for name, args in cases:
        spec = TOOLS[name]
        reference = jsonschema.Draft202012Validator(spec.openai_schema()["function"]["parameters"]).is_valid(args)
        try:
            spec.validate(args)
            ours = True
        except ToolError:
            ours = False
        assert ours == reference, (name, args)


@pytest.mark.parametrize("name,arguments,expected", SUCCESSES, ids=[c[0] for c in SUCCESSES])
def test_every_tool_success_response(name: str, arguments: dict, expected: dict) -> None:
    _, response = run_tool(name, arguments)
    assert response == expected
    assert len(json.dumps(response)) < 300  # short and regular


@pytest.mark.parametrize("name,arguments,code", DOMAIN_ERRORS, ids=[f"{c[0]}-{c[2]}" for c in DOMAIN_ERRORS])
def test_every_tool_domain_error_is_structured_and_atomic(name: str, arguments: dict, code: str) -> None:
    executor, response = run_tool(name, arguments)
    assert is_error(response) and response["error"]["code"] == code
    assert set(response) == {"error"} and set(response["error"]) == {"code", "message"}
    assert response["error"]["message"]
    assert executor.state()[TOOLS[name].domain] == FIXTURES[TOOLS[name].domain]  # nothing changed


def test_domain_error_table_covers_every_tool() -> None:
    assert {c[0] for c in DOMAIN_ERRORS} | NO_DOMAIN_ERRORS == set(TOOLS)
    assert {c[0] for c in SUCCESSES} | {"place_order"} == set(TOOLS)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_every_tool_validation_errors(name: str) -> None:
    spec = TOOLS[name]
    valid = next(args for n, args, _ in SUCCESSES if n == name) if name != "place_order" else {}
    assert run_tool(name, ["not", "an", "object"])[1]["error"]["code"] == "INVALID_ARGUMENTS"
    assert run_tool(name, {**valid, "bogus": 1})[1]["error"]["code"] == "UNEXPECTED_ARGUMENT"
    for param in spec.params:
        if param.required:
            missing = {k: v for k, v in valid.items() if k != param.name}
            assert run_tool(name, missing)[1]["error"]["code"] == "MISSING_ARGUMENT"
        wrong = {"string": 7, "integer": "7", "boolean": "yes"}[param.type]
        response = run_tool(name, {**valid, param.name: wrong})[1]
        assert response["error"]["code"] == "WRONG_TYPE" and param.name in response["error"]["message"]


def test_booleans_are_not_integers_and_integral_floats_are() -> None:
    args = {"from_account_id": "acc_1", "to_account_id": "acc_2"}
    assert run_tool("transfer", {**args, "amount": True})[1]["error"]["code"] == "WRONG_TYPE"
    assert run_tool("transfer", {**args, "amount": 2.5})[1]["error"]["code"] == "WRONG_TYPE"
    executor, response = run_tool("transfer", {**args, "amount": 10.0})
    assert response["from_balance"] == 490 and isinstance(executor.state()["bank"]["accounts"]["acc_1"]["balance"], int)


def test_unknown_and_not_offered_tools() -> None:
    executor = fixture_executor("bank")
    for name in ("fly_to_moon", "create_event", 42):
        response = executor.execute(ToolCall(name=name, arguments={}))  # type: ignore[arg-type]
        assert response["error"]["code"] == "UNKNOWN_TOOL" and "get_balance" in response["error"]["message"]
    with pytest.raises(ValueError, match="not tool-world tools"):
        ToolWorldExecutor.from_state({}, ["fly_to_moon"])


def test_ids_come_from_counters_and_only_successes_advance_them() -> None:
    executor = fixture_executor("calendar")
    make = lambda time: executor.execute(ToolCall("create_event", {"title": "A", "date": "2025-03-09", "time": time}))
    assert make("10:00")["event_id"] == "evt_3"
    assert make("10:00")["error"]["code"] == "CONFLICT"
    assert make("11:00")["event_id"] == "evt_4"


def test_handler_crash_becomes_internal_error(caplog: pytest.LogCaptureFixture) -> None:
    executor = fixture_executor("bank")

    def boom(state: dict, args: dict) -> dict:
        state["accounts"].clear()
        raise RuntimeError("bug")

    executor._tools["get_balance"] = dataclasses.replace(TOOLS["get_balance"], handler=boom)
    response = executor.execute(ToolCall("get_balance", {"account_id": "acc_1"}))
    assert response["error"]["code"] == "INTERNAL_ERROR" and "crashed" in caplog.text
    assert executor.state()["bank"] == FIXTURES["bank"]


def test_executor_implements_protocol_and_never_aliases_state() -> None:
    task = generate_tasks(n_train=4, n_val=0, n_test=0)["train"][0]
    initial = copy.deepcopy(task.initial_state)
    first, second = ToolWorldExecutor(task), ToolWorldExecutor(task)
    assert isinstance(first, Executor)
    for step in task.gold_calls[0]:
        for call in step:
            first.execute(call)
    assert task.initial_state == initial and second.state() == initial
    snapshot = second.state()
    snapshot[task.domain].clear()
    assert second.state() == initial  # snapshots are copies
    task.initial_state[task.domain]["mutated"] = True  # mutating the task afterwards does not reach executors
    assert "mutated" not in second.state()[task.domain]
    del task.initial_state[task.domain]["mutated"]
    assert len(first.log) == sum(len(s) for s in task.gold_calls[0])
