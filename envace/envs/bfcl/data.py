"""BFCL-v4 entries (bfcl-eval's bundled data) and their envace ``Task`` view.

Each entry is loaded twice, exactly as bfcl does: ``prompt`` is what its inference feeds the model
(language hints in Java/JavaScript docs, the agentic answer-format system message) and
``scoring_prompt`` is what its evaluator reads (no hints). Ground truth is aligned with the prompts by
index, as bfcl's evaluator does (some ground-truth ids differ from the prompt ids).

Memory categories also carry their prerequisite conversations, grouped by scenario and ordered.

Entries are cached per process and shared: treat them as read-only (episodes deep-copy what they change).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from envace.core.env import Task
from envace.core.records import ToolCall
from envace.envs.bfcl.categories import CATEGORIES, CategoryKind, CategorySpec
from envace.envs.bfcl.convert import openai_tools, oracle_calls, parse_execution_string
from envace.envs.bfcl.upstream import bfcl


class CategoryNotRunnable(RuntimeError):
    """The category needs something this machine does not have (the message says what)."""


@dataclass(frozen=True)
class BfclEntry:
    id: str
    category: str
    prompt: dict[str, Any]
    scoring_prompt: dict[str, Any]
    ground_truth: Any = None  # possible answer | gold call strings per turn | answer strings | None

    @property
    def spec(self) -> CategorySpec:
        return CATEGORIES[self.category]


def category_spec(category: str) -> CategorySpec:
    """The spec of a category; raises ``KeyError`` listing the valid names."""
    if category not in CATEGORIES:
        raise KeyError(f"unknown BFCL category {category!r}; valid: {', '.join(CATEGORIES)}")
    return CATEGORIES[category]


def require_runnable(category: str) -> CategorySpec:
    """The spec of a category that can run here; raises ``CategoryNotRunnable`` with the reason otherwise."""
    spec = category_spec(category)
    if not spec.offline:
        raise CategoryNotRunnable(f"BFCL category {category!r} is not runnable offline: {spec.reason}")
    return spec


def _split_prereq(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    questions = [e for e in entries if "prereq" not in e["id"]]
    return questions, [e for e in entries if "prereq" in e["id"]]


@functools.cache
def load_category(category: str) -> tuple[BfclEntry, ...]:
    """All scored entries of one runnable category, in bfcl's order."""
    spec = require_runnable(category)
    utils = bfcl().utils
    prompts, _ = _split_prereq(utils.load_dataset_entry(category, include_prereq=False))
    scoring, _ = _split_prereq(
        utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    )
    if spec.kind in (CategoryKind.RELEVANCE, CategoryKind.IRRELEVANCE):
        truths: list[Any] = [None] * len(prompts)
    else:
        truths = [g["ground_truth"] for g in utils.load_ground_truth_entry(category)]
    if not len(prompts) == len(scoring) == len(truths):
        raise RuntimeError(
            f"bfcl data of {category!r} is inconsistent: {len(prompts)} prompts, {len(scoring)} scoring "
            f"prompts, {len(truths)} ground-truth entries; reinstall bfcl-eval"
        )
    return tuple(BfclEntry(p["id"], category, p, s, g) for p, s, g in zip(prompts, scoring, truths))


def _prereq_order(entry: dict[str, Any]) -> int:
    return int(entry["id"].rsplit("-", 1)[1])


@functools.cache
def load_memory_prereqs(category: str) -> dict[str, tuple[dict[str, Any], ...]]:
    """Prerequisite conversations of a memory category: scenario → entries in dependency order."""
    spec = require_runnable(category)
    if spec.kind is not CategoryKind.MEMORY:
        raise ValueError(f"{category!r} is not a memory category; prerequisites exist only for memory_*")
    _, prereqs = _split_prereq(bfcl().utils.load_dataset_entry(category, include_prereq=True))
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for entry in prereqs:
        by_scenario.setdefault(entry["scenario"], []).append(entry)
    return {s: tuple(sorted(es, key=_prereq_order)) for s, es in by_scenario.items()}


def turn_user_texts(question: list[list[dict[str, Any]]]) -> tuple[str, ...]:
    """The user text of each turn: its last user message, or bfcl's prompt for a function-holdout turn."""
    holdout_text = bfcl().prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    texts = []
    for turn in question:
        users = [str(m.get("content", "")) for m in turn if m.get("role") == "user"]
        texts.append(users[-1] if users else holdout_text)
    return tuple(texts)


def _system_text(question: list[list[dict[str, Any]]]) -> str:
    first = question[0] if question else []
    return "\n\n".join(str(m.get("content", "")) for m in first if m.get("role") == "system")


def _gold(entry: BfclEntry, n_turns: int) -> tuple[tuple[tuple[tuple[ToolCall, ...], ...], ...], tuple[str, ...]]:
    """(gold calls per turn as steps, gold answer per turn) — what an oracle replays."""
    kind = entry.spec.kind
    if kind is CategoryKind.AST:
        language = {"simple_java": "java", "simple_javascript": "javascript"}.get(entry.category, "python")
        calls = oracle_calls(entry.ground_truth, entry.scoring_prompt["function"], language)
        return ((calls,),), ("",)
    if kind is CategoryKind.RELEVANCE:  # any call counts; take the first documented function
        return (((ToolCall(entry.prompt["function"][0]["name"], {}),),),), ("",)
    if kind is CategoryKind.IRRELEVANCE:
        return ((),), ("None of the available functions can answer this request.",)
    if kind is CategoryKind.MEMORY:
        answers = entry.ground_truth or [""]
        return tuple(() for _ in range(n_turns)), (str(answers[0]),) * n_turns
    classes = entry.prompt["involved_classes"]
    steps = tuple(
        ((tuple(parse_execution_string(s, classes) for s in turn),) if turn else ()) for turn in entry.ground_truth
    )
    return steps, ("Done.",) * len(steps)


def entry_to_task(entry: BfclEntry, split: str) -> Task:
    """The envace view of an entry (tools as OpenAI schemas; gold for oracles; the entry in ``meta``)."""
    question = entry.prompt["question"]
    user_turns = turn_user_texts(question)
    gold_calls, gold_answers = _gold(entry, len(user_turns))
    return Task(
        task_id=entry.id,
        domain=entry.category,
        split=split,
        system_prompt=_system_text(question),
        tools=openai_tools(entry.prompt["function"]),
        user_turns=user_turns,
        gold_calls=gold_calls,
        gold_answers=gold_answers,
        meta={
            "benchmark": "bfcl",
            "bfcl_category": entry.category,
            "bfcl_kind": entry.spec.kind.value,
            "bfcl_entry": entry,
        },
    )
