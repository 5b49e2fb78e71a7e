"""The one rule for a call to a tool the task does not offer, used by every loop that plays an episode.

A real environment answers a call to a tool it does not have with an error, and the conversation goes on.
Every loop does the same, through ``unknown_tool_response``: the local engine's rollout
(``envace.engines.local.rollout``), the verl episode (``envace.engines.verl.episode``) and the ACT loop
of evaluation, committed executions and test-time rehearsal (``envace.evaluation.episode``). The answer
is the error the tool world's executor returns (it builds it with this function too).

The tool list is in the agent's own prompt, so the rule needs nobody: no executor runs the call, no
rehearser or simulator is asked, and under rehearsal the answer is no REHEARSE output (nothing to train
on). Later REHEARSE requests still see the call and its error in their history, like any earlier call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envace.core.records import ToolCall

UNKNOWN_TOOL = "UNKNOWN_TOOL"


def unknown_tool_response(call: ToolCall, tool_names: Sequence[str]) -> dict[str, Any] | None:
    """The error ``call`` gets when its tool is not among ``tool_names`` (the task's, in order); None when it is."""
    if call.name in tool_names:
        return None
    offered = ", ".join(tool_names)
    return {"error": {"code": UNKNOWN_TOOL, "message": f"unknown tool '{call.name}'; available: {offered}"}}
