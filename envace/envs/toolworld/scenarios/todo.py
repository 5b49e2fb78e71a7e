"""To-do scenarios: add (alone, or add_todo → set_todo_priority on the new id), list open items,
complete by id or by title (list_todos → complete_todo), re-prioritise, delete, and follow-ups on
"it" (prioritise it, mark it done)."""

from __future__ import annotations

from envace.core.json_paths import Match
from envace.envs.toolworld.domains.todo import (
    DUE_DATES,
    PRIORITIES,
    TITLES,
    listed_todos,
)
from envace.envs.toolworld.planning import (
    PlannedTurn,
    Ref,
    Scenario,
    ScenarioInput,
)
from envace.envs.toolworld.scenarios.common import (
    call,
    enumerate_fields,
    one_step,
    phrase,
)
from envace.envs.toolworld.state import sorted_ids


def _open_ids(inp: ScenarioInput) -> list[str]:
    return [t for t in sorted_ids(inp.state["todos"]) if not inp.state["todos"][t]["done"]]


def _new_title(inp: ScenarioInput) -> str:
    used = {t["title"] for t in inp.state["todos"].values()}
    return inp.rng.choice([t for t in TITLES if t not in used])


def _add(inp: ScenarioInput) -> PlannedTurn:
    title, due = _new_title(inp), inp.rng.choice(DUE_DATES)
    k = inp.key("add")
    user = phrase(
        inp,
        (
            "Add '{title}' to my to-do list, due {due}.",
            "Remind me to {title} by {due}.",
            "New to-do: {title}, due {due}.",
        ),
        title=title,
        due=due,
    )
    tid = Ref(k, ("todo_id",))
    return PlannedTurn(
        user,
        one_step(call(k, "add_todo", title=title, due=due)),
        "Added '{title}' as {todo_id}, due {due}.",
        {"title": title, "due": due, "todo_id": tid},
        ("todo_id",),
        {"todo": {"id": tid}},
    )


def _add_with_priority(inp: ScenarioInput) -> PlannedTurn:
    title, due, priority = _new_title(inp), inp.rng.choice(DUE_DATES), inp.rng.choice(("low", "high"))
    ka, kp = inp.key("add"), inp.key("priority")
    user = phrase(
        inp,
        (
            "Add a {priority} priority to-do '{title}' due {due}.",
            "Remind me to {title} by {due}, and make it {priority} priority.",
        ),
        title=title,
        due=due,
        priority=priority,
    )
    tid = Ref(ka, ("todo_id",))
    steps = (
        (call(ka, "add_todo", title=title, due=due),),
        (call(kp, "set_todo_priority", todo_id=tid, priority=priority),),
    )
    return PlannedTurn(
        user,
        steps,
        "Added '{title}' as {todo_id}, due {due}, with {priority} priority.",
        {"title": title, "due": due, "todo_id": tid, "priority": priority},
        ("todo_id",),
        {"todo": {"id": tid}},
    )


def _list_open(inp: ScenarioInput) -> PlannedTurn:
    k = inp.key("list")
    user = phrase(inp, ("What's still on my to-do list?", "Show me my open to-dos.", "What do I still have to do?"))
    rows = listed_todos(dict(inp.state), "open")
    if not rows:
        return PlannedTurn(
            user,
            one_step(call(k, "list_todos", status="open")),
            "You have no open to-dos.",
            {"none": "no open"},
            ("none",),
        )
    listing = "; ".join(f"{r['title']} (due {r['due']})" for r in rows)
    fields = {"listing": listing, **enumerate_fields("title", [r["title"] for r in rows])}
    return PlannedTurn(
        user,
        one_step(call(k, "list_todos", status="open")),
        "Open to-dos: {listing}.",
        fields,
        tuple(f"title_{i}" for i in range(len(rows))),
    )


def _complete(inp: ScenarioInput) -> PlannedTurn | None:
    options = _open_ids(inp)
    if not options:
        return None
    tid = inp.rng.choice(options)
    user = phrase(inp, ("Mark {tid} as done.", "I finished {tid}, please check it off."), tid=tid)
    return PlannedTurn(
        user,
        one_step(call(inp.key("done"), "complete_todo", todo_id=tid)),
        "Marked {tid} as done.",
        {"tid": tid},
        ("tid",),
    )


def _complete_by_title(inp: ScenarioInput) -> PlannedTurn | None:
    options = _open_ids(inp)
    if not options:
        return None
    title = inp.state["todos"][inp.rng.choice(options)]["title"]
    kl, kd = inp.key("list"), inp.key("done")
    user = phrase(inp, ("I did '{title}', please mark it done.", "Check off '{title}' on my to-do list."), title=title)
    tid = Ref(kl, ("todos", Match.of(title=title), "todo_id"))
    steps = ((call(kl, "list_todos", status="open"),), (call(kd, "complete_todo", todo_id=tid),))
    return PlannedTurn(
        user, steps, "Marked '{title}' ({todo_id}) as done.", {"title": title, "todo_id": tid}, ("todo_id",)
    )


def _prioritise(inp: ScenarioInput) -> PlannedTurn:
    tid = inp.rng.choice(sorted_ids(inp.state["todos"]))
    priority = inp.rng.choice(PRIORITIES)
    user = phrase(
        inp, ("Set the priority of {tid} to {priority}.", "Make {tid} {priority} priority."), tid=tid, priority=priority
    )
    planned = call(inp.key("priority"), "set_todo_priority", todo_id=tid, priority=priority)
    return PlannedTurn(
        user,
        one_step(planned),
        "{tid} now has {priority} priority.",
        {"tid": tid, "priority": priority},
        ("priority",),
        {"todo": {"id": tid}},
    )


def _delete(inp: ScenarioInput) -> PlannedTurn:
    tid = inp.rng.choice(sorted_ids(inp.state["todos"]))
    user = phrase(inp, ("Delete {tid} from my list.", "Remove to-do {tid}."), tid=tid)
    return PlannedTurn(
        user, one_step(call(inp.key("delete"), "delete_todo", todo_id=tid)), "Deleted {tid}.", {"tid": tid}, ("tid",)
    )


def _prioritise_follow_up(inp: ScenarioInput) -> PlannedTurn:
    tid = inp.context["todo"]["id"]
    user = phrase(inp, ("Make it high priority.", "Please bump it to high priority."))
    planned = call(inp.key("priority"), "set_todo_priority", todo_id=tid, priority="high")
    return PlannedTurn(
        user,
        one_step(planned),
        "{todo_id} now has high priority.",
        {"todo_id": tid},
        ("todo_id",),
        {"todo": {"id": tid}},
    )


def _done_follow_up(inp: ScenarioInput) -> PlannedTurn | None:
    tid = inp.context["todo"]["id"]
    if inp.state["todos"][inp.value(tid)]["done"]:
        return None
    user = phrase(inp, ("Actually I just did it, mark it as done.", "Done already! Please check it off."))
    return PlannedTurn(
        user,
        one_step(call(inp.key("done"), "complete_todo", todo_id=tid)),
        "Marked {todo_id} as done.",
        {"todo_id": tid},
        ("todo_id",),
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("add_todo", ("add_todo",), _add, provides=("todo",)),
    Scenario("add_with_priority", ("add_todo", "set_todo_priority"), _add_with_priority, provides=("todo",)),
    Scenario("list_open", ("list_todos",), _list_open),
    Scenario("complete", ("complete_todo",), _complete),
    Scenario("complete_by_title", ("list_todos", "complete_todo"), _complete_by_title),
    Scenario("prioritise", ("set_todo_priority",), _prioritise, provides=("todo",)),
    Scenario("delete", ("delete_todo",), _delete),
    Scenario("prioritise_it", ("set_todo_priority",), _prioritise_follow_up, requires="todo", provides=("todo",)),
    Scenario("done_it", ("complete_todo",), _done_follow_up, requires="todo"),
)
