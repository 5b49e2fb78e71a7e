"""Small helpers shared by the domain backends: deterministic id allocation and id ordering.

``clone`` is the deep copy used for states and responses: a plain recursive copy of JSON trees
(dicts, lists, scalars), several times faster than ``copy.deepcopy``; anything else falls back to
``copy.deepcopy``.

Ids look like ``evt_3``: a per-domain prefix and a counter kept in the domain state under
``next_ids``. Counters advance only when a creation succeeds (the executor commits state only on
success), so the same sequence of successful calls always yields the same ids.
"""

from __future__ import annotations

import copy
from typing import Any

COUNTERS_KEY = "next_ids"


def allocate_id(domain_state: dict[str, Any], prefix: str) -> str:
    """Return the next id for ``prefix`` (e.g. ``txn_4``) and advance the counter."""
    counters = domain_state.setdefault(COUNTERS_KEY, {})
    number = int(counters.get(prefix, 1))
    counters[prefix] = number + 1
    return f"{prefix}_{number}"


def id_order(identifier: str) -> tuple[str, int]:
    """Sort key that orders ``evt_2`` before ``evt_10``."""
    prefix, _, number = identifier.rpartition("_")
    return (prefix, int(number)) if number.isdigit() else (identifier, -1)


def sorted_ids(mapping: dict[str, Any]) -> list[str]:
    return sorted(mapping, key=id_order)


def clone(value: Any) -> Any:
    """A deep copy of a JSON-like tree (no aliasing of any dict or list)."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}
    if kind is list:
        return [clone(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    if kind is tuple:
        return tuple(clone(v) for v in value)
    return copy.deepcopy(value)
