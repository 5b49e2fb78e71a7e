"""``Trajectory.to_json`` / ``from_json`` keep every field of every record (through real JSON text).

The strategies name every dataclass field of ``Trajectory``, ``Stream``, ``Segment``, ``Turn`` and ``ToolCall``
(a test checks that they still do, so a field added later without a strategy fails here first); a
hand-built trajectory whose every field differs from its default pins the same thing without luck.
"""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.records import (
    Role,
    Segment,
    Stream,
    Termination,
    ToolCall,
    Trajectory,
    TrajectoryStatus,
    Turn,
)

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
JSON_OBJECTS = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def segments(draw) -> Segment:
    token_ids = tuple(draw(st.lists(st.integers(0, 2**31 - 1), max_size=6)))
    logprobs = draw(st.none() | st.lists(FLOATS, min_size=len(token_ids), max_size=len(token_ids)).map(tuple))
    return Segment(
        token_ids=token_ids,
        role=draw(st.none() | st.sampled_from(Role)),
        logprobs=logprobs,
        text=draw(st.text(max_size=12)),
    )


FIELDS = {  # one strategy per dataclass field of each record
    ToolCall: {"name": st.text(max_size=8), "arguments": JSON_OBJECTS, "id": st.none() | st.text(max_size=6)},
    Segment: None,  # built by ``segments`` (log-probs must match the token ids)
    Stream: {"role": st.sampled_from(Role), "segments": st.lists(segments(), max_size=3).map(tuple)},
}
FIELDS[Turn] = {
    "act_text": st.text(max_size=12),
    "tool_calls": st.lists(st.builds(ToolCall, **FIELDS[ToolCall]), max_size=2).map(tuple),
    "responses": st.lists(JSON_VALUES, max_size=3).map(tuple),
    "rehearsed": st.booleans(),
    "user_turn": st.integers(0, 20),
    "stand_ins": st.lists(st.integers(0, 5), max_size=3).map(tuple),
}
FIELDS[Trajectory] = {
    "prompt_id": st.text(max_size=8),
    "sample_index": st.integers(0, 64),
    "streams": st.lists(st.builds(Stream, **FIELDS[Stream]), max_size=2).map(tuple),
    "turns": st.lists(st.builds(Turn, **FIELDS[Turn]), max_size=3).map(tuple),
    "reward": FLOATS,
    "status": st.sampled_from(TrajectoryStatus),
    "termination": st.sampled_from(Termination),
    "info": JSON_OBJECTS,
}


def round_trip(traj: Trajectory) -> Trajectory:
    return Trajectory.from_json(json.loads(json.dumps(traj.to_json())))


def test_strategies_cover_every_field() -> None:
    for cls, strategies in FIELDS.items():
        if strategies is not None:
            assert set(strategies) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
    assert {f.name for f in dataclasses.fields(Segment)} == {"token_ids", "role", "logprobs", "text"}


@settings(max_examples=80, deadline=None)
@given(st.builds(Trajectory, **FIELDS[Trajectory]))
def test_every_field_round_trips(traj: Trajectory) -> None:
    assert round_trip(traj) == traj


def _non_default(instance) -> list[str]:
    """Fields of ``instance`` (and of the records inside it) that still hold their default."""
    left = []
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value == default:
            left.append(f"{type(instance).__name__}.{f.name}")
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item):
                left += _non_default(item)
    return left


def test_a_trajectory_with_no_default_field_round_trips() -> None:
    call = ToolCall(name="get_order", arguments={"order_id": "o1", "fields": ["a", 2]}, id="call_1")
    turn = Turn(
        act_text="<tool_call>…</tool_call>",
        tool_calls=(call, call),
        responses=({"ok": 1}, [1, None]),
        rehearsed=False,
        user_turn=1,
        stand_ins=(1,),
    )
    segment = Segment(token_ids=(5, 6), role=Role.REHEARSE, logprobs=(-0.5, -1.25), text="x")
    traj = Trajectory(
        prompt_id="t1",
        sample_index=3,
        streams=(Stream(Role.REHEARSE, (segment,)),),
        turns=(turn,),
        reward=0.75,
        status=TrajectoryStatus.JUDGE_FAILED,
        termination=Termination.MAX_STEPS,
        info={"example": "0@1", "n": [1, 2]},
    )
    assert _non_default(traj) == []
    back = round_trip(traj)
    assert back.turns[0].stand_ins == (1,)
    assert back == traj


def test_records_without_stand_ins_read_the_default() -> None:
    data = Trajectory(prompt_id="t", sample_index=0, turns=(Turn(act_text="a"),)).to_json()
    del data["turns"][0]["stand_ins"]
    assert Trajectory.from_json(data).turns[0].stand_ins == ()
