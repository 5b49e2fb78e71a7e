"""Calendar scenarios: create (alone, or create_event → add_attendee on the new id), a day's agenda,
reschedule, cancel by title (list_events → cancel_event), two parallel invitations, a slot-conflict
error path, and follow-ups on "it" (invite, move, cancel)."""

from __future__ import annotations

from typing import Any

from envace.core.json_paths import Match
from envace.envs.toolworld.domains.calendar import (
    DATES,
    EMAILS,
    TIMES,
    TITLES,
    day_events,
    slot_owner,
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
from envace.envs.toolworld.schema import CONFLICT
from envace.envs.toolworld.state import sorted_ids


def _free_slot(inp: ScenarioInput, date: str | None = None) -> tuple[str, str]:
    state = dict(inp.state)
    while True:
        slot = (date or inp.rng.choice(DATES), inp.rng.choice(TIMES))
        if slot_owner(state, *slot) is None:
            return slot


def _new_title(inp: ScenarioInput) -> str:
    used = {e["title"] for e in inp.state["events"].values()}
    return inp.rng.choice([t for t in TITLES if t not in used])


def _existing(inp: ScenarioInput) -> tuple[str, dict[str, Any]]:
    event_id = inp.rng.choice(sorted_ids(inp.state["events"]))
    return event_id, inp.state["events"][event_id]


def _new_emails(inp: ScenarioInput, event_id: str, count: int) -> list[str]:
    taken = inp.state["events"][event_id]["attendees"]
    return sorted(inp.rng.sample([e for e in EMAILS if e not in taken], count))


def _create(inp: ScenarioInput) -> PlannedTurn:
    title, (date, time) = _new_title(inp), _free_slot(inp)
    k = inp.key("create")
    user = phrase(
        inp,
        (
            "Schedule '{title}' on {date} at {time}.",
            "Please add {title} to my calendar for {date} at {time}.",
            "Book '{title}' on {date} at {time}.",
        ),
        title=title,
        date=date,
        time=time,
    )
    eid = Ref(k, ("event_id",))
    return PlannedTurn(
        user,
        one_step(call(k, "create_event", title=title, date=date, time=time)),
        "Booked '{title}' on {date} at {time} as {event_id}.",
        {"title": title, "date": date, "time": time, "event_id": eid},
        ("event_id",),
        {"event": {"id": eid, "date": date}},
    )


def _create_and_invite(inp: ScenarioInput) -> PlannedTurn:
    title, (date, time) = _new_title(inp), _free_slot(inp)
    email = inp.rng.choice(EMAILS)
    kc, ka = inp.key("create"), inp.key("invite")
    user = phrase(
        inp,
        (
            "Set up '{title}' on {date} at {time} and invite {email}.",
            "Create an event '{title}' for {date} at {time}, then add {email} to it.",
        ),
        title=title,
        date=date,
        time=time,
        email=email,
    )
    eid = Ref(kc, ("event_id",))
    steps = (
        (call(kc, "create_event", title=title, date=date, time=time),),
        (call(ka, "add_attendee", event_id=eid, email=email),),
    )
    return PlannedTurn(
        user,
        steps,
        "Booked '{title}' on {date} at {time} as {event_id} and invited {email}.",
        {"title": title, "date": date, "time": time, "event_id": eid, "email": email},
        ("event_id",),
        {"event": {"id": eid, "date": date}},
    )


def _agenda(inp: ScenarioInput) -> PlannedTurn:
    busy = sorted({e["date"] for e in inp.state["events"].values()})
    date = inp.rng.choice(busy) if busy and inp.rng.random() < 0.75 else inp.rng.choice(DATES)
    k = inp.key("agenda")
    user = phrase(
        inp,
        ("What's on my calendar on {date}?", "Do I have anything scheduled for {date}?", "List my events on {date}."),
        date=date,
    )
    rows = day_events(dict(inp.state), date)
    if not rows:
        return PlannedTurn(
            user,
            one_step(call(k, "list_events", date=date)),
            "You have nothing scheduled on {date}.",
            {"date": date},
            ("date",),
        )
    listing = "; ".join(f"{r['time']} {r['title']}" for r in rows)
    fields = {"date": date, "listing": listing, **enumerate_fields("title", [r["title"] for r in rows])}
    return PlannedTurn(
        user,
        one_step(call(k, "list_events", date=date)),
        "On {date} you have: {listing}.",
        fields,
        tuple(f"title_{i}" for i in range(len(rows))),
    )


def _reschedule(inp: ScenarioInput) -> PlannedTurn:
    event_id, found = _existing(inp)
    date, time = _free_slot(inp)
    user = phrase(
        inp,
        ("Move {evt} to {date} at {time}.", "Please reschedule {evt} ({title}) to {date} {time}."),
        evt=event_id,
        title=found["title"],
        date=date,
        time=time,
    )
    planned = call(inp.key("move"), "reschedule_event", event_id=event_id, date=date, time=time)
    return PlannedTurn(
        user,
        one_step(planned),
        "{evt} is now on {date} at {time}.",
        {"evt": event_id, "date": date, "time": time},
        ("date", "time"),
        {"event": {"id": event_id, "date": date}},
    )


def _cancel_by_title(inp: ScenarioInput) -> PlannedTurn:
    _, found = _existing(inp)
    kl, kc = inp.key("agenda"), inp.key("cancel")
    user = phrase(
        inp,
        ("Cancel my '{title}' on {date}.", "Please remove {title} from my calendar on {date}."),
        title=found["title"],
        date=found["date"],
    )
    eid = Ref(kl, ("events", Match.of(title=found["title"]), "event_id"))
    steps = ((call(kl, "list_events", date=found["date"]),), (call(kc, "cancel_event", event_id=eid),))
    return PlannedTurn(
        user, steps, "Cancelled '{title}' ({event_id}).", {"title": found["title"], "event_id": eid}, ("event_id",)
    )


def _invite_two(inp: ScenarioInput) -> PlannedTurn:
    event_id, _ = _existing(inp)
    first, second = _new_emails(inp, event_id, 2)
    ka, kb = inp.key("invite_a"), inp.key("invite_b")
    user = phrase(
        inp,
        ("Invite {a} and {b} to {evt}.", "Please add {a} and {b} as attendees of {evt}."),
        a=first,
        b=second,
        evt=event_id,
    )
    steps = (
        (
            call(ka, "add_attendee", event_id=event_id, email=first),
            call(kb, "add_attendee", event_id=event_id, email=second),
        ),
    )
    fields = {"a": first, "b": second, "evt": event_id, "count": Ref(kb, ("attendee_count",))}
    return PlannedTurn(
        user,
        steps,
        "Invited {a} and {b} to {evt}; it now has {count} attendees.",
        fields,
        ("count",),
        {"event": {"id": event_id, "date": inp.state["events"][event_id]["date"]}},
    )


def _create_conflict(inp: ScenarioInput) -> PlannedTurn:
    event_id, found = _existing(inp)
    title = _new_title(inp)
    user = phrase(
        inp,
        ("Schedule '{title}' on {date} at {time}.", "Book '{title}' on {date} at {time}."),
        title=title,
        date=found["date"],
        time=found["time"],
    )
    planned = call(inp.key("create"), "create_event", CONFLICT, title=title, date=found["date"], time=found["time"])
    return PlannedTurn(
        user,
        one_step(planned),
        "That slot is taken: {other} is already booked on {date} at {time}.",
        {"other": event_id, "date": found["date"], "time": found["time"]},
        ("other",),
    )


def _invite_follow_up(inp: ScenarioInput) -> PlannedTurn:
    eid = inp.context["event"]["id"]
    (email,) = _new_emails(inp, inp.value(eid), 1)
    k = inp.key("invite")
    user = phrase(inp, ("Please also invite {email} to it.", "Add {email} to that event too."), email=email)
    return PlannedTurn(
        user,
        one_step(call(k, "add_attendee", event_id=eid, email=email)),
        "Invited {email}; {event_id} now has {count} attendees.",
        {"email": email, "event_id": eid, "count": Ref(k, ("attendee_count",))},
        ("event_id", "count"),
        {"event": dict(inp.context["event"])},
    )


def _move_follow_up(inp: ScenarioInput) -> PlannedTurn:
    eid, date = inp.context["event"]["id"], inp.context["event"]["date"]
    _, time = _free_slot(inp, date)
    user = phrase(inp, ("Actually, can you move it to {time}?", "Please push it to {time} the same day."), time=time)
    planned = call(inp.key("move"), "reschedule_event", event_id=eid, date=date, time=time)
    return PlannedTurn(
        user,
        one_step(planned),
        "{event_id} is now on {date} at {time}.",
        {"event_id": eid, "date": date, "time": time},
        ("time",),
        {"event": {"id": eid, "date": date}},
    )


def _cancel_follow_up(inp: ScenarioInput) -> PlannedTurn:
    eid = inp.context["event"]["id"]
    user = phrase(inp, ("Never mind, please cancel it.", "Actually, cancel that event."))
    return PlannedTurn(
        user,
        one_step(call(inp.key("cancel"), "cancel_event", event_id=eid)),
        "Cancelled {event_id}.",
        {"event_id": eid},
        ("event_id",),
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("create_event", ("create_event",), _create, provides=("event",)),
    Scenario("create_and_invite", ("create_event", "add_attendee"), _create_and_invite, provides=("event",)),
    Scenario("agenda", ("list_events",), _agenda),
    Scenario("reschedule", ("reschedule_event",), _reschedule, provides=("event",)),
    Scenario("cancel_by_title", ("list_events", "cancel_event"), _cancel_by_title),
    Scenario("invite_two", ("add_attendee",), _invite_two, provides=("event",)),
    Scenario("create_conflict", ("create_event",), _create_conflict),
    Scenario("invite_to_it", ("add_attendee",), _invite_follow_up, requires="event", provides=("event",)),
    Scenario("move_it", ("reschedule_event",), _move_follow_up, requires="event", provides=("event",)),
    Scenario("cancel_it", ("cancel_event",), _cancel_follow_up, requires="event"),
)
