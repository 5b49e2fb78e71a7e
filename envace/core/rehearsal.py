"""Test-time private rehearsal: the pure logic (docs/method.md §12). No I/O, no backends, no executors.

The controller that *runs* rehearsal lives in ``envace.rehearsal``; the pure pieces it uses are:

* ``RehearsalConfig`` (here) — N attempts, ``parallel`` | ``sequential`` mode, ``task`` | ``turn`` scope,
  budgets, and the memory bound; ``RehearsalContext`` (what rehearsal may see) and ``AttemptRecord``
  (one imagined attempt and its critique).
* ``envace.core.rehearsal_prompts`` — the versioned prompt templates and transcript rendering.
* ``envace.core.critique`` — the self-critique wire format and its parser.
* ``envace.core.rehearsal_memory`` — the memory and its deterministic character/token bound.

Design choices (the paper leaves them open, §4.3):
* Scope ``turn`` (default) rehearses each user turn just before it is executed, from the real
  conversation so far (which the committed execution has already observed): rehearsal before user turn
  t sees user turns 0..t only, as a benchmark that reveals its requests one by one would allow. Scope
  ``task`` rehearses the whole replayed dialogue once before the first real call and injects the memory
  before the first user turn; its rehearsal, and so the committed execution through the memory, sees
  user turns the benchmark reveals only later. It is kept as an explicit option and reports label it
  ``SCOPE_LABELS["task"]`` ("sees future turns").
* Attempts are sampled: ``act_temperature`` defaults to 0.7 and every attempt has its own seed, so
  ``parallel`` attempts are independent draws. ``parallel`` with ``n_attempts > 1`` at
  ``act_temperature == 0`` is refused at construction: greedy decoding of one prompt gives N copies of
  the first action, and an attempt that answers without a tool call is then the same N times, whatever
  the REHEARSE temperature (so a sampling rehearser alone does not make attempts independent).
  ``sequential`` at temperature 0 is allowed (attempt k's prompt holds attempts 1..k-1). The imagined
  tool responses default to temperature 0 (the rehearser's most likely answer), and critiques and the
  summary are always greedy.
* Memory is injected as one extra message (role ``RehearsalPrompts.memory_role``, default ``user``)
  immediately before the user turn it concerns, so chat templates that allow a system message only in
  first position keep working.
* Summariser ``policy`` (default, as the paper) asks the acting policy to write the memory; when its
  output is empty the deterministic ``structured`` memory (built from the critiques) is used instead and
  the fallback is recorded. ``structured`` skips the summary generation entirely.
* Token counts default to ``count_approx_tokens`` (words and punctuation marks, an over-estimate of
  BPE tokens for English); pass a tokenizer-backed counter for exact budgets.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envace.core.critique import Critique, CritiqueError, CritiqueParse
from envace.core.records import Termination, ToolCall, Turn
from envace.core.rehearsal_memory import MemoryBudget


# The members' names are the strings written in conf/ (OmegaConf reads an enum by member name), so that
# envace.config.schema uses these enums as they are: one enum per concept.
class RehearsalMode(str, enum.Enum):
    parallel = "parallel"  # independent attempts from the same context
    sequential = "sequential"  # attempt k sees attempts 1..k-1 and their critiques


class RehearsalScope(str, enum.Enum):
    task = "task"  # rehearse the whole dialogue once, before any real call (sees future user turns)
    turn = "turn"  # rehearse each user turn right before executing it (default)


# how reports name a scope; ``task`` rehearses user turns the committed execution has not reached yet
SCOPE_LABELS = {RehearsalScope.turn.value: "turn", RehearsalScope.task.value: "task (sees future turns)"}


def scope_label(scope: RehearsalScope | str) -> str:
    """The report label of ``scope`` (``"task (sees future turns)"`` for task scope); others unchanged."""
    value = scope.value if isinstance(scope, RehearsalScope) else str(scope)
    return SCOPE_LABELS.get(value, value)


class Summarizer(str, enum.Enum):
    policy = "policy"  # the acting policy writes the memory (structured fallback when empty)
    structured = "structured"  # deterministic memory from the critiques, no generation


@dataclass(frozen=True)
class RehearsalConfig:
    """How one task is rehearsed. ``n_attempts=0`` is plain evaluation (no rehearsal, no memory).

    The pipeline builds it from the config with every shared field set (``envace.config.load.rehearsal_config``);
    the defaults serve code that builds one by hand and equal conf/rehearsal/default.yaml's values (tested in
    tests/unit/config/test_schema_defaults.py). Refused at construction, and only here (the config loader and the
    sweep build one per cell to check it): ``n_attempts < 0``, ``max_steps_per_turn < 1``, negative temperatures and
    ``mode=parallel`` with ``n_attempts > 1`` at ``act_temperature == 0`` (N identical attempts; see the
    module docstring).
    """

    n_attempts: int = 2
    mode: RehearsalMode = RehearsalMode.parallel
    scope: RehearsalScope = RehearsalScope.turn
    summarizer: Summarizer = Summarizer.policy
    max_steps_per_turn: int = 4
    act_max_new_tokens: int = 64
    rehearse_max_new_tokens: int = 64
    critique_max_new_tokens: int = 64
    summary_max_new_tokens: int = 64
    act_temperature: float = 0.7  # > 0 so that parallel attempts differ (each has its own seed)
    rehearse_temperature: float = 0.0
    transcript_value_chars: int = 300  # per call/response/reply in transcripts shown to the critic
    memory: MemoryBudget = field(default_factory=MemoryBudget)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_attempts < 0:
            raise ValueError(f"RehearsalConfig.n_attempts={self.n_attempts}: must be >= 0 (0 = no rehearsal)")
        if self.max_steps_per_turn < 1:
            raise ValueError(f"RehearsalConfig.max_steps_per_turn={self.max_steps_per_turn}: must be >= 1")
        # accept plain strings from configs
        object.__setattr__(self, "mode", RehearsalMode(self.mode))
        object.__setattr__(self, "scope", RehearsalScope(self.scope))
        object.__setattr__(self, "summarizer", Summarizer(self.summarizer))
        for name in ("act_temperature", "rehearse_temperature"):
            if getattr(self, name) < 0:
                raise ValueError(f"RehearsalConfig.{name}={getattr(self, name)}: must be >= 0 (0 = greedy)")
        problem = identical_attempts_problem(self.n_attempts, self.mode, self.act_temperature)
        if problem:
            raise ValueError(f"RehearsalConfig: {problem}")


def identical_attempts_problem(n_attempts: int, mode: RehearsalMode | str, act_temperature: float) -> str | None:
    """Why ``n_attempts`` attempts in ``mode`` at ``act_temperature`` would all be the same (None when
    they would not): parallel attempts share one prompt, so at temperature 0 the policy decodes them
    identically. The message names the config keys and how to fix it."""
    if RehearsalMode(mode) is not RehearsalMode.parallel or n_attempts <= 1 or act_temperature > 0:
        return None
    return (
        f"rehearsal.act_temperature={act_temperature} with mode=parallel and n_attempts={n_attempts} gives "
        f"{n_attempts} identical attempts (greedy decoding of the same prompt); set rehearsal.act_temperature "
        "> 0 (default 0.7) or use mode=sequential"
    )


# ---------------------------------------------------------------------------------------------
# what rehearsal may see, and what one attempt produced
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RehearsalContext:
    """Everything private rehearsal is allowed to see — by construction no executor, no gold data.

    ``history``: real conversation messages (after the system message) that precede the first rehearsed
    user turn (empty in ``task`` scope); ``events``: the same conversation as the REHEARSE role sees it
    (real calls with their real responses among them; never anything of the turns rehearsed).
    """

    task_id: str
    system_prompt: str
    tools: tuple[dict[str, Any], ...]
    user_turns: tuple[str, ...]
    first_turn_index: int = 0
    history: tuple[dict[str, Any], ...] = ()
    # the ``history`` conversation as envace.core.rehearse_context events: what REHEARSE conditions on
    events: tuple[Any, ...] = ()
    # which repetition of the task this is in a multi-trial evaluation (0 = the first): the attempts',
    # critiques' and summary's seeds follow it, so trials rehearse independently
    trial: int = 0


@dataclass(frozen=True)
class AttemptRecord:
    """One imagined ACT/REHEARSE trajectory and its self-critique (``index`` is 0-based)."""

    index: int
    turns: tuple[Turn, ...]
    final_answers: tuple[str, ...]
    termination: Termination
    critique: Critique | None = None
    critique_text: str = ""
    critique_errors: tuple[CritiqueError, ...] = ()
    act_parse_failures: int = 0
    rehearse_parse_failures: int = 0

    def with_critique(self, text: str, parsed: CritiqueParse) -> AttemptRecord:
        return AttemptRecord(
            index=self.index,
            turns=self.turns,
            final_answers=self.final_answers,
            termination=self.termination,
            critique=parsed.critique,
            critique_text=text,
            critique_errors=parsed.errors,
            act_parse_failures=self.act_parse_failures,
            rehearse_parse_failures=self.rehearse_parse_failures,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "turns": [turn_to_json(t) for t in self.turns],
            "final_answers": list(self.final_answers),
            "termination": self.termination.value,
            "critique": None if self.critique is None else self.critique.to_json(),
            "critique_text": self.critique_text,
            "critique_errors": [{"code": e.code.value, "message": e.message} for e in self.critique_errors],
            "act_parse_failures": self.act_parse_failures,
            "rehearse_parse_failures": self.rehearse_parse_failures,
        }


def turn_to_json(turn: Turn) -> dict[str, Any]:
    """Plain-JSON form of a core ``Turn`` (calls as dicts)."""
    return {
        "act_text": turn.act_text,
        "tool_calls": [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in turn.tool_calls],
        "responses": list(turn.responses),
        "rehearsed": turn.rehearsed,
        "user_turn": turn.user_turn,
        **({"stand_ins": list(turn.stand_ins)} if turn.stand_ins else {}),
    }


def turn_from_json(d: Mapping[str, Any]) -> Turn:
    return Turn(
        act_text=d["act_text"],
        tool_calls=tuple(ToolCall(**c) for c in d.get("tool_calls", [])),
        responses=tuple(d.get("responses", [])),
        rehearsed=bool(d.get("rehearsed", True)),
        user_turn=int(d.get("user_turn", 0)),
        stand_ins=tuple(int(i) for i in d.get("stand_ins", ())),
    )
