"""One ACT/REHEARSE trajectory played turn by turn over an async token generator (no verl import here).

``EpisodeRunner`` is what the verl agent loop runs for every sample; it only needs an async
``generate(role, prompt_ids, max_new_tokens, temperature) -> Generation`` (verl's server manager behind
it, or anything token-in/token-out) and keeps one append-only token stream per role, exactly as
``envace.core.records`` describes them:

- ACT stream: ``render(act_messages, tools)`` + ACT outputs + ``ChatFormatter.continuation`` pieces
  (tool responses, the next replayed user turn).
- REHEARSE stream: the REHEARSE system prompt + per call: the call message, then one REHEARSE output
  (laid out by ``envace.core.rehearse_context``, the builder every REHEARSE path uses).

The loop: ACT generates → its calls are parsed (``envace.core.wire``) → each call is answered (a
REHEARSE generation, a real executor or a frozen simulator endpoint) → the responses go back into the
ACT stream → until a final reply of the last user turn, a parse failure, the per-turn step limit or
the token budget. The rules are those of the local engine's rollout (``envace.engines.local.rollout``)
so both engines train on the same trajectories; both call one end-of-turn rule,
``envace.core.turn_end.generation_ending`` (its last token, verl's ``stop_reason``, the budget decide what
the stream keeps). Differences:

- Only a server can abort a request (or stop without returning its stop token): an aborted request ends the
  episode (``Termination.ERROR``, ``info["aborted"]``; the agent loop excludes it).
- Tool responses longer than ``max_tool_response_length`` characters are cut before the ACT stream sees them,
  by verl's ``ToolAgentLoop`` rule (``truncate_tool_response``); the trajectory keeps them whole.
- Required checklist items are enforced at the end of each user turn by ``turn_gate`` when given, as
  in the local engine (``Termination.REQUIRED_ITEM_FAILED``).
- A call to a tool the task does not offer gets ``envace.core.unknown_tool``'s error without asking
  anyone, as in the local engine (its call message and answer are REHEARSE scaffold, no output).
- Scaffold text (tool responses, user turns, call messages) that would push a stream past
  ``max_stream_tokens`` ends the episode (MAX_TOKENS) *before* it is appended, so every row verl trains
  on stays within the configured length (the local engine appends it, then stops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envace.core.prompts import ChatFormatter, RolePrompts, act_messages, act_observation_messages
from envace.core.records import NO_ROLE, Role, Segment, Stream, Termination, ToolCall, Trajectory, Turn, TurnGate
from envace.core.rehearse_context import (
    Answered,
    Event,
    Said,
    next_call_message,
    rehearse_context,
    rehearse_system_message,
    stream_text,
)
from envace.core.turn_end import Ending, generation_ending
from envace.core.unknown_tool import unknown_tool_response
from envace.core.wire import parse_rehearsal, parse_tool_calls
from envace.engines.base import EpisodeSpec
from envace.engines.verl.settings import LoopSettings
from envace.inference.base import ChatRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generation:
    """What a token-in/token-out server returned for one request."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    min_global_step: int | None = None
    max_global_step: int | None = None
    stop_reason: str | None = None  # verl's TokenOutput.stop_reason: "completed", "length", "aborted" or None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"server returned {len(self.logprobs)} log-probs for {len(self.token_ids)} tokens; "
                "a row needs exactly one per generated token"
            )


GenerateFn = Callable[[Role, list[int], int, float], Awaitable[Generation]]


def _cut_left(text: str, n: int) -> str:
    return "(truncated)..." + text[len(text) - n :]


def _cut_right(text: str, n: int) -> str:
    return text[:n] + "...(truncated)"


def _cut_middle(text: str, n: int) -> str:
    return text[: n // 2] + "...(truncated)..." + text[len(text) - n // 2 :]


TRUNCATIONS: dict[str, Callable[[str, int], str]] = {"left": _cut_left, "right": _cut_right, "middle": _cut_middle}


def truncate_tool_response(text: str, max_chars: int | None, side: str) -> str:
    """verl ``ToolAgentLoop``'s rule for a tool response over ``max_chars`` characters: keep the last ``max_chars``
    (``left``), the first ``max_chars`` (``right``) or half of each (``middle``), marked "(truncated)";
    ``max_chars=None`` keeps every response whole."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return TRUNCATIONS[side](text, max_chars)


@dataclass
class RoleStream:
    """One role's append-only token stream: prompt, then response tokens with mask, role ids, log-probs."""

    role: Role
    prompt_ids: list[int]
    prompt_text: str
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    role_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    outputs: int = 0  # generations of this role with at least one token
    ends_with_generation: bool = False

    def __post_init__(self) -> None:
        self.segments.append(Segment(tuple(self.prompt_ids), text=self.prompt_text))

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def add_scaffold(self, ids: Sequence[int], text: str = "") -> None:
        self.response_ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.role_ids.extend([NO_ROLE] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        if ids:
            self.segments.append(Segment(tuple(ids), text=text))
        self.ends_with_generation = False

    def add_generation(self, ids: Sequence[int], logprobs: Sequence[float] | None, text: str, trainable: bool) -> None:
        lps = [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)
        self.response_ids.extend(ids)
        self.mask.extend([1 if trainable else 0] * len(ids))
        self.role_ids.extend([int(self.role) if trainable else NO_ROLE] * len(ids))
        self.logprobs.extend(lps)
        if ids:
            self.outputs += 1
            self.segments.append(
                Segment(
                    tuple(ids),
                    role=self.role if trainable else None,
                    logprobs=tuple(lps) if trainable else None,
                    text=text,
                )
            )
        self.ends_with_generation = True

    def drop_outputs_after(self, n: int) -> None:
        """Take every output after the first ``n`` (and the scaffold between them) out of the loss."""
        offset, seen = 0, 0
        for seg in self.segments[1:]:  # the first segment is the prompt
            if seg.role is self.role:
                if seen == n:
                    self.mask[offset:] = [0] * (len(self.mask) - offset)
                    self.role_ids[offset:] = [NO_ROLE] * (len(self.role_ids) - offset)
                    return
                seen += 1
            offset += len(seg.token_ids)

    def record(self) -> Stream:
        return Stream(self.role, tuple(self.segments))


@dataclass(frozen=True)
class EpisodeOutcome:
    """A finished trajectory: its role streams (token level) and its record (for rewards and judges)."""

    streams: dict[Role, RoleStream]
    trajectory: Trajectory
    num_messages: int
    min_global_step: int | None
    max_global_step: int | None


# who answers a tool call: name -> coroutine(runner, call) returning the response or None (episode ended)
Responder = Callable[["EpisodeRunner", ToolCall], Awaitable[Any]]


async def _policy_response(runner: EpisodeRunner, call: ToolCall) -> Any:
    return await runner.rehearse(call)


async def _executor_response(runner: EpisodeRunner, call: ToolCall) -> Any:
    if runner.executor is None:
        raise ValueError("responses='executor' but the episode has no executor; pass executor= to EpisodeRunner")
    return await asyncio.get_running_loop().run_in_executor(None, runner.executor.execute, call)


async def _simulator_response(runner: EpisodeRunner, call: ToolCall) -> Any:
    return await runner.simulate(call)


RESPONDERS: dict[str, Responder] = {
    "policy": _policy_response,
    "executor": _executor_response,
    "simulator": _simulator_response,
}


class EpisodeRunner:
    """Plays one trajectory of ``spec`` (see the module docstring)."""

    def __init__(
        self,
        spec: EpisodeSpec,
        settings: LoopSettings,
        formatter: ChatFormatter,
        prompts: RolePrompts,
        generate: GenerateFn,
        *,
        sample_index: int = 0,
        executor: Any = None,
        simulator: Any = None,
        turn_gate: TurnGate | None = None,
        end_token_ids: Sequence[int] = (),
    ):
        """``end_token_ids``: further tokens a server stops on (the tokenizer's EOS set; ``generation_ending``)."""
        self.spec = spec
        self.settings = settings
        self.fmt = formatter
        self.prompts = prompts
        self.generate_fn = generate
        self.sample_index = sample_index
        self.executor = executor
        self.simulator = simulator  # a ChatBackend (envace.inference) for responses='simulator'
        self.end_of_turn = formatter.end_of_turn_token_ids[0]
        self.stop_ids = frozenset(formatter.end_of_turn_token_ids) | frozenset(end_token_ids)
        self.aborted = False
        self.trainable = settings.trainable_roles
        self.streams: dict[Role, RoleStream] = {}
        self.turn_gate = turn_gate
        self.history: list[Event] = []  # the REHEARSE context's events (envace.core.rehearse_context)
        self.turns: list[Turn] = []
        self.parse_errors: list[tuple[str, str]] = []
        self.user_turn = 0
        self.steps_in_turn = 0
        self.termination: Termination | None = None
        self.steps: list[int] = []

    # ---- setup ---------------------------------------------------------------------------------
    def _start(self) -> None:
        spec = self.spec
        act_text = self.fmt.render(act_messages(self.prompts, spec.system_prompt, spec.user_turns[0]), spec.tools)
        self.streams[Role.ACT] = RoleStream(Role.ACT, self.fmt.encode(act_text), act_text)
        if self.settings.responses == "policy":
            base = [rehearse_system_message(self.prompts, spec.tools)]
            text = self.fmt.render(base, None, add_generation_prompt=False)
            self.streams[Role.REHEARSE] = RoleStream(Role.REHEARSE, self.fmt.encode(text), text)
        self.history = [Said("user", spec.user_turns[0])]

    async def run(self) -> EpisodeOutcome:
        self._start()
        while self.termination is None:
            await self._act_step()
        return self._outcome()

    # ---- generation ----------------------------------------------------------------------------
    async def _generate(self, role: Role) -> str | None:
        """One output of ``role`` appended to its stream; its text, or None when the episode ended."""
        stream = self.streams[role]
        budget = min(self.settings.max_new_tokens(role), self.settings.max_stream_tokens - len(stream))
        if budget <= 0:
            self.termination = Termination.MAX_TOKENS
            return None
        gen = await self.generate_fn(role, stream.token_ids, budget, self.settings.temperature(role))
        self.steps.extend(s for s in (gen.min_global_step, gen.max_global_step) if s is not None)
        ids, logprobs = list(gen.token_ids), gen.logprobs
        ending = generation_ending(ids, gen.stop_reason, budget, self.end_of_turn, self.stop_ids)
        if ending is Ending.OTHER_END_TOKEN:  # not the template's: out of the stream, its log-prob with it
            ids, logprobs = ids[:-1], None if logprobs is None else logprobs[:-1]
        body = ids[:-1] if ending is Ending.END_OF_TURN else ids
        stream.add_generation(ids, logprobs, self.fmt.decode(body), role in self.trainable)
        if ending in (Ending.OTHER_END_TOKEN, Ending.SILENT_STOP):
            stream.add_scaffold([self.end_of_turn], self.fmt.decode([self.end_of_turn]))
            stream.ends_with_generation = True
        elif ending is not Ending.END_OF_TURN:
            self.aborted = ending is Ending.ABORTED
            self.termination = Termination.ERROR if self.aborted else Termination.MAX_TOKENS
            return None
        return self.fmt.decode(body)

    def _append(self, role: Role, text: str) -> bool:
        """Append scaffold text to a stream; past ``max_stream_tokens`` the episode ends instead (False)."""
        return self._append_ids(role, self.fmt.encode(text), text)

    def _append_ids(self, role: Role, ids: list[int], text: str) -> bool:
        if len(self.streams[role]) + len(ids) > self.settings.max_stream_tokens:
            self.termination = Termination.MAX_TOKENS
            return False
        self.streams[role].add_scaffold(ids, text)
        return True

    # ---- ACT -----------------------------------------------------------------------------------
    async def _act_step(self) -> None:
        text = await self._generate(Role.ACT)
        if text is None:
            return
        parsed = parse_tool_calls(text)
        if not parsed.ok:
            self.parse_errors.extend((Role.ACT.name, e.code.value) for e in parsed.errors)
            self.termination = Termination.ACT_PARSE_ERROR
            return
        if parsed.content.strip():
            self.history.append(Said("assistant", parsed.content))
        if not parsed.calls:
            self._final_reply(parsed.content)
            return
        calls = tuple(
            ToolCall(c.name, c.arguments, id=f"call_{self.user_turn}_{self.steps_in_turn}_{j}")
            for j, c in enumerate(parsed.calls)
        )
        responses = []
        for call in calls:
            response = unknown_tool_response(call, self.spec.tool_names)
            if response is not None:
                self._answer_by_rule(call, response)
            else:
                response = await RESPONDERS[self.settings.responses](self, call)
            if self.termination is not None:
                return
            responses.append(response)
        rehearsed = self.settings.responses == "policy"
        self.turns.append(Turn(parsed.content, calls, tuple(responses), rehearsed, self.user_turn))
        self.steps_in_turn += 1
        if self.steps_in_turn >= self.settings.max_steps_per_turn:
            self.termination = Termination.MAX_STEPS
            return
        self._append(Role.ACT, self.fmt.continuation(self._observations(calls, responses), self.spec.tools))

    def _observations(self, calls: tuple[ToolCall, ...], responses: list[Any]) -> list[dict[str, Any]]:
        """The tool messages ACT reads: each response cut to ``max_tool_response_length`` characters."""
        limit, side = self.settings.max_tool_response_length, self.settings.tool_response_truncate_side
        messages = act_observation_messages(calls, responses)
        return [{**m, "content": truncate_tool_response(m["content"], limit, side)} for m in messages]

    def _final_reply(self, content: str) -> None:
        self.turns.append(Turn(content, user_turn=self.user_turn))
        if self.user_turn + 1 >= len(self.spec.user_turns):
            self.termination = Termination.FINAL_REPLY
            return
        if self.turn_gate is not None and self.turn_gate(self.spec, self.turns, self.user_turn) is False:
            self.termination = Termination.REQUIRED_ITEM_FAILED
            return
        self.user_turn += 1
        self.steps_in_turn = 0
        user = {"role": "user", "content": self.spec.user_turns[self.user_turn]}
        self._append(Role.ACT, self.fmt.continuation([user], self.spec.tools))
        self.history.append(Said("user", self.spec.user_turns[self.user_turn]))

    # ---- REHEARSE / simulator ------------------------------------------------------------------
    def _answer_by_rule(self, call: ToolCall, response: Any) -> None:
        """Record the unknown-tool rule's answer in the history and, when the policy rehearses, in the
        REHEARSE stream as scaffold: the call message, then the answer, laid out as any answered call."""
        answer = Answered(call, response)
        stream = self.streams.get(Role.REHEARSE)
        if stream is not None:
            message = next_call_message(
                self.prompts, self.spec.tools, self.history, call, self.settings.rehearse_context_tokens
            )
            text = stream_text(self.fmt, self.prompts, self.spec.tools, message, stream.ends_with_generation)
            ids = self.fmt.encode(answer.answer_text()) + [self.fmt.end_of_turn_token_ids[0]]
            if not (self._append(Role.REHEARSE, text) and self._append_ids(Role.REHEARSE, ids, self.fmt.decode(ids))):
                return
            stream.ends_with_generation = True  # the next call message continues it as after a generation
        self.history.append(answer)

    async def rehearse(self, call: ToolCall) -> Any:
        """The policy's REHEARSE output for ``call`` (None and a termination when unusable)."""
        stream = self.streams[Role.REHEARSE]
        message = next_call_message(
            self.prompts, self.spec.tools, self.history, call, self.settings.rehearse_context_tokens
        )
        text = stream_text(self.fmt, self.prompts, self.spec.tools, message, stream.ends_with_generation)
        if not self._append(Role.REHEARSE, text):
            return None
        output = await self._generate(Role.REHEARSE)
        return None if output is None else self._answered(call, output)

    def _answered(self, call: ToolCall, text: str) -> Any:
        result = self._parsed_result(text)
        if result is not None:
            self.history.append(Answered(call, result, text))
        return result

    async def simulate(self, call: ToolCall) -> Any:
        """A frozen simulator's answer for ``call`` (same REHEARSE prompt, through a chat endpoint)."""
        if self.simulator is None:
            raise ValueError("responses='simulator' but no simulator backend was given to EpisodeRunner")
        messages = rehearse_context(
            self.prompts, self.spec.tools, self.history, call, self.settings.rehearse_context_tokens
        )
        request = ChatRequest(
            messages=tuple(messages),
            temperature=self.settings.rehearse_temperature,
            max_new_tokens=self.settings.max_rehearse_tokens,
        )
        loop = asyncio.get_running_loop()
        output = (await loop.run_in_executor(None, self.simulator.generate, [request]))[0]
        return self._answered(call, output.text)

    def _parsed_result(self, text: str) -> Any:
        parsed = parse_rehearsal(text)
        if not parsed.ok:
            self.parse_errors.extend((Role.REHEARSE.name, e.code.value) for e in parsed.errors)
            self.termination = Termination.REHEARSE_PARSE_ERROR
            return None
        return parsed.result

    # ---- result --------------------------------------------------------------------------------
    def _outcome(self) -> EpisodeOutcome:
        streams = tuple(s.record() for s in self.streams.values() if s.outputs or s.role is Role.ACT)
        finals = {t.user_turn: t.act_text for t in self.turns if not t.tool_calls}
        info = {
            "outputs": {role.name: s.outputs for role, s in self.streams.items()},
            "parse_errors": list(self.parse_errors),
            "final_answers": [finals.get(t, "") for t in range(len(self.spec.user_turns))],
            "responses": self.settings.responses,
            "aborted": self.aborted,
        }
        if self.executor is not None and hasattr(self.executor, "state"):
            info["final_state"] = self.executor.state()
        trajectory = Trajectory(
            prompt_id=self.spec.task_id,
            sample_index=self.sample_index,
            streams=streams,
            turns=tuple(self.turns),
            termination=self.termination or Termination.ERROR,
            info=info,
        )
        messages = (self.user_turn + 1) + len(self.turns) + sum(len(t.responses) for t in self.turns)
        return EpisodeOutcome(
            dict(self.streams),
            trajectory,
            messages,
            min(self.steps) if self.steps else None,
            max(self.steps) if self.steps else None,
        )
