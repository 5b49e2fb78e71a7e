"""BFCL-v4 test categories: how each is run and scored, and whether it can run offline.

Every scoring category of BFCL-v4 is listed, runnable or not, so a report can always say why a
category is missing instead of silently dropping it. Groups follow BFCL's own leaderboard sections.
No bfcl-eval import here (cheap to import).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CategoryKind(str, enum.Enum):
    AST = "ast"  # one generation, calls checked by ast_checker against possible answers
    RELEVANCE = "relevance"  # one generation, success = at least one call
    IRRELEVANCE = "irrelevance"  # one generation, success = no call
    MULTI_TURN = "multi_turn"  # executable multi-turn loop, multi_turn_checker (state + responses)
    MEMORY = "memory"  # prerequisite conversations fill a memory backend, then a question is answered
    WEB_SEARCH = "web_search"  # multi-step with a live search API


class Group(str, enum.Enum):
    NON_LIVE = "non_live"
    LIVE = "live"
    MULTI_TURN = "multi_turn"
    AGENTIC = "agentic"


@dataclass(frozen=True)
class CategorySpec:
    name: str
    kind: CategoryKind
    group: Group
    offline: bool = True
    reason: str = ""  # why it cannot run offline (empty when it can)


_NO_SERPAPI = "needs the network: the web-search backend queries SerpAPI (SERPAPI_API_KEY) at run time"
_NO_ENCODER = (
    "needs the network: the memory_vector backend downloads the sentence-transformers model "
    "all-MiniLM-L6-v2 from the Hugging Face hub when it is imported (no hub access here)"
)

_SPECS: tuple[CategorySpec, ...] = (
    CategorySpec("simple_python", CategoryKind.AST, Group.NON_LIVE),
    CategorySpec("simple_java", CategoryKind.AST, Group.NON_LIVE),
    CategorySpec("simple_javascript", CategoryKind.AST, Group.NON_LIVE),
    CategorySpec("multiple", CategoryKind.AST, Group.NON_LIVE),
    CategorySpec("parallel", CategoryKind.AST, Group.NON_LIVE),
    CategorySpec("parallel_multiple", CategoryKind.AST, Group.NON_LIVE),
    CategorySpec("irrelevance", CategoryKind.IRRELEVANCE, Group.NON_LIVE),
    CategorySpec("live_simple", CategoryKind.AST, Group.LIVE),
    CategorySpec("live_multiple", CategoryKind.AST, Group.LIVE),
    CategorySpec("live_parallel", CategoryKind.AST, Group.LIVE),
    CategorySpec("live_parallel_multiple", CategoryKind.AST, Group.LIVE),
    CategorySpec("live_irrelevance", CategoryKind.IRRELEVANCE, Group.LIVE),
    CategorySpec("live_relevance", CategoryKind.RELEVANCE, Group.LIVE),
    CategorySpec("multi_turn_base", CategoryKind.MULTI_TURN, Group.MULTI_TURN),
    CategorySpec("multi_turn_miss_func", CategoryKind.MULTI_TURN, Group.MULTI_TURN),
    CategorySpec("multi_turn_miss_param", CategoryKind.MULTI_TURN, Group.MULTI_TURN),
    CategorySpec("multi_turn_long_context", CategoryKind.MULTI_TURN, Group.MULTI_TURN),
    CategorySpec("memory_kv", CategoryKind.MEMORY, Group.AGENTIC),
    CategorySpec("memory_vector", CategoryKind.MEMORY, Group.AGENTIC, offline=False, reason=_NO_ENCODER),
    CategorySpec("memory_rec_sum", CategoryKind.MEMORY, Group.AGENTIC),
    CategorySpec("web_search_base", CategoryKind.WEB_SEARCH, Group.AGENTIC, offline=False, reason=_NO_SERPAPI),
    CategorySpec("web_search_no_snippet", CategoryKind.WEB_SEARCH, Group.AGENTIC, offline=False, reason=_NO_SERPAPI),
)
CATEGORIES: dict[str, CategorySpec] = {spec.name: spec for spec in _SPECS}

SINGLE_TURN_KINDS = frozenset({CategoryKind.AST, CategoryKind.RELEVANCE, CategoryKind.IRRELEVANCE})

GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(CATEGORIES),
    "offline": tuple(n for n, s in CATEGORIES.items() if s.offline),
    "non_live": tuple(n for n, s in CATEGORIES.items() if s.group is Group.NON_LIVE),
    "live": tuple(n for n, s in CATEGORIES.items() if s.group is Group.LIVE),
    "single_turn": tuple(n for n, s in CATEGORIES.items() if s.kind in SINGLE_TURN_KINDS),
    "multi_turn": tuple(n for n, s in CATEGORIES.items() if s.kind is CategoryKind.MULTI_TURN),
    "memory": tuple(n for n, s in CATEGORIES.items() if s.kind is CategoryKind.MEMORY),
    "web_search": tuple(n for n, s in CATEGORIES.items() if s.kind is CategoryKind.WEB_SEARCH),
    "agentic": tuple(n for n, s in CATEGORIES.items() if s.group is Group.AGENTIC),
}
GROUPS["test"] = GROUPS["all"]  # the evaluation stage's default subset name


def resolve_categories(subset: str) -> list[str]:
    """Category names of ``subset``: comma-separated categories and/or group names, in BFCL order.

    Raises ``KeyError`` naming the valid categories and groups for an unknown name.
    """
    wanted: set[str] = set()
    for part in (p.strip() for p in subset.split(",")):
        if not part:
            continue
        if part in GROUPS:
            wanted.update(GROUPS[part])
        elif part in CATEGORIES:
            wanted.add(part)
        else:
            raise KeyError(
                f"unknown BFCL category or group {part!r}; categories: {', '.join(CATEGORIES)}; "
                f"groups: {', '.join(GROUPS)}"
            )
    if not wanted:
        raise KeyError(f"BFCL subset {subset!r} names no category; use e.g. 'simple_python' or 'non_live'")
    return [name for name in CATEGORIES if name in wanted]


def category_of(task_id: str) -> str:
    """The category of a BFCL entry id (``live_simple_3-2-1`` → ``live_simple``; prereq ids keep ``_prereq``)."""
    return task_id.rsplit("_", 1)[0]
