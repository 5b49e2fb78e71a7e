"""The rehearsal memory and its bound (docs/method.md §12): deterministic truncation to a character and a token budget.

``bound_memory`` keeps the longest prefix that fits together with a truncation marker, snapped back to a
whitespace boundary. Token counts default to ``count_approx_tokens`` (words and punctuation marks, an
over-estimate of BPE tokens for English); pass a tokenizer-backed counter for exact budgets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
