"""Episode specs of CM2 rows: what a rollout needs from one row and its recorded (call, response) exchanges
(the SFT warm-up's REHEARSE targets; the REHEARSE prompt itself carries no few-shot examples).

``cm2_row_to_episode_spec`` validates the row again (``envace.data.cm2_schema.check_row``), so a raw row
from anywhere can be passed, and returns a ``Cm2Episode`` (the row's recorded exchanges and checklist
variant); ``to_engine_spec`` converts it into the one ``envace.core.records.EpisodeSpec`` every engine
consumes (the tool world produces the same record: ``envace.data.specs.episode_spec_from_task``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envace.core.checklist import Checklist
from envace.core.conversation import conversation_steps, json_or_text, split_thinking
from envace.core.env import Task
from envace.core.records import EpisodeSpec, GoldStep, ToolCall
from envace.data.cm2_reasons import Cm2ValidationConfig
from envace.data.cm2_schema import check_row


@dataclass(frozen=True)
class RecordedExchange:
    """One recorded (tool call, tool response) pair of the reference conversation."""

    turn: int
    step: int
    call: ToolCall
    response: Any  # the tool message content, parsed when it is JSON


@dataclass(frozen=True)
class Cm2Episode:
    """What a rollout needs from one CM2 row (its recorded exchanges; ``to_engine_spec`` -> ``EpisodeSpec``)."""

    uuid: str
    system_prompt: str  # "" when the row has no system message
    tools: tuple[dict[str, Any], ...]
    user_turns: tuple[str, ...]  # replayed in order
    checklist: Checklist  # one variant, one entry per user turn
    exchanges: tuple[tuple[RecordedExchange, ...], ...]  # per user turn, in conversation order
    reference_replies: tuple[str, ...]  # per user turn: user-visible text of its last assistant message

    @property
    def n_turns(self) -> int:
        return len(self.user_turns)

    def to_engine_spec(self) -> EpisodeSpec:
        """This episode as the engines' ``envace.core.records.EpisodeSpec`` (see ``to_engine_spec``)."""
        return to_engine_spec(self)

    def to_task(self, split: str = "train", domain: str = "cm2") -> Task:
        """The environment-level ``Task`` of this episode (gold calls grouped per assistant step)."""
        gold: list[tuple[tuple[ToolCall, ...], ...]] = []
        for turn in self.exchanges:
            by_step: dict[int, list[ToolCall]] = {}
            for ex in turn:
                by_step.setdefault(ex.step, []).append(ex.call)
            gold.append(tuple(tuple(by_step[s]) for s in sorted(by_step)))
        return Task(
            task_id=self.uuid,
            domain=domain,
            split=split,
            system_prompt=self.system_prompt,
            tools=self.tools,
            user_turns=self.user_turns,
            gold_calls=tuple(gold),
            gold_answers=self.reference_replies,
            checklists=tuple(tuple(it.to_dict() for it in items) for items in self.checklist.turns),
        )


def to_engine_spec(spec: Cm2Episode) -> EpisodeSpec:
    """The ``envace.core.records.EpisodeSpec`` of a CM2 episode (recorded responses kept as gold)."""
    gold = []
    for turn in spec.exchanges:
        by_step: dict[int, list[RecordedExchange]] = {}
        for ex in turn:
            by_step.setdefault(ex.step, []).append(ex)
        gold.append(
            tuple(
                GoldStep(tuple(e.call for e in by_step[s]), tuple(e.response for e in by_step[s]))
                for s in sorted(by_step)
            )
        )
    return EpisodeSpec(
        task_id=spec.uuid,
        system_prompt=spec.system_prompt,
        tools=spec.tools,
        user_turns=spec.user_turns,
        checklists=tuple(tuple(it.to_dict() for it in items) for items in spec.checklist.turns),
        gold=tuple(gold),
        gold_answers=spec.reference_replies,
        answer_values=tuple(() for _ in spec.user_turns),
        domain="cm2",
        source="cm2",
    )


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    fn = call["function"]
    args = fn.get("arguments", "{}")
    return ToolCall(
        name=fn["name"],
        arguments=dict(json.loads(args) if isinstance(args, str) else args),
        id=call.get("id"),
    )


def cm2_row_to_episode_spec(
    row: Mapping[str, Any], variant: int = 0, config: Cm2ValidationConfig = Cm2ValidationConfig()
) -> Cm2Episode:
    """Episode spec of a raw CM2 row (validated here again; ``ValueError`` names the first problem)."""
    check_row(row, config)
    if not 0 <= variant < len(row["checklists"]):
        raise ValueError(
            f"row {row['uuid']}: checklist variant {variant} requested, the row has {len(row['checklists'])}"
        )
    messages = row["messages"]
    user_turns = tuple(m["content"] for m in messages if m["role"] == "user")
    exchanges: list[list[RecordedExchange]] = [[] for _ in user_turns]
    replies = [""] * len(user_turns)
    for st in conversation_steps(messages):
        calls = st.assistant.get("tool_calls") or []
        for call, answer in zip(calls, st.tool_messages):
            exchanges[st.turn].append(
                RecordedExchange(st.turn, st.step, _tool_call(call), json_or_text(answer["content"]))
            )
        replies[st.turn] = split_thinking(st.assistant.get("content"))[1]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    return Cm2Episode(
        uuid=row["uuid"],
        system_prompt=system,
        tools=tuple(row["tools"]),
        user_turns=user_turns,
        checklist=Checklist.from_raw(row["checklists"][variant], f"checklists[{variant}]", config.weight_tolerance),
        exchanges=tuple(tuple(t) for t in exchanges),
        reference_replies=tuple(replies),
    )
