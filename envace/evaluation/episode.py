"""The ACT loop over a chat backend, shared by evaluation, rehearsal attempts and committed executions.

One loop, two kinds of responders: ``ExecutorResponder`` runs calls for real (evaluation, committed
execution); ``envace.rehearsal.imagined.RehearserResponder`` asks the REHEARSE role instead (private
rehearsal). The loop itself has no idea which one it talks to.

Per user turn (replayed in order from the task): optional notes from a ``turn_hook`` (the rehearsal
memory), the user message, then up to ``max_steps_per_turn`` ACT generations. Each generation is parsed
with ``envace.core.wire.parse_tool_calls``:
* no call block and nothing malformed → the turn's final reply; the next user turn starts;
* malformed → an ACT parse failure; the episode ends (``Termination.ACT_PARSE_ERROR``), as in docs/method.md §1;
* calls → the responder answers each; the calls and responses are appended (OpenAI ``tool_calls`` on
  the assistant message, one ``tool`` message per call) and ACT goes again.
Using up the step budget of a turn ends the episode (``Termination.MAX_STEPS``); the remaining turns get
an empty answer. Unknown tool names are *not* parse failures: such a call gets the error of
``envace.core.unknown_tool`` (the rule of every training and evaluation loop) without reaching the
responder, so no executor runs it and no rehearser is asked; the agent may recover. The calls of one step
are answered in order, each run of offered ones by the responder with the answers before it in its history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from envace.core.env import Executor, Task
from envace.core.prompts import DEFAULT_ROLE_PROMPTS, Message, RolePrompts, act_messages, act_observation_messages
from envace.core.records import Termination, ToolCall, Turn, tool_schema_name
from envace.core.rehearse_context import Answered, Event, Said
from envace.core.seeds import derive_seed
from envace.core.unknown_tool import unknown_tool_response
from envace.core.wire import parse_tool_calls
from envace.evaluation.programs import ACTOR, GenerationCall, GenerationLedger, Program, generate_one
from envace.inference.base import ChatRequest


@dataclass(frozen=True)
class ActLoopConfig:
    """Budgets and sampling of the ACT loop (the budgets' defaults are conf/eval/default.yaml's)."""

    max_steps_per_turn: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    role_prompts: RolePrompts = DEFAULT_ROLE_PROMPTS

    def __post_init__(self) -> None:
        if self.max_steps_per_turn < 1:
            raise ValueError(f"ActLoopConfig.max_steps_per_turn={self.max_steps_per_turn}: must be >= 1")


@dataclass(frozen=True)
class Dialogue:
    """What the ACT loop plays: the task's instructions, tools and the user turns to replay.

    ``first_turn_index`` / ``history``: start in the middle of a conversation (turn-scope rehearsal):
    ``history`` are the messages after the system message that precede user turn ``first_turn_index``,
    ``history_events`` the same conversation as REHEARSE-context events (``envace.core.rehearse_context``).
    ``trial``: the repetition of a task in a multi-trial evaluation (``envace.evaluation.base.with_trials``);
    ``run_act_loop`` seeds trials after the first differently, so they draw different episodes while trial 0
    keeps a single-trial run's seeds. ``of_task`` sets it from the task, so adapters cannot forget it.
    """

    task_id: str
    system_prompt: str
    tools: tuple[dict[str, Any], ...]
    user_turns: tuple[str, ...]
    first_turn_index: int = 0
    history: tuple[Message, ...] = ()
    history_events: tuple[Event, ...] = ()
    trial: int = 0

    @classmethod
    def of_task(cls, task: Task, **changes: Any) -> Dialogue:
        """The dialogue of ``task`` (its id, instructions, tools, user turns and trial), with ``changes``."""
        base = cls(task.task_id, task.system_prompt, tuple(task.tools), tuple(task.user_turns), trial=trial_of(task))
        return replace(base, **changes)

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool_schema_name(t) for t in self.tools)


def trial_of(task: Task) -> int:
    """Which repetition of ``task`` this is in a multi-trial evaluation (``with_trials``; 0 = the first)."""
    return int(task.meta.get("trial", 0) or 0)


def trial_tag(tag: str, trial: int) -> str:
    """A seed tag for trial ``trial``: ``tag`` itself for the first (a single-trial run's seeds), else tagged."""
    return tag if trial == 0 else f"{tag}/trial{trial}"


@dataclass(frozen=True)
class ResponseBatch:
    """Responses to one step's calls; ``ok=False`` when the responder could not answer (ends the loop)."""

    responses: tuple[Any, ...]
    ok: bool = True
    error_codes: tuple[str, ...] = ()
    stand_ins: tuple[int, ...] = ()  # indices of responses made up in place of the real executor's (Turn.stand_ins)
    texts: tuple[str | None, ...] = ()  # the rehearser's raw output per response (imagined responses only)


class ToolResponder(Protocol):
    """Answers one step's calls. ``history``: the conversation so far as REHEARSE-context events (user
    turns, the agent's visible text, earlier calls with their responses) — what a rehearser conditions on."""

    rehearsed: bool  # True when responses are imagined (recorded on each Turn)

    def respond(
        self, calls: tuple[ToolCall, ...], user_turn: int, user_text: str, history: tuple[Event, ...] = ()
    ) -> Program[ResponseBatch]: ...


@dataclass(frozen=True)
class TurnView:
    """What a turn hook sees before user turn ``turn_index``: the conversation so far, never an executor."""

    turn_index: int
    conversation: tuple[Message, ...]  # messages after the system message
    events: tuple[Event, ...] = ()  # the same conversation as REHEARSE-context events


TurnHook = Callable[[TurnView], Program[tuple[Message, ...]]]


@dataclass(frozen=True)
class LoopResult:
    turns: tuple[Turn, ...]
    final_answers: tuple[str, ...]
    termination: Termination
    act_generations: int
    parse_failures: int
    parse_error_codes: tuple[str, ...] = ()
    responder_failures: int = 0
    messages: tuple[Message, ...] = field(default=(), repr=False)


class ExecutorResponder:
    """Runs calls on the real executor, one by one, in call order; counts them."""

    rehearsed = False

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self.calls_made = 0
        self.seconds = 0.0

    def respond(
        self, calls: tuple[ToolCall, ...], user_turn: int, user_text: str, history: tuple[Event, ...] = ()
    ) -> Program[ResponseBatch]:
        start = time.perf_counter()
        responses = []
        for call in calls:
            self.calls_made += 1
            responses.append(self._executor.execute(call))
        self.seconds += time.perf_counter() - start
        return ResponseBatch(tuple(responses))
        yield []  # pragma: no cover - makes this method a generator

    def state(self) -> dict[str, Any]:
        """The executor's state snapshot (for scoring)."""
        return self._executor.state()


def _offered_run(calls: tuple[ToolCall, ...], start: int, tool_names: tuple[str, ...]) -> tuple[ToolCall, ...]:
    """The calls from ``start`` up to the first one to a tool the task does not offer."""
    end = start
    while end < len(calls) and unknown_tool_response(calls[end], tool_names) is None:
        end += 1
    return calls[start:end]


def _respond(
    responder: ToolResponder,
    calls: tuple[ToolCall, ...],
    tool_names: tuple[str, ...],
    user_turn: int,
    user_text: str,
    history: tuple[Event, ...],
) -> Program[ResponseBatch]:
    """One step's responses, in call order: the unknown-tool rule's answer for a tool the task does not
    offer, the responder's for each run of offered ones (its history holds every answer before the run)."""
    responses: list[Any] = []
    texts: list[str | None] = []
    stand_ins: list[int] = []
    events = list(history)
    while len(responses) < len(calls):
        ruled = unknown_tool_response(calls[len(responses)], tool_names)
        if ruled is not None:
            responses.append(ruled)
            texts.append(None)
            events.append(Answered(calls[len(responses) - 1], ruled))
            continue
        run = _offered_run(calls, len(responses), tool_names)
        batch = yield from responder.respond(run, user_turn, user_text, tuple(events))
        answered = batch.texts or (None,) * len(batch.responses)
        stand_ins.extend(len(responses) + i for i in batch.stand_ins)
        events.extend(Answered(c, r, x) for c, r, x in zip(run, batch.responses, answered))
        responses.extend(batch.responses)
        texts.extend(answered)
        if not batch.ok:
            return ResponseBatch(tuple(responses), False, batch.error_codes, tuple(stand_ins), tuple(texts))
    return ResponseBatch(tuple(responses), stand_ins=tuple(stand_ins), texts=tuple(texts))


def _with_ids(calls: tuple[ToolCall, ...], user_turn: int, step: int) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(c.name, c.arguments, f"call_{user_turn}_{step}_{i}") for i, c in enumerate(calls))


def _assistant_message(content: str, calls: tuple[ToolCall, ...]) -> Message:
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.to_openai() for c in calls]
    return message


@dataclass
class _LoopState:
    """Mutable bookkeeping of one loop run (local to ``run_act_loop``)."""

    messages: list[Message]
    events: list[Event] = field(default_factory=list)  # REHEARSE-context view of the same conversation
    turns: list[Turn] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    generations: int = 0
    parse_failures: int = 0
    codes: list[str] = field(default_factory=list)
    responder_failures: int = 0

    def result(self, termination: Termination, n_turns: int) -> LoopResult:
        answers = self.answers + [""] * (n_turns - len(self.answers))
        return LoopResult(
            tuple(self.turns),
            tuple(answers),
            termination,
            self.generations,
            self.parse_failures,
            tuple(self.codes),
            self.responder_failures,
            tuple(self.messages),
        )


def _play_turn(
    dialogue: Dialogue,
    responder: ToolResponder,
    config: ActLoopConfig,
    ledger: GenerationLedger,
    state: _LoopState,
    turn: int,
    purpose: str,
    seed_tag: str,
) -> Program[Termination | None]:
    """ACT steps of one user turn; returns None when the turn ended with a final reply."""
    user_text = dialogue.user_turns[turn - dialogue.first_turn_index]
    for step in range(config.max_steps_per_turn):
        request = ChatRequest(
            messages=tuple(state.messages),
            tools=dialogue.tools,
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
            seed=derive_seed(config.seed, dialogue.task_id, seed_tag, turn, step),
        )
        output = yield from generate_one(GenerationCall(ACTOR, purpose, request), ledger)
        state.generations += 1
        parse = parse_tool_calls(output.text)
        if parse.content.strip():
            state.events.append(Said("assistant", parse.content))
        if parse.is_final:
            state.messages.append(_assistant_message(parse.content, ()))
            state.turns.append(Turn(act_text=output.text, rehearsed=responder.rehearsed, user_turn=turn))
            state.answers.append(parse.content)
            return None
        if not parse.ok:
            state.parse_failures += 1
            state.codes.extend(e.code.value for e in parse.errors)
            state.turns.append(Turn(act_text=output.text, rehearsed=responder.rehearsed, user_turn=turn))
            return Termination.ACT_PARSE_ERROR
        calls = _with_ids(parse.calls, turn, step)
        batch = yield from _respond(responder, calls, dialogue.tool_names, turn, user_text, tuple(state.events))
        state.events.extend(Answered(c, r, x) for c, r, x in zip(calls, batch.responses, batch.texts))
        state.turns.append(
            Turn(
                output.text,
                calls,
                batch.responses,
                rehearsed=responder.rehearsed,
                user_turn=turn,
                stand_ins=batch.stand_ins,
            )
        )
        if not batch.ok:
            state.responder_failures += 1
            state.codes.extend(batch.error_codes)
            return Termination.REHEARSE_PARSE_ERROR
        state.messages.append(_assistant_message(parse.content, calls))
        state.messages.extend(act_observation_messages(calls, batch.responses))
    return Termination.MAX_STEPS


def run_act_loop(
    dialogue: Dialogue,
    responder: ToolResponder,
    config: ActLoopConfig,
    ledger: GenerationLedger,
    *,
    purpose: str = "act",
    seed_tag: str = "act",
    turn_hook: TurnHook | None = None,
) -> Program[LoopResult]:
    """Play every user turn of ``dialogue`` (see the module docstring for the rules)."""
    seed_tag = trial_tag(seed_tag, dialogue.trial)
    if not dialogue.user_turns:
        raise ValueError(f"task {dialogue.task_id!r} has no user turns; nothing to play")
    system = act_messages(config.role_prompts, dialogue.system_prompt, dialogue.user_turns[0])[0]
    state = _LoopState(messages=[system, *dialogue.history], events=list(dialogue.history_events))
    n_turns = len(dialogue.user_turns)
    for offset, user_text in enumerate(dialogue.user_turns):
        turn = dialogue.first_turn_index + offset
        if turn_hook is not None:
            view = TurnView(turn, tuple(state.messages[1:]), tuple(state.events))
            notes = yield from turn_hook(view)
            state.messages.extend(notes)
        state.messages.append({"role": "user", "content": user_text})
        state.events.append(Said("user", user_text))
        ended = yield from _play_turn(dialogue, responder, config, ledger, state, turn, purpose, seed_tag)
        if ended is not None:
            return state.result(ended, n_turns)
    return state.result(Termination.FINAL_REPLY, n_turns)
