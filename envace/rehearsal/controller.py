"""The private-rehearsal controller (docs/method.md §12): N imagined attempts, self-critiques, one bounded memory.

``rehearse(context, ...)`` is a generation program over two seats — ``ACTOR`` (the policy: acts in the
attempts, critiques them, writes the memory) and ``REHEARSER`` (imagines the tool responses; may be a
different model, e.g. the SFT-start model as the paper's control). Its inputs are a
``RehearsalContext`` (instructions, tools, user turns, the real conversation so far) and configs: it
never receives an environment, an executor or a task with gold data, so it cannot reach real state. The
one exception is explicit: the oracle rehearser's ``settings.responders`` answer on a *sandboxed copy*
of the environment (``envace.rehearsal.oracle``), never the committed execution's executor.

* ``parallel``: the N attempts (each followed by its critique) run in lock-step from the same context,
  their generations batched; attempts differ through their seeds (sampling temperature > 0).
* ``sequential``: attempt k starts with a note holding attempts 1..k-1 and their critiques.
* A critique that does not parse is recorded on its attempt (error codes, raw text) and rehearsal goes on.
* The memory is written by the policy (``Summarizer.policy``) or built from the critiques
  (``Summarizer.structured``; also the fallback when the policy's summary is empty), then bounded by
  ``core.rehearsal_memory.bound_memory``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from envace.core.critique import parse_critique
from envace.core.prompts import DEFAULT_ROLE_PROMPTS, RolePrompts
from envace.core.rehearsal import AttemptRecord, RehearsalConfig, RehearsalContext, RehearsalMode, Summarizer
from envace.core.rehearsal_memory import RehearsalMemory, bound_memory, count_approx_tokens
from envace.core.rehearsal_prompts import (
    RehearsalPrompts,
    critique_messages,
    extract_memory_text,
    history_message,
    structured_memory,
    summary_messages,
)
from envace.core.rehearse_context import DEFAULT_CONTEXT_TOKENS
from envace.core.seeds import derive_seed
from envace.evaluation.episode import ActLoopConfig, Dialogue, TurnView, run_act_loop, trial_tag
from envace.evaluation.programs import ACTOR, GenerationCall, GenerationLedger, Program, gather, generate_one
from envace.inference.base import ChatRequest
from envace.rehearsal.imagined import RehearserResponder

TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class RehearsalOutcome:
    """What rehearsal produced before one committed (part of an) execution."""

    turn_index: int  # first user turn rehearsed
    attempts: tuple[AttemptRecord, ...]
    memory: RehearsalMemory
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "turn_index": self.turn_index,
            "attempts": [a.to_json() for a in self.attempts],
            "memory": self.memory.to_json(),
            "wall_s": self.wall_s,
        }


@dataclass(frozen=True)
class RehearsalSettings:
    """Everything ``rehearse`` needs besides the context (one object to pass around)."""

    config: RehearsalConfig = RehearsalConfig()
    prompts: RehearsalPrompts = RehearsalPrompts()
    role_prompts: RolePrompts = DEFAULT_ROLE_PROMPTS
    count_tokens: TokenCounter = count_approx_tokens
    context_tokens: int = DEFAULT_CONTEXT_TOKENS  # REHEARSE conversation per call message (as in training)
    # True: a sandboxed copy of the real environment answers the attempts (the oracle rehearser,
    # ``envace.rehearsal.oracle``); ``responders`` is then set per task by ``rehearsed_episode``
    sandbox: bool = False
    responders: Callable[[RehearsalContext], Any] | None = None  # one responder per attempt; None: REHEARSER seat


def _seed_tag(context: RehearsalContext) -> str:
    """The task part of a rehearsal seed: the task id, tagged with the trial after the first."""
    return trial_tag(context.task_id, context.trial)


def _attempt(
    context: RehearsalContext,
    index: int,
    previous: tuple[AttemptRecord, ...],
    settings: RehearsalSettings,
    ledger: GenerationLedger,
) -> Program[AttemptRecord]:
    """One imagined ACT/REHEARSE trajectory followed by its self-critique."""
    cfg = settings.config
    seed_parts = (cfg.seed, _seed_tag(context), "attempt", context.first_turn_index, index)
    responder = (
        settings.responders(context)
        if settings.responders is not None
        else RehearserResponder(
            context.tools,
            settings.role_prompts,
            ledger,
            max_new_tokens=cfg.rehearse_max_new_tokens,
            temperature=cfg.rehearse_temperature,
            seed_parts=seed_parts,
            context_tokens=settings.context_tokens,
        )
    )
    loop_config = ActLoopConfig(
        max_steps_per_turn=cfg.max_steps_per_turn,
        max_new_tokens=cfg.act_max_new_tokens,
        temperature=cfg.act_temperature,
        seed=derive_seed(*seed_parts),
        role_prompts=settings.role_prompts,
    )
    note = history_message(settings.prompts, context, previous, cfg.transcript_value_chars)

    def history_hook(view: TurnView) -> Program[tuple[dict[str, Any], ...]]:
        return (note,) if note is not None and view.turn_index == context.first_turn_index else ()
        yield []  # pragma: no cover - makes this function a generator

    dialogue = Dialogue(
        context.task_id,
        context.system_prompt,
        context.tools,
        context.user_turns,
        context.first_turn_index,
        context.history,
        context.events,
    )
    loop = yield from run_act_loop(
        dialogue,
        responder,
        loop_config,
        ledger,
        purpose="rehearsal_act",
        seed_tag=f"attempt{index}",
        turn_hook=history_hook,
    )
    attempt = AttemptRecord(
        index=index,
        turns=loop.turns,
        final_answers=loop.final_answers,
        termination=loop.termination,
        act_parse_failures=loop.parse_failures,
        rehearse_parse_failures=loop.responder_failures,
    )
    return (yield from _critique(context, attempt, settings, ledger))


def _critique(
    context: RehearsalContext, attempt: AttemptRecord, settings: RehearsalSettings, ledger: GenerationLedger
) -> Program[AttemptRecord]:
    cfg = settings.config
    request = ChatRequest(
        messages=critique_messages(settings.prompts, context, attempt, cfg.transcript_value_chars),
        temperature=0.0,
        max_new_tokens=cfg.critique_max_new_tokens,
        seed=derive_seed(cfg.seed, _seed_tag(context), "critique", context.first_turn_index, attempt.index),
    )
    output = yield from generate_one(GenerationCall(ACTOR, "critique", request), ledger)
    return attempt.with_critique(output.text, parse_critique(output.text))


def _summarise(
    context: RehearsalContext,
    attempts: tuple[AttemptRecord, ...],
    settings: RehearsalSettings,
    ledger: GenerationLedger,
) -> Program[RehearsalMemory]:
    cfg = settings.config
    if cfg.summarizer is Summarizer.structured:
        return bound_memory(structured_memory(attempts), cfg.memory, "structured", settings.count_tokens)
    request = ChatRequest(
        messages=summary_messages(settings.prompts, context, attempts, cfg.memory, cfg.transcript_value_chars),
        temperature=0.0,
        max_new_tokens=cfg.summary_max_new_tokens,
        seed=derive_seed(cfg.seed, _seed_tag(context), "summary", context.first_turn_index),
    )
    output = yield from generate_one(GenerationCall(ACTOR, "summary", request), ledger)
    text = extract_memory_text(output.text)
    if not text:
        return bound_memory(structured_memory(attempts), cfg.memory, "structured_fallback", settings.count_tokens)
    return bound_memory(text, cfg.memory, "policy", settings.count_tokens)


def rehearse(
    context: RehearsalContext, settings: RehearsalSettings, ledger: GenerationLedger
) -> Program[RehearsalOutcome]:
    """N private attempts (parallel or sequential), their critiques, and the bounded memory."""
    start = time.perf_counter()
    n = settings.config.n_attempts
    if n == 0:
        return RehearsalOutcome(context.first_turn_index, (), RehearsalMemory("", "none"), 0.0)
    if settings.config.mode is RehearsalMode.parallel:
        attempts = tuple((yield from gather([_attempt(context, i, (), settings, ledger) for i in range(n)])))
    else:
        done: list[AttemptRecord] = []
        for i in range(n):
            done.append((yield from _attempt(context, i, tuple(done), settings, ledger)))
        attempts = tuple(done)
    memory = yield from _summarise(context, attempts, settings, ledger)
    return RehearsalOutcome(context.first_turn_index, attempts, memory, time.perf_counter() - start)


def context_for_turn(base: RehearsalContext, view: TurnView, whole_task: bool) -> RehearsalContext:
    """The context of a rehearsal started before user turn ``view.turn_index`` of a committed episode.

    ``whole_task``: rehearse every remaining user turn (task scope) instead of only this one.
    """
    turns = base.user_turns[view.turn_index :] if whole_task else base.user_turns[view.turn_index : view.turn_index + 1]
    return replace(
        base,
        user_turns=turns,
        first_turn_index=view.turn_index,
        history=view.conversation,
        events=base.events + view.events,
    )
