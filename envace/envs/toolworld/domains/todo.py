"""To-do domain (held out of training by default): to-do items with due dates and priorities.

State: ``{"todos": {todo_id: {"title", "due", "priority", "done"}}, "next_ids": {"todo": n}}``.
"""

from __future__ import annotations

import random
from typing import Any

from envace.envs.toolworld.schema import (
    ALREADY_EXISTS,
    DATE_PATTERN,
    INVALID_STATE,
    NOT_FOUND,
    Param,
    ToolError,
    ToolSpec,
)
from envace.envs.toolworld.state import allocate_id, sorted_ids

NAME = "todo"
DESCRIPTION = "a to-do list: add, list, complete, prioritise and delete to-do items"
TITLES = (
    "pay rent",
    "call mom",
    "renew insurance",
    "book dentist",
    "fix the bike",
    "file taxes",
    "buy a gift",
    "clean the garage",
    "update resume",
    "return library books",
)
DUE_DATES = tuple(f"2025-03-{day:02d}" for day in range(3, 21))
PRIORITIES = ("low", "normal", "high")
STATUSES = ("open", "done", "all")


def todo(state: dict[str, Any], todo_id: str) -> dict[str, Any]:
    found = state["todos"].get(todo_id)
    if found is None:
        raise ToolError(NOT_FOUND, f"no to-do with id '{todo_id}'")
    return found


def listed_todos(state: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """To-dos filtered by status, ordered by id, as ``list_todos`` reports them."""
    todos = state["todos"]
    keep = {"open": lambda t: not t["done"], "done": lambda t: t["done"], "all": lambda t: True}[status]
    return [
        {"todo_id": k, "title": todos[k]["title"], "due": todos[k]["due"]} for k in sorted_ids(todos) if keep(todos[k])
    ]


def _add_todo(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    for key in sorted_ids(state["todos"]):
        existing = state["todos"][key]
        if existing["title"] == args["title"] and not existing["done"]:
            raise ToolError(ALREADY_EXISTS, f"open to-do '{args['title']}' already exists as {key}")
    todo_id = allocate_id(state, "todo")
    state["todos"][todo_id] = {"title": args["title"], "due": args["due"], "priority": "normal", "done": False}
    return {"todo_id": todo_id, "title": args["title"], "due": args["due"]}


def _list_todos(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    return {"status": args["status"], "todos": listed_todos(state, args["status"])}


def _complete_todo(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    found = todo(state, args["todo_id"])
    if found["done"]:
        raise ToolError(INVALID_STATE, f"{args['todo_id']} is already done")
    found["done"] = True
    return {"todo_id": args["todo_id"], "done": True}


def _set_todo_priority(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    todo(state, args["todo_id"])["priority"] = args["priority"]
    return {"todo_id": args["todo_id"], "priority": args["priority"]}


def _delete_todo(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    todo(state, args["todo_id"])
    del state["todos"][args["todo_id"]]
    return {"todo_id": args["todo_id"], "deleted": True}


_TODO_ID = Param("todo_id", "string", "To-do id, e.g. todo_2.")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "add_todo",
        NAME,
        "Add a to-do item.",
        (
            Param("title", "string", "What to do.", min_length=1),
            Param("due", "string", "Due date as YYYY-MM-DD.", pattern=DATE_PATTERN, hint="YYYY-MM-DD"),
        ),
        _add_todo,
    ),
    ToolSpec(
        "list_todos",
        NAME,
        "List to-do items by status.",
        (Param("status", "string", "Which items to list.", required=False, enum=STATUSES, default="open"),),
        _list_todos,
    ),
    ToolSpec("complete_todo", NAME, "Mark a to-do item as done.", (_TODO_ID,), _complete_todo),
    ToolSpec(
        "set_todo_priority",
        NAME,
        "Set a to-do item's priority.",
        (_TODO_ID, Param("priority", "string", "New priority.", enum=PRIORITIES)),
        _set_todo_priority,
    ),
    ToolSpec("delete_todo", NAME, "Delete a to-do item.", (_TODO_ID,), _delete_todo),
)


def seed_state(rng: random.Random) -> dict[str, Any]:
    """Four to-dos with distinct titles; one of them is already done."""
    titles = rng.sample(TITLES, 4)
    done_index = rng.randrange(4)
    todos = {
        f"todo_{i + 1}": {
            "title": t,
            "due": rng.choice(DUE_DATES),
            "priority": rng.choice(PRIORITIES),
            "done": i == done_index,
        }
        for i, t in enumerate(titles)
    }
    return {"todos": todos, "next_ids": {"todo": len(todos) + 1}}
