"""Calendar domain: events on ISO dates with times and attendee e-mails.

State: ``{"events": {evt_id: {"title", "date", "time", "attendees": [email, ...]}}, "next_ids":
{"evt": n}}``. Two events may not share a date and time (CONFLICT).
"""

from __future__ import annotations

import datetime
import random
from typing import Any

from envace.envs.toolworld.schema import (
    ALREADY_EXISTS,
    CONFLICT,
    DATE_PATTERN,
    INVALID_VALUE,
    NOT_FOUND,
    TIME_PATTERN,
    Param,
    ToolError,
    ToolSpec,
)
from envace.envs.toolworld.state import allocate_id, sorted_ids

NAME = "calendar"
DESCRIPTION = "a personal calendar: create, list, reschedule and cancel events, invite attendees"
TITLES = (
    "Standup",
    "Design review",
    "Dentist",
    "Budget sync",
    "Team retro",
    "Client call",
    "Yoga",
    "Lunch with Ana",
    "Planning",
    "Interview",
)
EMAILS = (
    "ana@example.com",
    "ben@example.com",
    "chen@example.com",
    "dara@example.com",
    "eli@example.com",
    "fay@example.com",
)
DATES = tuple(f"2025-03-{day:02d}" for day in range(3, 15))
TIMES = ("09:00", "10:00", "11:30", "13:00", "14:00", "15:30", "16:00")


def event(state: dict[str, Any], event_id: str) -> dict[str, Any]:
    found = state["events"].get(event_id)
    if found is None:
        raise ToolError(NOT_FOUND, f"no event with id '{event_id}'")
    return found


def day_events(state: dict[str, Any], date: str) -> list[dict[str, Any]]:
    """Events of one date ordered by time, as ``list_events`` reports them."""
    events = state["events"]
    rows = [
        {"event_id": k, "title": events[k]["title"], "time": events[k]["time"]}
        for k in sorted_ids(events)
        if events[k]["date"] == date
    ]
    return sorted(rows, key=lambda r: r["time"])


def slot_owner(state: dict[str, Any], date: str, time: str, ignore: str | None = None) -> str | None:
    """The id of the event occupying ``date time`` (other than ``ignore``), or None."""
    for event_id in sorted_ids(state["events"]):
        found = state["events"][event_id]
        if event_id != ignore and found["date"] == date and found["time"] == time:
            return event_id
    return None


def _check_slot(state: dict[str, Any], date: str, time: str, ignore: str | None = None) -> None:
    try:
        datetime.datetime.strptime(f"{date} {time}", "%Y-%m-%d %H:%M")
    except ValueError:
        raise ToolError(INVALID_VALUE, f"'{date} {time}' is not a valid date and time") from None
    owner = slot_owner(state, date, time, ignore)
    if owner is not None:
        raise ToolError(CONFLICT, f"{owner} is already booked on {date} at {time}")


def _create_event(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    _check_slot(state, args["date"], args["time"])
    event_id = allocate_id(state, "evt")
    state["events"][event_id] = {"title": args["title"], "date": args["date"], "time": args["time"], "attendees": []}
    return {"event_id": event_id, "title": args["title"], "date": args["date"], "time": args["time"]}


def _list_events(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    return {"date": args["date"], "events": day_events(state, args["date"])}


def _add_attendee(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    found = event(state, args["event_id"])
    if args["email"] in found["attendees"]:
        raise ToolError(ALREADY_EXISTS, f"{args['email']} already attends {args['event_id']}")
    found["attendees"].append(args["email"])
    return {"event_id": args["event_id"], "email": args["email"], "attendee_count": len(found["attendees"])}


def _reschedule_event(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    found = event(state, args["event_id"])
    _check_slot(state, args["date"], args["time"], ignore=args["event_id"])
    found["date"], found["time"] = args["date"], args["time"]
    return {"event_id": args["event_id"], "date": args["date"], "time": args["time"]}


def _cancel_event(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    event(state, args["event_id"])
    del state["events"][args["event_id"]]
    return {"event_id": args["event_id"], "status": "cancelled"}


_EVENT_ID = Param("event_id", "string", "Event id, e.g. evt_2.")
_DATE = Param("date", "string", "Date as YYYY-MM-DD.", pattern=DATE_PATTERN, hint="YYYY-MM-DD")
_TIME = Param("time", "string", "Start time as HH:MM (24h).", pattern=TIME_PATTERN, hint="HH:MM")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "create_event",
        NAME,
        "Create a calendar event.",
        (Param("title", "string", "Event title.", min_length=1), _DATE, _TIME),
        _create_event,
    ),
    ToolSpec("list_events", NAME, "List the events of one day, ordered by time.", (_DATE,), _list_events),
    ToolSpec(
        "add_attendee",
        NAME,
        "Invite someone to an event by e-mail.",
        (
            _EVENT_ID,
            Param("email", "string", "Attendee e-mail.", pattern=r"^[^@\s]+@[^@\s]+\.[a-z]+$", hint="name@domain.tld"),
        ),
        _add_attendee,
    ),
    ToolSpec(
        "reschedule_event", NAME, "Move an event to a new date and time.", (_EVENT_ID, _DATE, _TIME), _reschedule_event
    ),
    ToolSpec("cancel_event", NAME, "Cancel (delete) an event.", (_EVENT_ID,), _cancel_event),
)


def seed_state(rng: random.Random) -> dict[str, Any]:
    """Four events with distinct titles on a few dates, at distinct slots; some have attendees."""
    titles = rng.sample(TITLES, 4)
    dates = rng.sample(DATES[:6], 3)
    slots: set[tuple[str, str]] = set()
    events = {}
    for number, title in enumerate(titles, start=1):
        slot = (rng.choice(dates), rng.choice(TIMES))
        while slot in slots:
            slot = (rng.choice(dates), rng.choice(TIMES))
        slots.add(slot)
        attendees = sorted(rng.sample(EMAILS, rng.randint(0, 2)))
        events[f"evt_{number}"] = {"title": title, "date": slot[0], "time": slot[1], "attendees": attendees}
    return {"events": events, "next_ids": {"evt": len(events) + 1}}
