"""Train/val splits of validated CM2 rows by ``zlib.crc32`` of their uuid, and shape statistics.

``split_of`` is stable across processes and machines (no ``hash()``, which Python salts per process);
``dataset_stats`` summarises rows that passed validation (it trusts their shape).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.conversation import conversation_steps


def split_of(uuid: str, val_fraction: float, seed: int = 0) -> str:
    """ "val" or "train" for a uuid, from ``zlib.crc32`` of (seed, uuid): stable everywhere."""
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction={val_fraction} must lie in [0, 1]")
    bucket = zlib.crc32(f"{seed}:{uuid}".encode("utf-8", errors="surrogatepass")) / 2**32
    return "val" if bucket < val_fraction else "train"


def split_rows(
    rows: Sequence[Mapping[str, Any]], val_fraction: float = 0.05, seed: int = 0
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(train, val) rows by ``split_of`` of their uuid; input order is kept within each split."""
    train, val = [], []
    for row in rows:
        (val if split_of(row["uuid"], val_fraction, seed) == "val" else train).append(row)
    return train, val


@dataclass(frozen=True)
class Distribution:
    count: int
    total: int
    mean: float
    min: int
    max: int
    histogram: tuple[tuple[int, int], ...]  # (value, how often), sorted by value

    @classmethod
    def of(cls, values: Sequence[int]) -> Distribution:
        hist: dict[int, int] = {}
        for v in values:
            hist[v] = hist.get(v, 0) + 1
        n = len(values)
        return cls(
            n,
            sum(values),
            sum(values) / n if n else 0.0,
            min(values, default=0),
            max(values, default=0),
            tuple(sorted(hist.items())),
        )


@dataclass(frozen=True)
class Cm2Stats:
    n_rows: int
    user_turns: Distribution  # per row
    tools_per_row: Distribution
    steps_per_turn: Distribution  # assistant messages per user turn
    calls_per_turn: Distribution
    items_per_turn: Distribution  # checklist items per turn (first variant)
    variants_per_row: Distribution

    def to_json(self) -> dict[str, Any]:
        return {
            k: (v.__dict__ | {"histogram": [list(p) for p in v.histogram]} if isinstance(v, Distribution) else v)
            for k, v in self.__dict__.items()
        }


def dataset_stats(rows: Sequence[Mapping[str, Any]]) -> Cm2Stats:
    """Shape statistics of validated rows."""
    turns, tools, steps, calls, items, variants = [], [], [], [], [], []
    for row in rows:
        n_turns = sum(m["role"] == "user" for m in row["messages"])
        turns.append(n_turns)
        tools.append(len(row["tools"]))
        variants.append(len(row["checklists"]))
        per_turn_steps, per_turn_calls = [0] * n_turns, [0] * n_turns
        for st in conversation_steps(row["messages"]):
            per_turn_steps[st.turn] += 1
            per_turn_calls[st.turn] += len(st.assistant.get("tool_calls") or [])
        steps.extend(per_turn_steps)
        calls.extend(per_turn_calls)
        items.extend(len(t) for t in row["checklists"][0])
    d = Distribution.of
    return Cm2Stats(len(rows), d(turns), d(tools), d(steps), d(calls), d(items), d(variants))
