"""World-model fidelity (docs/method.md §13): how well the REHEARSE role predicts the real environment.

For every call a policy made in real episodes (each recorded with its real response), the REHEARSE role
(same backend or any other, REHEARSE role prompts) is asked for the response, teacher-forced:

* the request is ``envace.core.rehearse_context.rehearse_context`` — the layout the REHEARSE role is
  trained on — over the record's real history up to the call: the user turns so far, the agent's visible
  text, and every earlier call of the record with its *real* response (nothing of later turns: no
  future ground truth, docs/method.md §2);
* then the call itself.

Comparisons (real scalars are wrapped as ``{"result": v}`` first, as the rehearsal format requires):

* exact match — canonical JSON (sorted keys, no whitespace) equal;
* field F1 — both values flattened to ``path → canonical leaf`` pairs (``$.a.b[0]``; empty containers
  are leaves), F1 of the two pair sets;
* error agreement — both or neither are errors (an object with a non-empty ``"error"`` key).

Responses a responder made up in place of the real executor's (``Turn.stand_ins``, e.g. FinMCP replay's
NOT_RECORDED errors and simulated answers) are neither probed nor shown as examples or history. Calls to
a tool the task does not offer are not probed either: every loop answers them by rule
(``envace.core.unknown_tool``), never the REHEARSE role; they stay in the history.

A prediction that does not parse (or whose generation failed) scores 0 on all three and is counted in
``parse_failure_rate``. Reported overall (micro-averaged over calls) and per tool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm.auto import tqdm

from envace.core.conversation import is_error_response
from envace.core.env import Task
from envace.core.prompts import DEFAULT_ROLE_PROMPTS, RolePrompts
from envace.core.records import ToolCall, tool_schema_name
from envace.core.rehearse_context import DEFAULT_CONTEXT_TOKENS, conversation_events, rehearse_context
from envace.core.seeds import derive_seed
from envace.core.unknown_tool import unknown_tool_response
from envace.core.wire import as_result_object, parse_rehearsal
from envace.evaluation.programs import REHEARSER, GenerationCall, dispatch
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend, ChatRequest


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _child(prefix: str, key: str) -> str:
    plain = key.isidentifier()
    return f"{prefix}.{key}" if plain else f"{prefix}[{json.dumps(key, ensure_ascii=False)}]"


def flatten_json(value: Any, prefix: str = "$") -> dict[str, str]:
    """``path → canonical JSON of the leaf``; empty objects/arrays are leaves (``{}``, ``[]``)."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key in sorted(value, key=str):
            out.update(flatten_json(value[key], _child(prefix, str(key))))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(flatten_json(item, f"{prefix}[{i}]"))
        return out
    return {prefix: canonical_json(value)}


def field_f1(predicted: Any, real: Any) -> float:
    """F1 between the flattened (path, value) pairs of two JSON values."""
    pred, gold = set(flatten_json(predicted).items()), set(flatten_json(real).items())
    hit = len(pred & gold)
    if hit == 0:
        return 0.0
    precision, recall = hit / len(pred), hit / len(gold)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class FidelityPair:
    """One call: the real response, the rehearsed one (None when unparseable) and their scores."""

    task_id: str
    tool: str
    arguments: dict[str, Any]
    real: Any
    predicted: Any | None
    exact: float
    f1: float
    error_agreement: float
    parse_errors: tuple[str, ...] = ()


def compare_responses(predicted: Any | None, real: Any) -> tuple[float, float, float]:
    """(exact match, field F1, error agreement) of a prediction against the real response."""
    if predicted is None:
        return 0.0, 0.0, 0.0
    real = as_result_object(real)
    exact = 1.0 if canonical_json(predicted) == canonical_json(real) else 0.0
    agree = 1.0 if is_error_response(predicted) == is_error_response(real) else 0.0
    return exact, field_f1(predicted, real), agree


@dataclass(frozen=True)
class FidelityStats:
    n: int
    exact_match: float
    field_f1: float
    error_agreement: float
    parse_failure_rate: float

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "exact_match": self.exact_match,
            "field_f1": self.field_f1,
            "error_agreement": self.error_agreement,
            "parse_failure_rate": self.parse_failure_rate,
        }


def summarize_pairs(pairs: Sequence[FidelityPair]) -> FidelityStats:
    n = len(pairs)
    if n == 0:
        return FidelityStats(0, 0.0, 0.0, 0.0, 0.0)
    return FidelityStats(
        n=n,
        exact_match=sum(p.exact for p in pairs) / n,
        field_f1=sum(p.f1 for p in pairs) / n,
        error_agreement=sum(p.error_agreement for p in pairs) / n,
        parse_failure_rate=sum(1 for p in pairs if p.predicted is None) / n,
    )


@dataclass(frozen=True)
class FidelityReport:
    overall: FidelityStats
    per_tool: dict[str, FidelityStats] = field(default_factory=dict)
    pairs: tuple[FidelityPair, ...] = ()

    def flat(self, prefix: str = "fidelity/") -> dict[str, float]:
        out = {f"{prefix}{k}": float(v) for k, v in self.overall.to_json().items()}
        for tool, stats in sorted(self.per_tool.items()):
            out.update({f"{prefix}tool/{tool}/{k}": float(v) for k, v in stats.to_json().items()})
        return out


def build_report(pairs: Sequence[FidelityPair]) -> FidelityReport:
    tools: dict[str, list[FidelityPair]] = {}
    for p in pairs:
        tools.setdefault(p.tool, []).append(p)
    return FidelityReport(summarize_pairs(pairs), {t: summarize_pairs(ps) for t, ps in tools.items()}, tuple(pairs))


@dataclass(frozen=True)
class _Probe:
    task_id: str
    call: ToolCall
    real: Any
    request: ChatRequest


def _record_probes(
    record: EpisodeRecord,
    task: Task,
    prompts: RolePrompts,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> list[_Probe]:
    """One probe per real (non-stand-in) call of ``record`` to an offered tool, in conversation order."""
    probes: list[_Probe] = []
    tool_names = tuple(tool_schema_name(t) for t in task.tools)
    for k, turn in enumerate(record.turns):
        for j, (call, real) in enumerate(zip(turn.tool_calls, turn.responses)):
            if j in turn.stand_ins or unknown_tool_response(call, tool_names) is not None:
                continue
            partial = replace(turn, tool_calls=turn.tool_calls[:j], responses=turn.responses[:j])
            history = conversation_events(
                task.user_turns, [*record.turns[:k], partial], upto_turn=turn.user_turn, skip_stand_ins=True
            )
            request = ChatRequest(
                messages=tuple(rehearse_context(prompts, task.tools, history, call, context_tokens)),
                tools=None,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                seed=derive_seed(seed, record.task_id, "fidelity", len(probes)),
            )
            probes.append(_Probe(record.task_id, call, real, request))
    return probes


def measure_fidelity(
    backend: ChatBackend,
    records: Sequence[EpisodeRecord],
    tasks: Sequence[Task],
    *,
    role_prompts: RolePrompts = DEFAULT_ROLE_PROMPTS,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> FidelityReport:
    """Ask ``backend`` (REHEARSE role) for the response of every real call in ``records`` and compare."""
    by_id = {t.task_id: t for t in tasks}
    probes: list[_Probe] = []
    for record in records:
        if record.crashed:
            continue
        if record.task_id not in by_id:
            raise KeyError(f"measure_fidelity: record of task {record.task_id!r} has no matching task; pass its Task")
        probes.extend(
            _record_probes(
                record, by_id[record.task_id], role_prompts, max_new_tokens, temperature, seed, context_tokens
            )
        )
    pairs: list[FidelityPair] = []
    for lo in tqdm(range(0, len(probes), batch_size), desc="fidelity", disable=not progress, leave=False):
        chunk = probes[lo : lo + batch_size]
        replies = dispatch([GenerationCall(REHEARSER, "fidelity", p.request) for p in chunk], {REHEARSER: backend})
        for probe, reply in zip(chunk, replies):
            if reply.output is None:
                predicted, codes = None, ("GENERATION_ERROR",)
            else:
                parsed = parse_rehearsal(reply.output.text)
                predicted, codes = parsed.result, tuple(e.code.value for e in parsed.errors)
            exact, f1, agree = compare_responses(predicted, probe.real)
            pairs.append(
                FidelityPair(
                    probe.task_id,
                    probe.call.name,
                    dict(probe.call.arguments),
                    probe.real,
                    predicted,
                    exact,
                    f1,
                    agree,
                    codes,
                )
            )
    return build_report(pairs)
