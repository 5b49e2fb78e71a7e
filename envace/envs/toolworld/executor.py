"""``ToolWorldExecutor``: real execution of tool calls against one task's live state.

The executor is the only object holding live tool-world state. It deep-copies the task's initial
state on construction and every snapshot it hands out, so nothing outside can alias its state (and
executing never touches a ``Task``). A call runs against a scratch copy of its domain's state that
is committed only on success, so a failing call leaves the state exactly as it was (no partial
writes, no id counter advanced).

It never raises on a bad call: an unknown (or not offered) tool (``envace.core.unknown_tool``),
malformed or schema-violating arguments and domain failures all come back as
``{"error": {"code", "message"}}``; an unexpected exception inside a handler (a bug) is logged and
returned as ``INTERNAL_ERROR``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from envace.core.env import Task
from envace.core.records import ToolCall
from envace.core.unknown_tool import unknown_tool_response
from envace.envs.toolworld.registry import TOOLS
from envace.envs.toolworld.schema import INTERNAL_ERROR, ToolError, error_response
from envace.envs.toolworld.state import clone

logger = logging.getLogger(__name__)


class ToolWorldExecutor:
    """Executes tool-world calls for one task (implements ``envace.core.env.Executor``)."""

    def __init__(self, task: Task) -> None:
        names = [schema["function"]["name"] for schema in task.tools]
        self._setup(task.initial_state, names)

    @classmethod
    def from_state(cls, state: dict[str, Any], tool_names: Iterable[str]) -> ToolWorldExecutor:
        """An executor over ``state`` (deep-copied) offering only ``tool_names``."""
        executor = cls.__new__(cls)
        executor._setup(state, list(tool_names))
        return executor

    def _setup(self, state: dict[str, Any], tool_names: list[str]) -> None:
        unknown = sorted(n for n in tool_names if n not in TOOLS)
        if unknown:
            raise ValueError(f"ToolWorldExecutor: tools {unknown} are not tool-world tools; valid: {sorted(TOOLS)}")
        self._state: dict[str, Any] = clone(state)
        self._tools = {name: TOOLS[name] for name in tool_names}
        self._log: list[tuple[ToolCall, Any]] = []

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    @property
    def log(self) -> tuple[tuple[ToolCall, Any], ...]:
        """Every (call, response) this executor has seen, in order (copies)."""
        return tuple(clone(self._log))

    def state(self) -> dict[str, Any]:
        return clone(self._state)

    def execute(self, call: ToolCall) -> dict[str, Any]:
        response = self._run(call)
        self._log.append((call, clone(response)))
        return response

    def _run(self, call: ToolCall) -> dict[str, Any]:
        spec = self._tools.get(call.name) if isinstance(call.name, str) else None
        if spec is None:  # the answer every loop gives such a call before it would reach an executor
            return unknown_tool_response(call, tuple(self._tools))
        scratch = clone(self._state.get(spec.domain, {}))
        try:
            arguments = spec.validate(call.arguments)
            response = spec.handler(scratch, arguments)
        except ToolError as err:
            return err.response()
        except Exception:  # a handler bug must not crash a rollout; it is logged loudly instead
            logger.exception("tool-world handler %s crashed on arguments %r", spec.name, call.arguments)
            return error_response(INTERNAL_ERROR, f"{spec.name} failed unexpectedly")
        self._state[spec.domain] = scratch
        return clone(response)
