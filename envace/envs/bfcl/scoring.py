"""Scoring with BFCL's own checkers, and BFCL's own aggregates over the categories that ran.

An episode's outputs are the raw ACT generations, per turn and step. They are parsed with
``envace.core.wire.parse_tool_calls`` (no tool whitelist: a call to an undocumented function is the
checker's business), turned into BFCL's decoded forms, and checked exactly as ``bfcl evaluate`` does
with its Hermes (Qwen-FC) decoder, which keeps the well-formed blocks of a message and drops bad ones:

* AST categories: ``ast_checker`` (functions, parameters, types, allowed values; no-hint function docs);
* ``irrelevance`` / ``live_irrelevance``: valid iff the generation holds no call; ``live_relevance``:
  valid iff it holds at least one;
* multi-turn: every step's calls as execution strings (steps without calls are skipped), fewer turns
  than the ground truth = force-terminated (invalid), else ``multi_turn_checker`` (state and response
  checks after each turn), run in a fresh namespace that is dropped afterwards;
* memory: the last step of the (single) turn without a call is the answer, ``agentic_checker`` looks
  for one of the gold answers in it.

``bfcl_summary`` combines per-category accuracies with bfcl's own ``calculate_*`` helpers and section
layout (non-live, live, irrelevance, multi-turn, agentic; overall weights 10/10/10/30/40), restricted to
the categories that ran. ``bfcl evaluate`` instead scores a missing category as 0; ``covers_all`` says
whether the overall number is comparable to the official one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envace.core.records import ToolCall
from envace.core.wire import ToolCallParse, parse_tool_calls
from envace.envs.bfcl.categories import CATEGORIES, CategoryKind
from envace.envs.bfcl.convert import ast_form, execution_strings
from envace.envs.bfcl.data import BfclEntry
from envace.envs.bfcl.executor import drop_instances, is_safe_call, unique_namespace
from envace.envs.bfcl.upstream import CHECKER_MODEL, bfcl

# what an unsafe call is executed as during checking: a name that is never defined (an error, like
# any other call to an unknown function), so nothing the model wrote reaches eval
_UNSAFE_STANDIN = ToolCall("envace_rejected_call", {})


@dataclass(frozen=True)
class BfclVerdict:
    valid: bool
    error_type: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def parse_output(text: str) -> ToolCallParse:
    """How every raw generation is read (same rules for scoring, the loop and result files)."""
    return parse_tool_calls(text)


def _language(category: str) -> Any:
    lang = bfcl().enums.Language
    if category == "simple_java":
        return lang.JAVA
    if category == "simple_javascript":
        return lang.JAVASCRIPT
    return lang.PYTHON


def check_single_turn(entry: BfclEntry, text: str) -> BfclVerdict:
    """Score one generation of an AST, relevance or irrelevance entry."""
    calls = parse_output(text).calls
    kind = entry.spec.kind
    if kind is CategoryKind.IRRELEVANCE:
        return BfclVerdict(True) if not calls else BfclVerdict(False, "irrelevance_error:decoder_success")
    if kind is CategoryKind.RELEVANCE:
        return BfclVerdict(True) if calls else BfclVerdict(False, "relevance_error:decoder_failed")
    if kind is not CategoryKind.AST:
        raise ValueError(f"{entry.id}: category kind {kind.value} is not single-turn")
    result = bfcl().ast_checker(
        entry.scoring_prompt["function"],
        ast_form(calls),
        entry.ground_truth,
        _language(entry.category),
        entry.category,
        CHECKER_MODEL,
    )
    return _verdict(result)


def _verdict(result: Mapping[str, Any]) -> BfclVerdict:
    if result.get("valid"):
        return BfclVerdict(True)
    detail = {k: v for k, v in result.items() if k != "valid"}
    return BfclVerdict(False, str(result.get("error_type", "")), _plain(detail))


def _plain(value: Any) -> Any:
    """JSON-able copy of a checker's error payload (backend objects become strings)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _decoded_steps(turn: Sequence[str]) -> list[list[str]]:
    """Execution strings of each step that holds calls (bfcl skips the others)."""
    steps = []
    for text in turn:
        calls = [c if is_safe_call(c) else _UNSAFE_STANDIN for c in parse_output(text).calls]
        if calls:
            steps.append(execution_strings(calls))
    return steps


def check_multi_turn(entry: BfclEntry, outputs: Sequence[Sequence[str]]) -> BfclVerdict:
    """Score a multi-turn episode from its raw generations (per turn, per step)."""
    truth = entry.ground_truth
    if len(outputs) != len(truth):
        return BfclVerdict(
            False,
            "multi_turn:force_terminated",
            {"error_message": f"{len(outputs)} turns played, the ground truth has {len(truth)}"},
        )
    decoded = [_decoded_steps(turn) for turn in outputs]
    namespace = unique_namespace("envace-check")
    classes = entry.scoring_prompt["involved_classes"]
    try:
        result = bfcl().multi_turn_checker(decoded, truth, entry.scoring_prompt, entry.category, namespace)
    finally:
        drop_instances(namespace, entry.id, classes)
    return _verdict(result)


def memory_answer(outputs: Sequence[Sequence[str]]) -> str | None:
    """The answer of a memory episode: the last call-free step of its single turn (None if none)."""
    if len(outputs) != 1:
        return None
    answer = None
    for text in outputs[0]:
        parse = parse_output(text)
        if not parse.calls:
            answer = parse.content
    return answer


def check_memory(entry: BfclEntry, outputs: Sequence[Sequence[str]]) -> BfclVerdict:
    """Score a memory question from its raw generations."""
    if len(outputs) != 1:
        return BfclVerdict(False, "agentic:inference_error", {"error_message": f"{len(outputs)} turns, expected 1"})
    answer = memory_answer(outputs)
    if answer is None:
        return BfclVerdict(False, "agentic:no_last_message")
    return _verdict(bfcl().agentic_checker(answer, entry.ground_truth))


def check_entry(entry: BfclEntry, outputs: Sequence[Sequence[str]]) -> BfclVerdict:
    """Score any entry from its raw generations (single-turn: one turn with one step)."""
    kind = entry.spec.kind
    if kind is CategoryKind.MULTI_TURN:
        return check_multi_turn(entry, outputs)
    if kind is CategoryKind.MEMORY:
        return check_memory(entry, outputs)
    text = outputs[0][0] if outputs and outputs[0] else ""
    return check_single_turn(entry, text)


# ---- aggregates ---------------------------------------------------------------------------------
_SECTIONS = (("non_live", 10), ("live", 10), ("irrelevance", 10), ("multi_turn", 30), ("agentic", 40))


def _combine(how: str, parts: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """bfcl's weighted/unweighted mean over the parts that ran (None when none did)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    helper = bfcl().helper
    fn = helper.calculate_weighted_accuracy if how == "weighted" else helper.calculate_unweighted_accuracy
    return fn(present, display_na_if_category_missing=False)


def bfcl_summary(counts: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """Section and overall accuracies (bfcl's formulas) over categories that ran: ``{name: (correct, total)}``."""

    def cat(name: str) -> dict[str, Any] | None:
        if name not in counts or counts[name][1] == 0:
            return None
        correct, total = counts[name]
        return {"accuracy": correct / total, "total_count": total, "display_accuracy": correct / total}

    simple = _combine("unweighted", [cat("simple_python"), cat("simple_java"), cat("simple_javascript")])
    groups = {
        "non_live_simple": simple,
        "non_live": _combine("unweighted", [simple, cat("multiple"), cat("parallel"), cat("parallel_multiple")]),
        "live": _combine(
            "weighted", [cat(c) for c in ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")]
        ),
        "irrelevance": _combine("unweighted", [cat("irrelevance"), cat("live_irrelevance")]),
        "relevance": cat("live_relevance"),
        "multi_turn": _combine("unweighted", [cat(c) for c in CATEGORIES if c.startswith("multi_turn")]),
        "memory": _combine("unweighted", [cat(c) for c in ("memory_kv", "memory_vector", "memory_rec_sum")]),
        "web_search": _combine("unweighted", [cat("web_search_base"), cat("web_search_no_snippet")]),
    }
    groups["agentic"] = _combine("unweighted", [groups["web_search"], groups["memory"]])
    ran = [(groups[name], weight) for name, weight in _SECTIONS if groups[name] is not None]
    overall = None
    if ran:
        overall = bfcl().helper.calculate_percentage_weighted_accuracy(
            [g for g, _ in ran], [w for _, w in ran], display_na_if_category_missing=False
        )
    out: dict[str, Any] = {k: (None if v is None else v["accuracy"]) for k, v in groups.items()}
    out["overall"] = None if overall is None else overall["accuracy"]
    out["covers_all"] = all(name in counts for name in CATEGORIES)
    return out
