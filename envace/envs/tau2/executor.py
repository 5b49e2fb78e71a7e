"""The real executor of a τ² task: tau2's domain environment, its tool calls, its state.

``Tau2Executor`` wraps one tau2 ``Environment``. ``tool_message`` is tau2's own ``get_response`` (what
the orchestrator uses: exact content, ``error`` flag); ``execute`` gives the response as a JSON value for
records and fidelity studies (JSON content decoded, a failed call as ``{"error": message}``).

During an episode the orchestrator talks to an ``EnvironmentProxy``: the tau2 environment, except that
every tool call goes through the (possibly wrapped) executor, so a recording wrapper sees every real
call. A wrapper without ``tool_message`` still works: its ``execute`` value is turned back into a tool
message (JSON text; ``{"error": …}`` → an error message).
"""

from __future__ import annotations

import json
from typing import Any

from envace.core.records import ToolCall
from envace.envs.tau2.upstream import tau2

ERROR_PREFIX = "Error: "  # how tau2 writes a tool call that raised


def decode_tool_message(message: Any) -> Any:
    """A tau2 ``ToolMessage`` as a JSON value."""
    content = message.content or ""
    if message.error:
        return {"error": content.removeprefix(ERROR_PREFIX)}
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return content


class Tau2Executor:
    """Live tools of one τ² task (``core.env.Executor``); ``requestor`` of ``execute`` calls is the agent."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.calls_made = 0

    def tool_message(self, call: Any) -> Any:
        """tau2's response message to one tau2 ``ToolCall`` (agent or customer side)."""
        self.calls_made += 1
        return self.environment.get_response(call)

    def execute(self, call: ToolCall) -> Any:
        tau2_call = tau2().message.ToolCall(
            id=call.id or f"real_{self.calls_made}",
            name=call.name,
            arguments=dict(call.arguments),
            requestor="assistant",
        )
        return decode_tool_message(self.tool_message(tau2_call))

    def state(self) -> dict[str, Any]:
        """Hashes of the agent-side and customer-side databases (what tau2's DB check compares)."""
        return {"db_hash": self.environment.get_db_hash(), "user_db_hash": self.environment.get_user_db_hash()}


class EnvironmentProxy:
    """A tau2 environment whose tool calls go through ``executor`` (everything else is delegated)."""

    def __init__(self, environment: Any, executor: Any) -> None:
        self._environment = environment
        self._executor = executor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._environment, name)

    def get_response(self, call: Any) -> Any:
        if hasattr(self._executor, "tool_message"):
            return self._executor.tool_message(call)
        value = self._executor.execute(ToolCall(call.name, dict(call.arguments), call.id))
        error = isinstance(value, dict) and set(value) == {"error"}
        content = value if isinstance(value, str) else json.dumps(value)
        if error:
            content = ERROR_PREFIX + str(value["error"])
        return tau2().message.ToolMessage(
            id=call.id, content=content, requestor=call.requestor, role="tool", error=error
        )
