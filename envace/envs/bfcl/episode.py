"""The BFCL policy loop, written as generation programs (``envace.evaluation.programs``).

It follows bfcl's own FC inference loop (``BaseHandler.inference_*_FC``), with our wire parser:

* single-turn categories: the entry's messages and tools, **one** generation;
* multi-turn and memory: per turn, the turn's messages (a function-holdout turn of ``miss_func`` adds
  the held-out functions to the tools and sends bfcl's "I have updated some more functions" prompt),
  then ACT steps: a generation whose parse holds no call ends the turn (bfcl: an empty or undecodable
  response), otherwise the calls run on the real executor — bfcl's exact response strings go back as
  ``tool`` messages — and ACT goes again. More than ``max_steps_per_turn`` executing steps in a turn
  (bfcl: ``MAXIMUM_STEP_LIMIT`` = 20) force-quits the episode; bfcl then fails the entry.
* memory: bfcl's memory instructions (with the current core memory) are merged into the first system
  message; prerequisite conversations flush their memory to the snapshot folder when they end.

Malformed tool-call blocks do not end a turn by themselves: like bfcl's Hermes decoder, the loop keeps
the well-formed calls of a message. They are counted as parse failures with their error codes.
A ``turn_hook`` (test-time rehearsal memory) may inject messages before each turn's messages.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envace.core.prompts import Message
from envace.core.records import Termination, ToolCall, Turn
from envace.core.rehearse_context import events_from_messages
from envace.core.seeds import derive_seed
from envace.envs.bfcl.convert import decode_response, encode_response, openai_tools
from envace.envs.bfcl.scoring import parse_output
from envace.envs.bfcl.upstream import bfcl
from envace.evaluation.episode import TurnHook, TurnView
from envace.evaluation.programs import (
    ACTOR,
    GenerationCall,
    GenerationLedger,
    Program,
    generate_one,
)
from envace.inference.base import ChatRequest


@dataclass(frozen=True)
class BfclConfig:
    """Sampling and budgets of the BFCL loop.

    ``max_steps_per_turn`` None = bfcl's ``MAXIMUM_STEP_LIMIT``. ``system_prefix``: text put before the
    entry's own system message (e.g. the ACT role prompt of a trained policy); empty = bfcl's prompts only,
    the official FC setting.
    """

    max_new_tokens: int = 512
    temperature: float = 0.0
    seed: int = 0
    max_steps_per_turn: int | None = None
    system_prefix: str = ""

    def step_limit(self) -> int:
        return self.max_steps_per_turn if self.max_steps_per_turn is not None else bfcl().prompts.MAXIMUM_STEP_LIMIT


@dataclass
class Transcript:
    """What one conversation produced (mutable while the program runs)."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    outputs: list[list[str]] = field(default_factory=list)  # raw generations per turn
    turns: list[Turn] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    generations: int = 0
    parse_failures: int = 0
    codes: list[str] = field(default_factory=list)
    real_calls: int = 0
    force_quit: bool = False

    @property
    def termination(self) -> Termination:
        return Termination.MAX_STEPS if self.force_quit else Termination.FINAL_REPLY


def generation_seed(seed: int, task_id: str, trial: int, turn: int, step: int) -> int:
    """The sampling seed of one ACT generation (crc32 of its coordinates)."""
    return derive_seed(seed, task_id, trial, turn, step)


def with_system_prefix(messages: list[Message], prefix: str) -> list[Message]:
    """Messages with ``prefix`` merged into (or inserted as) the leading system message."""
    if not prefix:
        return messages
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{prefix}\n\n{messages[0].get('content', '')}"}, *messages[1:]]
    return [{"role": "system", "content": prefix}, *messages]


def _respond(executor: Any, call: ToolCall) -> tuple[str, Any]:
    """(tool-message text, JSON value) of one real call; exact bfcl text when the executor offers it."""
    if hasattr(executor, "execute_text"):
        text = executor.execute_text(call)
        return text, decode_response(text)
    value = executor.execute(call)
    return encode_response(value), value


def _assistant(content: str, calls: Sequence[ToolCall]) -> Message:
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.to_openai() for c in calls]
    return message


def _hook_messages(hook: TurnHook | None, t: Transcript, turn: int) -> Program[tuple[Message, ...]]:
    if hook is None:
        return ()
    start = 1 if t.messages and t.messages[0].get("role") == "system" else 0
    conversation = tuple(t.messages[start:])
    notes = yield from hook(TurnView(turn, conversation, tuple(events_from_messages(conversation))))
    return tuple(notes)


def _generate(
    t: Transcript,
    config: BfclConfig,
    ledger: GenerationLedger,
    seed_parts: tuple[Any, ...],
    purpose: str = "act",
) -> Program[str]:
    """One ACT generation; ``seed_parts`` = (task id, trial, turn, step)."""
    request = ChatRequest(
        messages=tuple(t.messages),
        tools=tuple(t.tools),
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=generation_seed(config.seed, *seed_parts),
    )
    output = yield from generate_one(GenerationCall(ACTOR, purpose, request), ledger)
    t.generations += 1
    return output.text


def _note_parse(t: Transcript, text: str) -> Any:
    parse = parse_output(text)
    if parse.errors:
        t.parse_failures += 1
        t.codes.extend(e.code.value for e in parse.errors)
    return parse


def single_turn_program(
    question: list[list[Message]],
    tools: Sequence[dict[str, Any]],
    config: BfclConfig,
    ledger: GenerationLedger,
    seed_tag: tuple[Any, ...],
    hook: TurnHook | None = None,
) -> Program[Transcript]:
    """One generation on the entry's (single) turn."""
    t = Transcript(messages=[], tools=list(tools))
    t.messages = with_system_prefix(copy.deepcopy(list(question[0])), config.system_prefix)
    notes = yield from _hook_messages(hook, t, 0)
    if notes:  # before the user message(s), after a leading system message
        at = 1 if t.messages and t.messages[0].get("role") == "system" else 0
        t.messages[at:at] = list(notes)
    text = yield from _generate(t, config, ledger, (*seed_tag, 0, 0))
    parse = _note_parse(t, text)
    t.outputs.append([text])
    t.turns.append(Turn(act_text=text, tool_calls=parse.calls, rehearsed=False, user_turn=0))
    t.answers.append(parse.content)
    return t


def _turn_messages(
    turn: int, messages: list[Message], holdout: Mapping[str, list[dict[str, Any]]], t: Transcript
) -> list[Message]:
    """The turn's messages; a holdout turn first adds its functions to the tools (as bfcl does)."""
    if str(turn) not in holdout:
        return copy.deepcopy(messages)
    t.tools.extend(openai_tools(holdout[str(turn)]))
    return [{"role": "user", "content": bfcl().prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]


def _play_turn(
    t: Transcript,
    turn: int,
    executor: Any,
    config: BfclConfig,
    ledger: GenerationLedger,
    seed_tag: tuple[Any, ...],
    purpose: str,
) -> Program[None]:
    """ACT steps of one turn (see the module docstring)."""
    outputs: list[str] = []
    answer, executed = "", 0
    while True:
        text = yield from _generate(t, config, ledger, (*seed_tag, turn, len(outputs)), purpose)
        outputs.append(text)
        parse = _note_parse(t, text)
        if not parse.calls:
            t.messages.append(_assistant(parse.content, ()))
            t.turns.append(Turn(act_text=text, rehearsed=False, user_turn=turn))
            answer = parse.content
            break
        calls = tuple(
            ToolCall(c.name, c.arguments, f"call_{turn}_{len(outputs) - 1}_{i}") for i, c in enumerate(parse.calls)
        )
        results = [_respond(executor, call) for call in calls]
        t.real_calls += len(calls)
        t.messages.append(_assistant(parse.content, calls))
        t.messages.extend(
            {"role": "tool", "name": c.name, "tool_call_id": c.id, "content": reply}
            for c, (reply, _) in zip(calls, results)
        )
        t.turns.append(Turn(text, calls, tuple(v for _, v in results), rehearsed=False, user_turn=turn))
        executed += 1
        if executed > config.step_limit():
            t.force_quit = True
            break
    t.outputs.append(outputs)
    t.answers.append(answer)


def conversation_program(
    question: list[list[Message]],
    tools: Sequence[dict[str, Any]],
    executor: Any,
    config: BfclConfig,
    ledger: GenerationLedger,
    seed_tag: tuple[Any, ...],
    *,
    holdout: Mapping[str, list[dict[str, Any]]] | None = None,
    hook: TurnHook | None = None,
    purpose: str = "act",
) -> Program[Transcript]:
    """Play every turn of a multi-turn (or memory) entry against ``executor``."""
    t = Transcript(messages=[], tools=list(tools))
    for turn, messages in enumerate(question):
        incoming = _turn_messages(turn, list(messages), holdout or {}, t)
        if turn == 0:
            incoming = with_system_prefix(incoming, config.system_prefix)
            system = [m for m in incoming[:1] if m.get("role") == "system"]
            t.messages.extend(system)
            incoming = incoming[len(system) :]
        t.messages.extend((yield from _hook_messages(hook, t, turn)))
        t.messages.extend(incoming)
        yield from _play_turn(t, turn, executor, config, ledger, seed_tag, purpose)
        if t.force_quit:
            break
    return t
