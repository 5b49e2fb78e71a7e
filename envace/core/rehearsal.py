"""Test-time private rehearsal: the pure logic (SPEC §4). No I/O, no backends, no executors.

The controller that *runs* rehearsal lives in ``envace.rehearsal``; this module holds what can be
decided from text and records alone:

* ``RehearsalConfig`` — N attempts, ``parallel`` | ``sequential`` mode, ``task`` | ``turn`` scope,
  budgets, and the memory bound.
* ``RehearsalPrompts`` — the versioned templates (critique, history note for sequential attempts,
  summary, memory injection). The paper publishes none of these, so they are ours; each field is a
  ``str.format`` template whose placeholders are checked at construction so that a Hydra override with a
  typo fails at start-up, not mid-sweep.
* ``parse_critique`` — the self-critique wire format
  ``<critique>{"assessment": str, "success_likely": bool, "revision": str}</critique>``; never raises,
  returns structured error codes. A failed critique is recorded on the attempt and is not fatal.
* ``AttemptRecord`` and transcript rendering — what the critic, later sequential attempts and the
  summariser read.
* ``bound_memory`` — deterministic truncation of the rehearsal memory to a character and a token budget
  (longest prefix that fits together with a truncation marker, snapped back to a whitespace boundary).

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
import json
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envace.core.records import Termination, ToolCall, Turn
from envace.core.seeds import derive_seed as derive_seed  # re-exported; defined in core.seeds
from envace.core.wire import strip_think

PROMPTS_VERSION = "rehearsal-v1"


# The members' names are the strings written in conf/ (OmegaConf reads an enum by member name), so that
# envace.config_schema uses these enums as they are: one enum per concept.
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


# ---------------------------------------------------------------------------------------------
# configuration and prompts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBudget:
    """Upper bounds for the rehearsal memory; ``None`` disables a bound."""

    max_chars: int | None = 1200
    max_tokens: int | None = 256
    marker: str = " …[memory truncated]"

    def __post_init__(self) -> None:
        for name in ("max_chars", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"MemoryBudget.{name}={value}: must be >= 0 or None (no bound)")


@dataclass(frozen=True)
class RehearsalConfig:
    """How one task is rehearsed. ``n_attempts=0`` is plain evaluation (no rehearsal, no memory).

    The defaults are conf/rehearsal/default.yaml's (``envace.config.rehearsal_config`` builds this from a
    loaded config). Refused at construction, and only here (the config loader and the sweep build one per
    cell to check it): ``n_attempts < 0``, ``max_steps_per_turn < 1``, negative temperatures and
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


_CRITIQUE_SYSTEM = (
    "You review a private rehearsal of a tool-using assistant. The tool results in the rehearsal were "
    "imagined, not real. Judge whether the assistant's plan would complete the user's requests, and say "
    "concretely what to do differently. Answer with exactly one block:\n"
    '<critique>{{"assessment": "<what went right or wrong>", "success_likely": true or false, '
    '"revision": "<concrete advice for the real attempt>"}}</critique>'
)
_CRITIQUE_USER = "Task:\n{task}\n\nRehearsal transcript:\n{transcript}\n\nWrite the critique now."
_HISTORY_NOTE = (
    "Earlier private rehearsals of this task (tool results were imagined) and their critiques. "
    "Improve on them:\n{history}"
)
_SUMMARY_SYSTEM = (
    "You condense private rehearsals of a task into a short memory for the assistant that will now "
    "perform the task for real. Keep only actionable lessons: which tools and arguments to use, in what "
    "order, pitfalls to avoid. At most {max_words} words. Answer inside <memory>...</memory>."
)
_SUMMARY_USER = "Task:\n{task}\n\nRehearsals:\n{attempts}\n\nWrite the memory now."
_MEMORY_NOTE = "Private rehearsal notes (from imagined runs; the real environment has not been touched yet):\n{memory}"


_TEMPLATE_FIELDS: dict[str, set[str]] = {
    "critique_system": set(),
    "critique_user": {"task", "transcript"},
    "history_note": {"history"},
    "summary_system": {"max_words"},
    "summary_user": {"task", "attempts"},
    "memory_note": {"memory"},
}


@dataclass(frozen=True)
class RehearsalPrompts:
    """Versioned prompt templates of test-time rehearsal (``str.format`` fields are checked)."""

    version: str = PROMPTS_VERSION
    critique_system: str = _CRITIQUE_SYSTEM
    critique_user: str = _CRITIQUE_USER
    history_note: str = _HISTORY_NOTE
    summary_system: str = _SUMMARY_SYSTEM
    summary_user: str = _SUMMARY_USER
    memory_note: str = _MEMORY_NOTE
    memory_role: str = "user"

    def __post_init__(self) -> None:
        for name, required in _TEMPLATE_FIELDS.items():
            template = getattr(self, name)
            try:
                found = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as exc:
                raise ValueError(f"RehearsalPrompts.{name} ({self.version}) is not a format string: {exc}") from None
            if found != required:
                raise ValueError(
                    f"RehearsalPrompts.{name} ({self.version}) has placeholders {sorted(found)}; expected "
                    f"exactly {sorted(required)} (escape literal braces as '{{{{' and '}}}}')"
                )
        if self.memory_role not in ("user", "system"):
            raise ValueError(f"RehearsalPrompts.memory_role={self.memory_role!r}: use 'user' or 'system'")


# ---------------------------------------------------------------------------------------------
# critique wire format
# ---------------------------------------------------------------------------------------------


class CritiqueErrorCode(str, enum.Enum):
    EMPTY_OUTPUT = "EMPTY_OUTPUT"
    NO_CRITIQUE_TAG = "NO_CRITIQUE_TAG"
    TAG_MALFORMED = "TAG_MALFORMED"  # an opening tag without its closing tag
    JSON_DECODE_ERROR = "JSON_DECODE_ERROR"
    INVALID_JSON_TYPE = "INVALID_JSON_TYPE"  # the payload is not a JSON object
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_FIELD_TYPE = "INVALID_FIELD_TYPE"


@dataclass(frozen=True)
class CritiqueError:
    code: CritiqueErrorCode
    message: str


@dataclass(frozen=True)
class Critique:
    assessment: str
    success_likely: bool
    revision: str

    def to_json(self) -> dict[str, Any]:
        return {"assessment": self.assessment, "success_likely": self.success_likely, "revision": self.revision}


@dataclass(frozen=True)
class CritiqueParse:
    critique: Critique | None
    errors: tuple[CritiqueError, ...] = ()

    @property
    def ok(self) -> bool:
        return self.critique is not None and not self.errors


_OPEN, _CLOSE = "<critique>", "</critique>"
_BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False}


def _error(code: CritiqueErrorCode, message: str) -> CritiqueParse:
    return CritiqueParse(None, (CritiqueError(code, message),))


def _coerce_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _BOOL_WORDS.get(value.strip().lower())
    return None


def parse_critique(text: str) -> CritiqueParse:
    """Parse the first ``<critique>{json}</critique>`` block; never raises.

    ``success_likely`` accepts a JSON bool or the strings true/false/yes/no; the two text fields must be
    strings. Extra keys are ignored.
    """
    body = strip_think(text if isinstance(text, str) else "").strip()
    if not body:
        return _error(CritiqueErrorCode.EMPTY_OUTPUT, "the critique generation is empty")
    start = body.find(_OPEN)
    if start < 0:
        return _error(CritiqueErrorCode.NO_CRITIQUE_TAG, f"no {_OPEN} tag in the critique output")
    end = body.find(_CLOSE, start)
    if end < 0:
        return _error(CritiqueErrorCode.TAG_MALFORMED, f"{_OPEN} is never closed by {_CLOSE}")
    payload = body[start + len(_OPEN) : end].strip()
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return _error(CritiqueErrorCode.JSON_DECODE_ERROR, f"critique payload is not JSON: {exc}")
    if not isinstance(obj, dict):
        return _error(CritiqueErrorCode.INVALID_JSON_TYPE, f"critique payload is {type(obj).__name__}, not an object")
    missing = [k for k in ("assessment", "success_likely", "revision") if k not in obj]
    if missing:
        return _error(CritiqueErrorCode.MISSING_FIELD, f"critique lacks field(s) {missing}")
    likely = _coerce_bool(obj["success_likely"])
    if likely is None or not isinstance(obj["assessment"], str) or not isinstance(obj["revision"], str):
        return _error(
            CritiqueErrorCode.INVALID_FIELD_TYPE,
            "critique fields must be assessment: str, success_likely: bool, revision: str",
        )
    return CritiqueParse(Critique(obj["assessment"], likely, obj["revision"]))


def render_critique(critique: Critique) -> str:
    """The wire form ``parse_critique`` reads (used by scripted backends and few-shot prompts)."""
    return f"{_OPEN}{json.dumps(critique.to_json(), ensure_ascii=False)}{_CLOSE}"


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


# ---------------------------------------------------------------------------------------------
# rendering: task brief, transcripts, prompts
# ---------------------------------------------------------------------------------------------


def clip(text: str, max_chars: int) -> str:
    """Deterministic clip to ``max_chars`` characters with an ellipsis."""
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "…"


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def render_task_brief(context: RehearsalContext, value_chars: int) -> str:
    lines = [f"Instructions: {clip(context.system_prompt.strip(), 4 * value_chars)}"]
    for offset, text in enumerate(context.user_turns):
        lines.append(f"User request {context.first_turn_index + offset + 1}: {clip(text, value_chars)}")
    return "\n".join(lines)


def render_attempt_transcript(attempt: AttemptRecord, context: RehearsalContext, value_chars: int) -> str:
    """Compact, deterministic transcript of one imagined attempt."""
    lines: list[str] = []
    shown_turn = -1
    for turn in attempt.turns:
        if turn.user_turn != shown_turn:
            shown_turn = turn.user_turn
            rel = shown_turn - context.first_turn_index
            if 0 <= rel < len(context.user_turns):
                lines.append(f"[user {shown_turn + 1}] {clip(context.user_turns[rel], value_chars)}")
        if not turn.tool_calls:
            lines.append(f"[assistant reply] {clip(turn.act_text.strip(), value_chars)}")
            continue
        for call, response in zip(turn.tool_calls, turn.responses):
            lines.append(f"[call] {call.name}({clip(_compact(call.arguments), value_chars)})")
            lines.append(f"[imagined result] {clip(_compact(response), value_chars)}")
    lines.append(f"[ended: {attempt.termination.value}]")
    return "\n".join(lines)


def render_attempt_with_critique(attempt: AttemptRecord, context: RehearsalContext, value_chars: int) -> str:
    head = f"Attempt {attempt.index + 1}:\n{render_attempt_transcript(attempt, context, value_chars)}"
    if attempt.critique is None:
        codes = ",".join(e.code.value for e in attempt.critique_errors) or "none"
        return f"{head}\nCritique: unavailable ({codes})"
    c = attempt.critique
    verdict = "likely success" if c.success_likely else "likely failure"
    return f"{head}\nCritique ({verdict}): {clip(c.assessment, value_chars)}\nRevision: {clip(c.revision, value_chars)}"


def critique_messages(
    prompts: RehearsalPrompts, context: RehearsalContext, attempt: AttemptRecord, value_chars: int
) -> tuple[dict[str, Any], ...]:
    transcript = render_attempt_transcript(attempt, context, value_chars)
    task = render_task_brief(context, value_chars)
    return (
        {"role": "system", "content": prompts.critique_system.format()},
        {"role": "user", "content": prompts.critique_user.format(task=task, transcript=transcript)},
    )


def history_message(
    prompts: RehearsalPrompts,
    context: RehearsalContext,
    previous: Sequence[AttemptRecord],
    value_chars: int,
) -> dict[str, Any] | None:
    """The note a sequential attempt k reads: attempts 1..k-1 with critiques (None for k = 1)."""
    if not previous:
        return None
    history = "\n\n".join(render_attempt_with_critique(a, context, value_chars) for a in previous)
    return {"role": prompts.memory_role, "content": prompts.history_note.format(history=history)}


def summary_word_limit(budget: MemoryBudget) -> int:
    limits = [150]
    if budget.max_tokens is not None:
        limits.append(max(1, (budget.max_tokens * 2) // 3))
    if budget.max_chars is not None:
        limits.append(max(1, budget.max_chars // 6))
    return min(limits)


def summary_messages(
    prompts: RehearsalPrompts,
    context: RehearsalContext,
    attempts: Sequence[AttemptRecord],
    budget: MemoryBudget,
    value_chars: int,
) -> tuple[dict[str, Any], ...]:
    rendered = "\n\n".join(render_attempt_with_critique(a, context, value_chars) for a in attempts)
    task = render_task_brief(context, value_chars)
    return (
        {"role": "system", "content": prompts.summary_system.format(max_words=summary_word_limit(budget))},
        {"role": "user", "content": prompts.summary_user.format(task=task, attempts=rendered)},
    )


def extract_memory_text(text: str) -> str:
    """The summariser's memory: the ``<memory>`` block when present, else the whole (think-free) text."""
    body = strip_think(text if isinstance(text, str) else "")
    start = body.find("<memory>")
    if start >= 0:
        body = body[start + len("<memory>") :]
        end = body.find("</memory>")
        body = body if end < 0 else body[:end]
    return body.strip()


def structured_memory(attempts: Sequence[AttemptRecord]) -> str:
    """Deterministic memory from the attempts and critiques (no generation)."""
    lines = []
    for a in attempts:
        calls = [c.name for t in a.turns for c in t.tool_calls]
        verdict = (
            "unreviewed"
            if a.critique is None
            else ("likely success" if a.critique.success_likely else "likely failure")
        )
        line = f"Attempt {a.index + 1} ({verdict}): calls {', '.join(calls) or 'none'}; ended {a.termination.value}."
        if a.critique is not None and a.critique.revision.strip():
            line += f" Advice: {a.critique.revision.strip()}"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the memory and its bound
# ---------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def count_approx_tokens(text: str) -> int:
    """Words plus punctuation marks: a deterministic, tokenizer-free token estimate."""
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class RehearsalMemory:
    text: str
    source: str  # "policy" | "structured" | "structured_fallback" | "none"
    truncated: bool = False
    source_chars: int = 0  # length before truncation

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "source": self.source,
            "truncated": self.truncated,
            "source_chars": self.source_chars,
        }


def _fits(text: str, budget: MemoryBudget, count_tokens: Callable[[str], int]) -> bool:
    if budget.max_chars is not None and len(text) > budget.max_chars:
        return False
    return budget.max_tokens is None or count_tokens(text) <= budget.max_tokens


def _longest_fitting_prefix(text: str, budget: MemoryBudget, count_tokens: Callable[[str], int]) -> int:
    lo, hi = 0, len(text)  # invariant: prefix of length lo fits (checked by the caller for lo = 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(text[:mid].rstrip() + budget.marker, budget, count_tokens):
            lo = mid
        else:
            hi = mid - 1
    cut = max(text.rfind(" ", 0, lo + 1), text.rfind("\n", 0, lo + 1)) if lo < len(text) else lo
    if cut > lo // 2:  # snap to a word boundary unless that loses more than half
        lo = cut
    while lo > 0 and not _fits(text[:lo].rstrip() + budget.marker, budget, count_tokens):
        lo -= 1  # guards against counters that are not monotone in the prefix length
    return lo


def bound_memory(
    text: str,
    budget: MemoryBudget,
    source: str,
    count_tokens: Callable[[str], int] = count_approx_tokens,
) -> RehearsalMemory:
    """Truncate ``text`` deterministically so that it fits ``budget`` (marker included when cut)."""
    text = text.strip()
    if _fits(text, budget, count_tokens):
        return RehearsalMemory(text, source, truncated=False, source_chars=len(text))
    if not _fits(budget.marker.strip(), budget, count_tokens):
        return RehearsalMemory("", source, truncated=True, source_chars=len(text))
    if not _fits(budget.marker, budget, count_tokens):
        return RehearsalMemory(budget.marker.strip(), source, truncated=True, source_chars=len(text))
    keep = _longest_fitting_prefix(text, budget, count_tokens)
    bounded = (text[:keep].rstrip() + budget.marker).strip()
    return RehearsalMemory(bounded, source, truncated=True, source_chars=len(text))


def memory_message(prompts: RehearsalPrompts, memory: RehearsalMemory) -> dict[str, Any] | None:
    """The note injected into the committed execution (None when there is no memory)."""
    if not memory.text:
        return None
    return {"role": prompts.memory_role, "content": prompts.memory_note.format(memory=memory.text)}
