"""The real executor of BFCL multi-turn and memory entries: bfcl's own Python backends.

Calls go through bfcl's ``execute_multi_turn_func_call`` (the function its inference loop and its
checker use), one call at a time, in order. bfcl keeps backend instances in a module-level cache keyed
by ``model_name + entry id + class``; every ``BfclExecutor`` gets a fresh unique namespace as its
``model_name``, so two executors of the same entry never share state, and ``close()`` drops the
instances from bfcl's cache.

bfcl evaluates call strings with ``eval``. Before anything is executed, names of functions and
arguments must be plain Python identifiers (values are rendered with ``repr`` of JSON data, which is
inert); any other call gets an execution error without reaching ``eval``.

``execute_text`` returns bfcl's exact response string (what the ACT prompt shows); ``execute`` returns
it as a JSON value (``convert.decode_response``), the form records and fidelity studies compare.
"""

from __future__ import annotations

import keyword
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envace.core.records import ToolCall
from envace.envs.bfcl.convert import (
    EXECUTION_ERROR_PREFIX,
    decode_response,
    execution_strings,
)
from envace.envs.bfcl.upstream import bfcl


def is_safe_call(call: ToolCall) -> bool:
    """Whether bfcl may ``eval`` this call: identifier function and argument names only."""

    def ok(name: Any) -> bool:
        return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)

    return ok(call.name) and all(ok(k) for k in call.arguments)


def unique_namespace(prefix: str = "envace") -> str:
    """A fresh bfcl ``model_name`` (letters, digits and dashes only)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _instance_key(namespace: str, entry_id: str, class_name: str) -> str:
    """bfcl's cache key of one backend instance (mirrors its naming rule)."""
    return re.sub(r"[-./:]", "_", f"{namespace}_{entry_id}_{class_name}_instance")


def drop_instances(namespace: str, entry_id: str, class_names: Sequence[str]) -> None:
    """Remove the cached instances of ``namespace`` (and of its checker namespaces) from bfcl's cache."""
    cache = vars(bfcl().multi_turn_utils)
    for ns in (namespace, f"{namespace}_eval", f"{namespace}_ground_truth_eval"):
        for class_name in class_names:
            cache.pop(_instance_key(ns, entry_id, class_name), None)


def to_jsonable(value: Any, _seen: frozenset[int] = frozenset()) -> Any:
    """A JSON-able copy of backend state (objects as their public attributes; cycles cut)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in _seen:
        return "<cycle>"
    seen = _seen | {id(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, seen) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [to_jsonable(v, seen) for v in items]
    if hasattr(value, "__dict__"):
        public = {k: v for k, v in vars(value).items() if not k.startswith("_") and k != "parent"}
        return {"__class__": type(value).__name__, **to_jsonable(public, seen)}
    return str(value)


class BfclExecutor:
    """Live backends of one BFCL entry (``core.env.Executor``).

    Args:
        entry_id: the BFCL id (part of bfcl's instance key; memory backends also read it).
        category: the entry's category (``long_context`` scenarios load extra data).
        initial_config: the entry's ``initial_config`` (deep-copied by bfcl before loading).
        involved_classes: backend class names, e.g. ``["GorillaFileSystem", "TwitterAPI"]``.
        namespace: bfcl ``model_name`` for the instance cache; a fresh unique one by default.
    """

    def __init__(
        self,
        entry_id: str,
        category: str,
        initial_config: Mapping[str, Any],
        involved_classes: Sequence[str],
        namespace: str | None = None,
    ) -> None:
        self.entry_id = entry_id
        self.category = category
        self.namespace = namespace or unique_namespace()
        self.involved_classes = tuple(involved_classes)
        self._initial_config = dict(initial_config)
        self._long_context = "long_context" in category or "composite" in category
        self.calls_made = 0
        _, self._instances = self._run([])

    def _run(self, strings: list[str]) -> tuple[list[str], dict[str, Any]]:
        return bfcl().multi_turn_utils.execute_multi_turn_func_call(
            strings,
            self._initial_config,
            list(self.involved_classes),
            self.namespace,
            self.entry_id,
            long_context=self._long_context,
            is_evaL_run=False,
        )

    @property
    def instances(self) -> dict[str, Any]:
        """The live backend objects by class name (memory prompts and flushing need them)."""
        return dict(self._instances)

    def execute_text(self, call: ToolCall) -> str:
        """bfcl's exact response string for one call."""
        self.calls_made += 1
        if not is_safe_call(call):
            return f"{EXECUTION_ERROR_PREFIX}invalid function or argument name in call to {call.name!r}"
        results, self._instances = self._run(execution_strings([call]))
        return results[0]

    def execute(self, call: ToolCall) -> Any:
        """The response as a JSON value (objects/arrays decoded, errors as ``{"error": …}``)."""
        return decode_response(self.execute_text(call))

    def state(self) -> dict[str, Any]:
        """Public attributes of every stateful backend, JSON-able."""
        stateless = set(bfcl().backends.STATELESS_CLASSES)
        return {name: to_jsonable(obj) for name, obj in self._instances.items() if name not in stateless}

    def close(self) -> None:
        """Drop this executor's instances from bfcl's module-level cache."""
        drop_instances(self.namespace, self.entry_id, self.involved_classes)


def memory_initial_config(entry: Mapping[str, Any], category: str, snapshot_root: Path) -> dict[str, Any]:
    """The ``initial_config`` bfcl's memory backends expect (snapshots live under ``snapshot_root``)."""
    classes = entry["involved_classes"]
    return {
        classes[0]: {
            "model_result_dir": Path(snapshot_root),
            "scenario": entry["scenario"],
            "test_id": entry["id"],
            "test_category": category,
        }
    }
