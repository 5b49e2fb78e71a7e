"""Batched multi-turn ACT/REHEARSE rollouts with append-only token streams and KV-cache reuse (docs/method.md §1, §7).

For a batch of ``EpisodeSpec``s, K trajectories each are played in lock-step phases:
ACT phase (every live trajectory generates one ACT output) → response phase (each pending tool call
is answered: one REHEARSE generation per call, or a real executor) → advance (observations or the
next replayed user turn are appended to the ACT stream). A trajectory ends on a final reply of its
last user turn, a parse failure of either role, the per-turn step limit or a token budget.

Streams (see ``envace.core.records``): the ACT stream is ``render(act_messages, tools)`` followed by
ACT outputs and ``ChatFormatter.continuation`` pieces; the REHEARSE stream is the REHEARSE system
prompt followed, per call, by the call message and one REHEARSE output. Each model keeps one
``BatchedStreams`` cache per role for the whole rollout: only new tokens are ever fed, and each prompt
is prefilled once and its cache expanded to its K samples.

Deviations / choices:
- How a generation ended decides what its stream keeps, by the rule the verl loop calls too
  (``envace.core.turn_end``): one that hits its token budget without an end token ends the trajectory
  (``Termination.MAX_TOKENS``); its text is not parsed (a chat could not continue after it).
- Any parse error in an ACT message ends the trajectory, even when other call blocks were fine. A call to
  a tool the task does not offer is no parse error: it gets ``envace.core.unknown_tool``'s error without
  asking anyone (in the REHEARSE stream the call message and that answer are scaffold, no output).
- The REHEARSE stream is laid out by ``envace.core.rehearse_context`` (the one builder every path uses):
  each call message carries the conversation messages since the previous call (user turns, the ACT's
  visible text), then the call; the answers are the rehearser's own outputs. No reference pairs of the
  turns the trajectory plays itself are shown (they would contradict its own answers).
- Required checklist items (CM2 ``required_for_next_turn``) are enforced at the end of every user turn
  but the last by ``turn_gate`` when one is given (the engine builds it from the rule judge; it answers
  only where every required item of the turn is machine-checkable): a failed one ends the trajectory
  (``Termination.REQUIRED_ITEM_FAILED``).
- Responses from a frozen simulator or a real executor are recorded as non-trainable (``Turn.rehearsed``
  is False; simulator segments carry no role).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from envace.core.env import Executor
from envace.core.prompts import (
    DEFAULT_ROLE_PROMPTS,
    ChatFormatter,
    RolePrompts,
    act_messages,
    act_observation_messages,
)
from envace.core.records import (
    Role,
    Segment,
    Stream,
    Termination,
    ToolCall,
    Trajectory,
    Turn,
    TurnGate,
)
from envace.core.rehearse_context import (
    Answered,
    Event,
    Said,
    next_call_message,
    rehearse_system_message,
    stream_text,
)
from envace.core.seeds import derive_seed
from envace.core.turn_end import Ending, generation_ending
from envace.core.unknown_tool import unknown_tool_response
from envace.core.wire import parse_rehearsal, parse_tool_calls
from envace.engines.base import EpisodeSpec
from envace.engines.local.config import RolloutConfig
from envace.engines.local.rollout_records import ResponseSource, RolloutBatch
from envace.runtime.decode import (
    DecodeGuide,
    DecodeRequest,
    OutputKey,
    decode,
)
from envace.runtime.kv import BatchedStreams

logger = logging.getLogger(__name__)


@dataclass
class _Episode:
    """Mutable state of one trajectory during a rollout (internal)."""

    key: int
    spec: EpisodeSpec
    example: Any
    sample: int
    generator: torch.Generator
    act: list[int] = field(default_factory=list)
    act_segments: list[Segment] = field(default_factory=list)
    reh: list[int] = field(default_factory=list)
    reh_segments: list[Segment] = field(default_factory=list)
    reh_generated: bool = False  # the REHEARSE stream ends with a generation (continuations apply)
    reh_history: list[Event] = field(default_factory=list)  # the REHEARSE context's events so far
    user_turn: int = 0
    steps_in_turn: int = 0
    act_text: str = ""
    calls: tuple[ToolCall, ...] = ()
    responses: list[Any] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    termination: Termination | None = None
    outputs: dict[Role, int] = field(default_factory=lambda: {r: 0 for r in Role})
    parse_errors: list[tuple[str, str]] = field(default_factory=list)
    executor: Executor | None = None
    real_calls: int = 0  # calls the real executor ran (the sample-efficiency count)

    @property
    def done(self) -> bool:
        return self.termination is not None


class RolloutRunner:
    """Plays ACT/REHEARSE episodes for one policy (``act_model``) and one response source."""

    def __init__(
        self,
        formatter: ChatFormatter,
        config: RolloutConfig,
        prompts: RolePrompts = DEFAULT_ROLE_PROMPTS,
        guide: DecodeGuide | None = None,
        precision: str = "fp32",
        turn_gate: TurnGate | None = None,
    ):
        self.precision = precision  # resolved ("bf16" | "fp32"): the caches' forwards run under it
        self.turn_gate = turn_gate
        self.fmt = formatter
        self.cfg = config
        self.prompts = prompts
        self.guide = guide
        self.end_of_turn = formatter.end_of_turn_token_ids[0]
        self.stop_ids = frozenset(formatter.end_of_turn_token_ids)
        pad = getattr(formatter.tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0

    # ---- public --------------------------------------------------------------------------------
    def run(
        self,
        specs: Sequence[EpisodeSpec],
        act_model: Any,
        responses: ResponseSource,
        *,
        seed: int = 0,
        step: int = 0,
        examples: Sequence[Any] | None = None,
    ) -> RolloutBatch:
        """K trajectories for each spec (``examples`` name the specs in seeds; default: their index)."""
        started = time.perf_counter()
        names = list(examples) if examples is not None else list(range(len(specs)))
        episodes = self._make_episodes(specs, names, responses, seed, step)
        self._counts: dict[str, Any] = {"forwards": 0, "fed": 0, "gen": {r: 0 for r in Role}}
        caches = self._prefill(specs, episodes, act_model, responses)
        while live := [e for e in episodes if not e.done]:
            self._act_phase(live, caches)
            self._response_phase([e for e in live if e.calls and not e.done], caches, responses)
            self._advance([e for e in live if not e.done], responses)
            self._retain(caches, [e for e in episodes if not e.done])
        fed = sum(c.fed_tokens for c in caches.values() if isinstance(c, BatchedStreams)) + self._counts["fed"]
        return RolloutBatch(
            trajectories=tuple(self._trajectory(e, responses) for e in episodes),
            seconds=time.perf_counter() - started,
            generated_tokens=dict(self._counts["gen"]),
            fed_tokens=fed,
            forwards=self._counts["forwards"],
        )

    # ---- setup ---------------------------------------------------------------------------------
    def _make_episodes(self, specs, names, responses: ResponseSource, seed: int, step: int) -> list[_Episode]:
        k = self.cfg.samples_per_prompt
        episodes = []
        for i, (spec, name) in enumerate(zip(specs, names)):
            act_text = self.fmt.render(act_messages(self.prompts, spec.system_prompt, spec.user_turns[0]), spec.tools)
            act_prompt = self.fmt.encode(act_text)
            reh_text = self._rehearse_base(spec) if responses.model is not None else ""
            reh_prompt = self.fmt.encode(reh_text) if reh_text else []
            for s in range(k):
                gen = torch.Generator().manual_seed(derive_seed(seed, step, name, s))
                ep = _Episode(key=i * k + s, spec=spec, example=name, sample=s, generator=gen)
                ep.act = list(act_prompt)
                ep.act_segments.append(Segment(tuple(act_prompt), text=act_text))
                ep.reh_history.append(Said("user", spec.user_turns[0]))
                if reh_prompt:
                    ep.reh = list(reh_prompt)
                    ep.reh_segments.append(Segment(tuple(reh_prompt), text=reh_text))
                if responses.executor_factory is not None:
                    ep.executor = responses.executor_factory(spec)
                episodes.append(ep)
        return episodes

    def _rehearse_base(self, spec: EpisodeSpec) -> str:
        return self.fmt.render([rehearse_system_message(self.prompts, spec.tools)], None, add_generation_prompt=False)

    def _prefill(self, specs, episodes, act_model, responses: ResponseSource) -> dict[Any, Any]:
        """One cache per role; with ``reuse_kv`` each prompt is prefilled once and expanded K times."""
        caches: dict[Role, Any] = {}
        k = self.cfg.samples_per_prompt
        models = {Role.ACT: act_model}
        if responses.model is not None:
            models[Role.REHEARSE] = responses.model
        for role, model in models.items():
            if not self.cfg.reuse_kv:
                caches[role] = model  # naive baseline: a fresh cache before every generation
                continue
            cache = BatchedStreams(
                model,
                [("prompt", i) for i in range(len(specs))],
                self.pad_id,
                precision=self.precision,
                share_prefixes=None if self.cfg.share_prompt_kv else False,
            )
            # all but the last prompt token: each sample feeds that one itself to get its own logits
            first = {("prompt", i): self._stream(episodes[i * k], role)[:-1] for i in range(len(specs))}
            cache.append(first)
            cache.repeat([[e.key for e in episodes[i * k : (i + 1) * k]] for i in range(len(specs))])
            caches[role] = cache
        return caches

    def _stream(self, ep: _Episode, role: Role) -> list[int]:
        return ep.act if role is Role.ACT else ep.reh

    def _retain(self, caches: dict[Any, Any], live: list[_Episode]) -> None:
        for role in Role:
            if isinstance(caches.get(role), BatchedStreams):
                caches[role].retain([e.key for e in live])

    # ---- generation ----------------------------------------------------------------------------
    def _generate(self, caches: dict[Any, Any], role: Role, episodes: list[_Episode]) -> list[DecodeRequest]:
        """One output of ``role`` for each episode (their streams end with a generation prompt)."""
        budget = self.cfg.max_new_tokens(role)
        requests = []
        for ep in episodes:
            room = self.cfg.max_stream_tokens - len(self._stream(ep, role))
            requests.append(
                DecodeRequest(
                    row=ep.key,
                    stream=self._stream(ep, role),
                    max_new_tokens=min(budget, room),
                    temperature=self.cfg.temperature(role),
                    generator=ep.generator,
                    output_key=OutputKey(ep.example, ep.sample, role, ep.outputs[role]),
                )
            )
        runnable = [r for r in requests if r.max_new_tokens > 0]
        if runnable:
            cache = caches[role]
            if not isinstance(cache, BatchedStreams):  # naive: re-encode the full streams
                cache = BatchedStreams(cache, [r.row for r in runnable], self.pad_id, precision=self.precision)
            before = cache.fed_tokens
            self._counts["forwards"] += decode(cache, runnable, self.stop_ids, self.guide)
            if not isinstance(caches[role], BatchedStreams):
                self._counts["fed"] += cache.fed_tokens - before
        for r in requests:
            self._counts["gen"][role] += len(r.tokens)
        return requests

    def _record(self, ep: _Episode, role: Role, req: DecodeRequest, trainable: bool) -> str | None:
        """Append one generated output to its stream; returns its text (None when it was cut off)."""
        stream, segments = (ep.act, ep.act_segments) if role is Role.ACT else (ep.reh, ep.reh_segments)
        if not req.tokens:  # no room left in the stream
            ep.termination = Termination.MAX_TOKENS
            return None
        ep.outputs[role] += 1
        # the decoder stops on an end token or at the budget: no stop reason to pass (envace.core.turn_end)
        ending = generation_ending(req.tokens, None, req.max_new_tokens, self.end_of_turn, self.stop_ids)
        tokens, logprobs = req.tokens, req.logprobs
        if ending is Ending.OTHER_END_TOKEN:  # not the template's: out of the output, its log-prob with it
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        text = self.fmt.decode(tokens[:-1] if ending is Ending.END_OF_TURN else tokens)
        stream.extend(tokens)
        segments.append(
            Segment(
                tuple(tokens),
                role=role if trainable else None,
                logprobs=tuple(logprobs) if trainable else None,
                text=text,
            )
        )
        if ending in (Ending.OTHER_END_TOKEN, Ending.SILENT_STOP):  # the stream ends as the template's would
            stream.append(self.end_of_turn)
            segments.append(Segment((self.end_of_turn,), text=self.fmt.decode([self.end_of_turn])))
        elif ending is not Ending.END_OF_TURN:
            ep.termination = Termination.MAX_TOKENS
            return None
        return text

    # ---- phases --------------------------------------------------------------------------------
    def _act_phase(self, live: list[_Episode], caches: dict[Any, Any]) -> None:
        for ep, req in zip(live, self._generate(caches, Role.ACT, live)):
            text = self._record(ep, Role.ACT, req, trainable=True)
            if text is None:
                continue
            parsed = parse_tool_calls(text)
            if not parsed.ok:
                ep.parse_errors.extend((Role.ACT.name, e.code.value) for e in parsed.errors)
                ep.termination = Termination.ACT_PARSE_ERROR
                continue
            ep.act_text = parsed.content
            if parsed.content.strip():
                ep.reh_history.append(Said("assistant", parsed.content))
            ep.calls = tuple(
                ToolCall(c.name, c.arguments, id=f"call_{ep.user_turn}_{ep.steps_in_turn}_{j}")
                for j, c in enumerate(parsed.calls)
            )
            ep.responses = []

    def _response_phase(self, episodes: list[_Episode], caches: dict[Any, Any], source: ResponseSource) -> None:
        if source.executor_factory is not None:
            for ep in episodes:
                ep.responses = [self._executed(ep, c) for c in ep.calls]
            return
        while waiting := [e for e in episodes if not e.done and self._answer_unknown_tools(e)]:
            for ep in waiting:
                self._append_call_message(ep, ep.calls[len(ep.responses)])
            for ep, req in zip(waiting, self._generate(caches, Role.REHEARSE, waiting)):
                text = self._record(ep, Role.REHEARSE, req, trainable=source.trainable)
                ep.reh_generated = True
                if text is None:
                    continue
                parsed = parse_rehearsal(text)
                if not parsed.ok:
                    ep.parse_errors.extend((Role.REHEARSE.name, e.code.value) for e in parsed.errors)
                    ep.termination = Termination.REHEARSE_PARSE_ERROR
                    continue
                ep.responses.append(parsed.result)
                ep.reh_history.append(Answered(ep.calls[len(ep.responses) - 1], parsed.result, text))

    @staticmethod
    def _executed(ep: _Episode, call: ToolCall) -> Any:
        """The unknown-tool rule's answer to ``call``, else the episode's executor's."""
        ruled = unknown_tool_response(call, ep.spec.tool_names)
        if ruled is not None:
            return ruled
        ep.real_calls += 1
        return ep.executor.execute(call)  # type: ignore[union-attr]

    def _answer_unknown_tools(self, ep: _Episode) -> bool:
        """Answer the episode's next calls by the unknown-tool rule while they name tools the task lacks: the
        call message and the answer go into the REHEARSE stream as scaffold. True when a call awaits REHEARSE."""
        while len(ep.responses) < len(ep.calls):
            call = ep.calls[len(ep.responses)]
            ruled = unknown_tool_response(call, ep.spec.tool_names)
            if ruled is None:
                return True
            self._append_call_message(ep, call)
            answer = Answered(call, ruled)
            tokens = self.fmt.encode(answer.answer_text()) + [self.fmt.end_of_turn_token_ids[0]]
            ep.reh.extend(tokens)
            ep.reh_segments.append(Segment(tuple(tokens), text=self.fmt.decode(tokens)))
            ep.reh_generated = True  # the stream ends as after a generation: the next call message continues it
            ep.responses.append(ruled)
            ep.reh_history.append(answer)
        return False

    def _append_call_message(self, ep: _Episode, call: ToolCall) -> None:
        """Append the call message (``rehearse_context.next_call_message``) and the generation prompt."""
        message = next_call_message(self.prompts, ep.spec.tools, ep.reh_history, call, self.cfg.rehearse_context_tokens)
        self._append(ep, Role.REHEARSE, stream_text(self.fmt, self.prompts, ep.spec.tools, message, ep.reh_generated))

    def _append(self, ep: _Episode, role: Role, text: str) -> None:
        tokens = self.fmt.encode(text)
        (ep.act if role is Role.ACT else ep.reh).extend(tokens)
        (ep.act_segments if role is Role.ACT else ep.reh_segments).append(Segment(tuple(tokens), text=text))

    def _advance(self, episodes: list[_Episode], source: ResponseSource) -> None:
        """Record the step, then append observations, the next user turn, or finish."""
        rehearsed = source.executor_factory is None and source.trainable
        for ep in episodes:
            if ep.calls:
                ep.turns.append(Turn(ep.act_text, ep.calls, tuple(ep.responses), rehearsed, ep.user_turn))
                ep.steps_in_turn += 1
                if ep.steps_in_turn >= self.cfg.max_steps_per_turn:
                    ep.termination = Termination.MAX_STEPS
                else:
                    self._append(
                        ep,
                        Role.ACT,
                        self.fmt.continuation(act_observation_messages(ep.calls, ep.responses), ep.spec.tools),
                    )
                ep.calls, ep.responses = (), []
                continue
            ep.turns.append(Turn(ep.act_text, user_turn=ep.user_turn))
            if ep.user_turn + 1 >= len(ep.spec.user_turns):
                ep.termination = Termination.FINAL_REPLY
                continue
            if self.turn_gate is not None and self.turn_gate(ep.spec, ep.turns, ep.user_turn) is False:
                ep.termination = Termination.REQUIRED_ITEM_FAILED
                continue
            ep.user_turn += 1
            ep.steps_in_turn = 0
            user = {"role": "user", "content": ep.spec.user_turns[ep.user_turn]}
            self._append(ep, Role.ACT, self.fmt.continuation([user], ep.spec.tools))
            ep.reh_history.append(Said("user", ep.spec.user_turns[ep.user_turn]))
        for ep in episodes:
            if not ep.done and len(ep.act) >= self.cfg.max_stream_tokens:
                ep.termination = Termination.MAX_TOKENS

    # ---- output --------------------------------------------------------------------------------
    def _trajectory(self, ep: _Episode, source: ResponseSource) -> Trajectory:
        streams = [Stream(Role.ACT, tuple(ep.act_segments))]
        if len(ep.reh_segments) > 1:
            streams.append(Stream(Role.REHEARSE, tuple(ep.reh_segments)))
        finals = {t.user_turn: t.act_text for t in ep.turns if not t.tool_calls}
        info = {
            "example": ep.example,
            "outputs": {r.name: n for r, n in ep.outputs.items()},
            "parse_errors": list(ep.parse_errors),
            "final_answers": [finals.get(t, "") for t in range(len(ep.spec.user_turns))],
            "rehearse_trainable": source.executor_factory is None and source.trainable,
            "real_env_calls": ep.real_calls,
        }
        if ep.executor is not None:
            info["final_state"] = ep.executor.state()
        return Trajectory(
            prompt_id=ep.spec.task_id,
            sample_index=ep.sample,
            streams=tuple(streams),
            turns=tuple(ep.turns),
            termination=ep.termination or Termination.ERROR,
            info=info,
        )
