"""Typed records shared by every layer: roles, tool calls, generated segments and trajectories.

All records are frozen dataclasses and round-trip through plain JSON (``to_json`` / ``from_json``):
every field of ``Trajectory`` and of the records it holds (``Stream``, ``Segment``, ``Turn``, ``ToolCall``)
comes back equal, provided the free-form values (tool arguments and responses, ``info``) are JSON values
(a tuple comes back as a list). Files are stamped with ``SCHEMA_VERSION`` so files written by an older
envace fail loudly instead of silently; optional fields missing from a record (``Turn.stand_ins`` in
files written before it was kept) read as their defaults.
Token-level fields (token ids, per-token role ids, response mask, sampling log-probs) live on
``Segment``: one contiguous piece of a token stream, either prompt/scaffold/observation text (mask 0)
or one generation ("output") of one role (mask 1).

A trajectory holds one append-only ``Stream`` per role that generated in it. The ACT stream is the
agent's context (system + tools + user turns + its calls + the responses it received, rehearsed or
real, as observation tokens). The REHEARSE stream is the environment-simulator's context (REHEARSE
role prompt + tool schemas + the calls it answered and its own answers). Each generated segment is
one output y in the sense of docs/method.md §7; its prompt is exactly the stream prefix before it, so a
trainer can score every output of a stream with one forward pass, and a rollout can keep one KV
cache per stream (append-only, never re-encoded).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


class Role(enum.IntEnum):
    """The two seats one policy plays. Integer values are the per-token role ids fed to trainers."""

    ACT = 0
    REHEARSE = 1


# role id used for tokens that no role generated (prompt, chat scaffold, real tool responses)
NO_ROLE = -1


class TrajectoryStatus(str, enum.Enum):
    OK = "ok"  # reward is valid and the trajectory enters the loss
    JUDGE_FAILED = "judge_failed"  # reward could not be computed: excluded from the loss, counted
    ERROR = "error"  # the rollout itself crashed


class Termination(str, enum.Enum):
    FINAL_REPLY = "final_reply"  # ACT answered the user without a tool call in the last turn
    MAX_STEPS = "max_steps"  # step budget of a turn was used up
    MAX_TOKENS = "max_tokens"  # context/response budget was used up
    ACT_PARSE_ERROR = "act_parse_error"
    REHEARSE_PARSE_ERROR = "rehearse_parse_error"
    REQUIRED_ITEM_FAILED = "required_item_failed"  # CM2 required_for_next_turn unmet
    ERROR = "error"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """OpenAI chat ``tool_calls`` entry (arguments as a JSON string)."""
        return {
            "id": self.id or f"call_{self.name}",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, sort_keys=True)},
        }


@dataclass(frozen=True)
class Segment:
    """A contiguous run of tokens. ``role`` is None for scaffold/prompt/observation tokens."""

    token_ids: tuple[int, ...]
    role: Role | None = None
    logprobs: tuple[float, ...] | None = None  # sampling log-probs of generated tokens
    text: str = ""

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"Segment: {len(self.logprobs)} log-probs for {len(self.token_ids)} tokens; they must match"
            )

    @property
    def trainable(self) -> bool:
        return self.role is not None

    @property
    def response_mask(self) -> tuple[int, ...]:
        return (1 if self.trainable else 0,) * len(self.token_ids)

    @property
    def role_ids(self) -> tuple[int, ...]:
        rid = int(self.role) if self.role is not None else NO_ROLE
        return (rid,) * len(self.token_ids)


@dataclass(frozen=True)
class Stream:
    """One role's append-only token stream within a trajectory."""

    role: Role
    segments: tuple[Segment, ...] = ()

    def flat(self) -> dict[str, list]:
        """Concatenated token ids, role ids, response mask and log-probs (0.0 where not generated)."""
        ids: list[int] = []
        roles: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        for seg in self.segments:
            ids.extend(seg.token_ids)
            roles.extend(seg.role_ids)
            mask.extend(seg.response_mask)
            lps.extend(seg.logprobs if seg.logprobs is not None else (0.0,) * len(seg.token_ids))
        return {"input_ids": ids, "role_ids": roles, "response_mask": mask, "logprobs": lps}

    def outputs(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.trainable)


@dataclass(frozen=True)
class Turn:
    """One ACT step and what followed it: the calls, and the responses (rehearsed or real)."""

    act_text: str
    tool_calls: tuple[ToolCall, ...] = ()
    responses: tuple[Any, ...] = ()  # one JSON value per tool call
    rehearsed: bool = True  # False when responses came from a real executor / frozen simulator
    user_turn: int = 0
    # indices into ``responses`` that a non-rehearsed responder made up in place of the real executor's
    # (e.g. FinMCP replay's NOT_RECORDED errors and simulated answers): not real, even when ``rehearsed`` is False
    stand_ins: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trajectory:
    prompt_id: str
    sample_index: int
    streams: tuple[Stream, ...] = ()
    turns: tuple[Turn, ...] = ()
    reward: float = 0.0
    status: TrajectoryStatus = TrajectoryStatus.OK
    termination: Termination = Termination.FINAL_REPLY
    info: dict[str, Any] = field(default_factory=dict)

    def stream(self, role: Role) -> Stream | None:
        for st in self.streams:
            if st.role is role:
                return st
        return None

    def outputs(self) -> list[tuple[Role, Segment]]:
        """Every generated output (one ACT or one REHEARSE generation), in stream order."""
        return [(seg.role, seg) for st in self.streams for seg in st.segments if seg.role is not None]

    def role_token_counts(self) -> dict[Role, int]:
        counts = {r: 0 for r in Role}
        for role, seg in self.outputs():
            counts[role] += len(seg.token_ids)
        return counts

    # ---- JSON round-trip -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        d["status"] = self.status.value
        d["termination"] = self.termination.value
        d["streams"] = [
            {
                "role": st.role.name,
                "segments": [{**asdict(s), "role": None if s.role is None else s.role.name} for s in st.segments],
            }
            for st in self.streams
        ]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Trajectory:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"Trajectory record has schema_version={version!r}; this envace reads {SCHEMA_VERSION}. "
                "Regenerate the file with this version of envace."
            )
        streams = tuple(
            Stream(
                role=Role[st["role"]],
                segments=tuple(
                    Segment(
                        token_ids=tuple(s["token_ids"]),
                        role=None if s["role"] is None else Role[s["role"]],
                        logprobs=None if s.get("logprobs") is None else tuple(s["logprobs"]),
                        text=s.get("text", ""),
                    )
                    for s in st["segments"]
                ),
            )
            for st in d.get("streams", [])
        )
        turns = tuple(
            Turn(
                act_text=t["act_text"],
                tool_calls=tuple(ToolCall(**c) for c in t.get("tool_calls", [])),
                responses=tuple(t.get("responses", [])),
                rehearsed=bool(t.get("rehearsed", True)),
                user_turn=int(t.get("user_turn", 0)),
                stand_ins=tuple(int(i) for i in t.get("stand_ins", ())),
            )
            for t in d.get("turns", [])
        )
        return cls(
            prompt_id=d["prompt_id"],
            sample_index=d["sample_index"],
            streams=streams,
            turns=turns,
            reward=float(d.get("reward", 0.0)),
            status=TrajectoryStatus(d.get("status", "ok")),
            termination=Termination(d.get("termination", "final_reply")),
            info=dict(d.get("info", {})),
        )


# a rollout's check at the end of a user turn: (episode spec, turns so far, finished user turn) -> False: a
# required checklist item failed, stop; True / None: go on (envace.judges.reward.required_items_gate)
TurnGate = Callable[[Any, Sequence["Turn"], int], "bool | None"]


def outputs_through_turn(turns: tuple[Turn, ...] | list[Turn], turn: int) -> dict[Role, int]:
    """How many outputs of each role belong to user turns <= ``turn``: one ACT output per ``Turn``, one
    REHEARSE output per call (the order both engines generate them in)."""
    kept = [t for t in turns if t.user_turn <= turn]
    return {Role.ACT: len(kept), Role.REHEARSE: sum(len(t.tool_calls) for t in kept)}


def truncate_after_turn(trajectory: Trajectory, turn: int) -> Trajectory:
    """The trajectory as if it had ended after user turn ``turn`` (a required checklist item failed there).

    Turns of later user turns are dropped, and so is every generated output that belongs to them: each
    kept ``Turn`` is one ACT output and each of its calls one REHEARSE output, in stream order, so a
    role's stream is cut right before its first output past those (the scaffold before it stays as
    context without a loss). A role whose outputs are not trainable (no role segments) keeps its stream.
    The termination becomes ``REQUIRED_ITEM_FAILED``; ``info["truncated_after_turn"]`` records ``turn``.
    """
    kept = tuple(t for t in trajectory.turns if t.user_turn <= turn)
    budget = outputs_through_turn(trajectory.turns, turn)
    streams = []
    for stream in trajectory.streams:
        generated = [i for i, seg in enumerate(stream.segments) if seg.role is stream.role]
        cut = generated[budget[stream.role]] if len(generated) > budget[stream.role] else len(stream.segments)
        streams.append(Stream(stream.role, stream.segments[:cut]))
    return Trajectory(
        prompt_id=trajectory.prompt_id,
        sample_index=trajectory.sample_index,
        streams=tuple(streams),
        turns=kept,
        reward=trajectory.reward,
        status=trajectory.status,
        termination=Termination.REQUIRED_ITEM_FAILED,
        info={**trajectory.info, "truncated_after_turn": turn},
    )


# ---- what an engine consumes: one instruction ------------------------------------------------------
@dataclass(frozen=True)
class GoldStep:
    """One reference step: calls issued together and, when known, the real responses (same order)."""

    calls: tuple[ToolCall, ...]
    responses: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class EpisodeSpec:
    """One instruction as an engine sees it.

    ``user_turns`` are replayed in order; ``checklists[t]`` are the CM2 items of user turn t (for the
    judge); ``gold[t]`` are the reference steps of turn t (the SFT warm-up's ACT and REHEARSE targets and
    the built-in verifiable reward's reference; the REHEARSE prompt carries no examples from them);
    ``gold_answers[t]`` the reference final reply and ``answer_values[t]`` strings a correct final
    reply of turn t must contain.
    """

    task_id: str
    system_prompt: str
    tools: tuple[dict[str, Any], ...]
    user_turns: tuple[str, ...]
    checklists: tuple[tuple[dict[str, Any], ...], ...] = ()
    gold: tuple[tuple[GoldStep, ...], ...] = ()
    gold_answers: tuple[str, ...] = ()
    answer_values: tuple[tuple[str, ...], ...] = ()
    domain: str = ""
    source: str = "toolworld"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.user_turns:
            raise ValueError(f"EpisodeSpec {self.task_id!r}: no user turns; every episode needs at least one")
        for name, per_turn in (("gold", self.gold), ("checklists", self.checklists)):
            if per_turn and len(per_turn) != len(self.user_turns):
                raise ValueError(
                    f"EpisodeSpec {self.task_id!r}: {name} has {len(per_turn)} turns but user_turns has "
                    f"{len(self.user_turns)}; give one entry per user turn (empty tuple when none)"
                )

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool_schema_name(t) for t in self.tools)

    def tool_schema(self, name: str) -> dict[str, Any] | None:
        for tool in self.tools:
            if tool_schema_name(tool) == name:
                return tool
        return None


def tool_schema_name(tool: Mapping[str, Any]) -> str:
    """The function name of an OpenAI tool schema ({"type": "function", "function": {"name": ...}})."""
    fn = tool.get("function", tool)
    if "name" not in fn:
        raise ValueError(f"tool schema without a name: {json.dumps(tool)[:200]}; expected OpenAI function format")
    return str(fn["name"])
