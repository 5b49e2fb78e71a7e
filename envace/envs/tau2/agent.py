"""The agent and customer seats of a τ² conversation, as tau2 objects (imports tau2).

``BridgedAgent`` / ``BridgedSoloAgent`` subclass tau2's ``LLMAgent`` / ``LLMSoloAgent`` — so the system
prompts, state handling and the solo ``done`` tool are tau2's — but do not call an LLM: the episode
program prepares the generation (``request_messages`` → our ``ChatBackend``), puts its text in
``pending``, and tau2's orchestrator then receives it from ``generate_next_message``. The text is read
with ``envace.core.wire.parse_tool_calls``; a malformed call block or an empty reply is an ACT parse
failure (``failed``), which ends the episode as an agent error.

The customer seat is tau2's ``DummyUser`` (solo), tau2's ``UserSimulator`` on an OpenAI-compatible
endpoint (standard), or ``ScriptedUser`` (LLM-free plumbing check, see ``config``).
"""

from __future__ import annotations

import os
from typing import Any

from envace.core.wire import ToolCallParse, parse_tool_calls
from envace.envs.tau2.config import Tau2Config, Tau2Mode
from envace.envs.tau2.upstream import tau2

_t = tau2()
_msg = _t.message
EMPTY_REPLY = "(empty reply)"


def incoming_messages(message: Any) -> list[Any]:
    """The tau2 messages an agent absorbs for one incoming message (tool batches are unpacked)."""
    if message is None:
        return []
    if isinstance(message, _msg.MultiToolMessage):
        return list(message.tool_messages)
    return [message]


class _Bridge:
    """Shared behaviour of the bridged agents (a mixin placed before the tau2 agent class)."""

    pending: str | None = None
    last_parse: ToolCallParse | None = None
    failed: bool = False
    preamble: tuple[Any, ...] = ()  # extra tau2 messages put at the start of a fresh state (turn hook)

    def request_messages(self, message: Any, state: Any) -> list[dict[str, Any]]:
        """The chat messages the next generation sees (state + the incoming message, not absorbed)."""
        history = [*state.system_messages, *state.messages, *incoming_messages(message)]
        return tau2().llm_utils.to_litellm_messages(history)

    def get_init_state(self, message_history: list[Any] | None = None) -> Any:
        state = super().get_init_state(message_history)  # type: ignore[misc]
        state.messages[:0] = list(self.preamble)
        return state

    def set_seed(self, seed: int) -> None:
        """Seeds are set per request by the episode program."""

    def take_pending(self, state: Any) -> Any:
        """The prepared generation as a tau2 ``AssistantMessage`` (ids unique within the episode)."""
        text, self.pending = self.pending, None
        if text is None:
            raise RuntimeError("bridged τ² agent asked to answer before a generation was prepared")
        parse = parse_tool_calls(text)
        self.last_parse = parse
        calls = [
            _msg.ToolCall(
                id=f"call_{len(state.messages)}_{i}", name=c.name, arguments=dict(c.arguments), requestor="assistant"
            )
            for i, c in enumerate(parse.calls)
        ]
        content = parse.content.strip()
        self.failed = bool(parse.errors) or not (calls or content)
        if not calls and not content:
            content = EMPTY_REPLY  # tau2 rejects empty messages; the episode ends on ``failed`` anyway
        return _msg.AssistantMessage(
            role="assistant", content=content or None, tool_calls=calls or None, raw_data={"text": text}, cost=0.0
        )


class BridgedAgent(_Bridge, _t.llm_agent.LLMAgent):
    """tau2's standard agent, answering with prepared generations."""

    def __init__(self, tools: list[Any], domain_policy: str) -> None:
        super().__init__(tools=tools, domain_policy=domain_policy, llm=None, llm_args={})

    def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
        state.messages.extend(incoming_messages(message))
        reply = self.take_pending(state)
        state.messages.append(reply)
        return reply, state


class BridgedSoloAgent(_Bridge, _t.llm_agent.LLMSoloAgent):
    """tau2's solo agent (ticket, customer tools, ``done``), answering with prepared generations."""

    def __init__(self, tools: list[Any], domain_policy: str, task: Any) -> None:
        super().__init__(tools=tools, domain_policy=domain_policy, task=task, llm=None, llm_args={})

    def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
        if isinstance(message, _msg.UserMessage):
            raise TypeError("a solo τ² agent receives no customer messages")
        state.messages.extend(incoming_messages(message))
        reply = self.take_pending(state)
        if reply.tool_calls:
            reply = self._check_if_stop_toolcall(reply)
        state.messages.append(reply)
        return reply, state


def opening_text(task: Any) -> str:
    """What the scripted customer says first: the reason for the call (or the whole scenario)."""
    instructions = task.user_scenario.instructions
    reason = getattr(instructions, "reason_for_call", None)
    return str(reason or instructions).strip()


class ScriptedUser(_t.user_base.BaseUser):
    """LLM-free customer: gold customer actions, then the reason for the call, then stop."""

    def __init__(self, task: Any) -> None:
        super().__init__(instructions=str(task.user_scenario), llm=None, llm_args={})
        actions = task.evaluation_criteria.actions if task.evaluation_criteria else None
        self._actions = [a for a in actions or [] if a.requestor == "user"]
        self._opening = opening_text(task)
        self._said = 0

    def get_init_state(self, message_history: list[Any] | None = None) -> Any:
        return _t.user_base.UserState(system_messages=[], messages=list(message_history or []))

    @classmethod
    def is_stop(cls, message: Any) -> bool:
        return _t.user_simulator.UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:
        """Deterministic: nothing to seed."""

    def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
        state.messages.extend(incoming_messages(message))
        if self._actions:
            calls = [
                _msg.ToolCall(id=f"user_{i}", name=a.name, arguments=dict(a.arguments), requestor="user")
                for i, a in enumerate(self._actions)
            ]
            self._actions = []
            reply = _msg.UserMessage(role="user", tool_calls=calls, cost=0.0)
        else:
            self._said += 1
            text = self._opening if self._said == 1 else _t.user_base.STOP
            reply = _msg.UserMessage(role="user", content=text, cost=0.0)
        state.messages.append(reply)
        return reply, state


class BridgedUser(_t.user_simulator.UserSimulator):
    """tau2's user simulator (its prompt, role flipping, tools) answering with prepared generations.

    A reply that holds no call and no text ends the conversation (it is read as tau2's stop signal)."""

    pending: str | None = None

    def set_seed(self, seed: int) -> None:
        """Seeds are set per request by the episode program."""

    def request_messages(self, message: Any, state: Any) -> list[dict[str, Any]]:
        """What the customer's next generation sees (tau2's flipped view; the message is not absorbed)."""
        view = _t.user_base.UserState(
            system_messages=state.system_messages, messages=[*state.messages, *incoming_messages(message)]
        )
        return tau2().llm_utils.to_litellm_messages([*view.system_messages, *view.flip_roles()])

    def _generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
        state.messages.extend(incoming_messages(message))
        text, self.pending = self.pending, None
        if text is None:
            raise RuntimeError("bridged τ² customer asked to answer before a generation was prepared")
        parse = parse_tool_calls(text)
        calls = [
            _msg.ToolCall(
                id=f"user_{len(state.messages)}_{i}", name=c.name, arguments=dict(c.arguments), requestor="user"
            )
            for i, c in enumerate(parse.calls)
        ]
        content = parse.content.strip() or (None if calls else _t.user_base.STOP)
        reply = _msg.UserMessage(
            role="user", content=content, tool_calls=calls or None, cost=0.0, raw_data={"text": text}
        )
        state.messages.append(reply)
        return reply, state


def user_llm_name(model: str) -> str:
    """LiteLLM model name for an OpenAI-compatible endpoint (``openai/`` prefix unless a provider is given)."""
    return model if model.split("/", 1)[0] in {"openai", "hosted_vllm", "azure"} else f"openai/{model}"


def make_user(config: Tau2Config, task: Any, user_tools: list[Any] | None) -> Any:
    """The customer seat for ``config.mode``."""
    sim = _t.user_simulator
    if config.mode is Tau2Mode.SOLO:
        return sim.DummyUser(tools=user_tools, instructions=str(task.user_scenario), llm=None, llm_args={})
    if config.mode is Tau2Mode.SCRIPTED_USER:
        return ScriptedUser(task)
    if config.mode is Tau2Mode.USER_SEAT:
        return BridgedUser(tools=user_tools, instructions=str(task.user_scenario), llm=None, llm_args={})
    key = os.environ.get(config.user_api_key_env, "") if config.user_api_key_env else ""
    llm_args = {
        "temperature": config.user_temperature,
        "api_base": config.user_base_url.removesuffix("/chat/completions"),
        "api_key": key or "EMPTY",
    }
    return sim.UserSimulator(
        tools=user_tools, instructions=str(task.user_scenario), llm=user_llm_name(config.user_model), llm_args=llm_args
    )
