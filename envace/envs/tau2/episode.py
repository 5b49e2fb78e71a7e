"""One τ² simulation as a generation program: tau2's ``Orchestrator`` driven step by step.

``Orchestrator.run()`` calls the agent synchronously; a generation program must instead *yield* its
requests. So the program does what ``run()`` does — ``initialize()``, then ``step()`` until done, with
the same max-steps / max-errors checks after each step and the same wrap-up into a ``SimulationRun`` —
and before every step that will ask the agent, it yields the agent's request to the ``ACTOR`` seat and
hands the reply to the bridged agent (``agent.pending``). In solo mode the first agent message is
produced inside ``initialize()``, so that generation is prepared before it. Everything else (customer,
environment, message validation, termination reasons) is tau2's own code. The repetition judge of
``run()`` is off (no judge LLM), as in tau2's default.

Additions: an ACT parse failure (malformed call block, empty reply) ends the simulation as tau2's
``AGENT_ERROR``; a ``turn_hook`` may add messages to the agent's context before each customer turn
(solo: before the ticket is worked on). The reward is tau2's ``evaluate_simulation`` (``ALL``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from envace.core.records import Termination, ToolCall, Turn
from envace.core.rehearse_context import events_from_messages
from envace.core.seeds import derive_seed
from envace.envs.tau2.config import Tau2Config
from envace.envs.tau2.executor import decode_tool_message
from envace.envs.tau2.upstream import tau2
from envace.evaluation.episode import TurnHook, TurnView
from envace.evaluation.programs import (
    ACTOR,
    GenerationCall,
    GenerationLedger,
    Program,
    generate_one,
)
from envace.inference.base import ChatRequest

CUSTOMER = "customer"  # generation seat of the customer in ``user_seat`` mode


@dataclass
class SimulationStats:
    generations: int = 0
    parse_failures: int = 0
    codes: list[str] = field(default_factory=list)
    start_time: str = ""


def generation_seed(seed: int, task_id: str, trial: int, index: int) -> int:
    """Sampling seed of the ``index``-th agent generation of a task trial."""
    return derive_seed(seed, task_id, trial, index)


def _prepare(
    agent: Any,
    message: Any,
    state: Any,
    tools: tuple[dict[str, Any], ...],
    config: Tau2Config,
    ledger: GenerationLedger,
    seed_tag: tuple[str, int],
    stats: SimulationStats,
) -> Program[None]:
    """Generate the agent's next message and leave it with the agent."""
    request = ChatRequest(
        messages=tuple(agent.request_messages(message, state)),
        tools=tools,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=generation_seed(config.seed, *seed_tag, stats.generations),
    )
    output = yield from generate_one(GenerationCall(ACTOR, "act", request), ledger)
    stats.generations += 1
    agent.pending = output.text


def _prepare_customer(
    orch: Any, config: Tau2Config, ledger: GenerationLedger, seed_tag: tuple[str, int]
) -> Program[None]:
    """Generate the customer's next message (``user_seat`` mode) and leave it with the customer."""
    user = orch.user
    request = ChatRequest(
        messages=tuple(user.request_messages(orch.message, orch.user_state)),
        tools=tuple(tool.openai_schema for tool in user.tools or ()) or None,
        temperature=config.user_temperature,
        max_new_tokens=config.user_max_new_tokens,
        seed=derive_seed(config.seed, *seed_tag, "customer", orch.step_count),
    )
    output = yield from generate_one(GenerationCall(CUSTOMER, "customer", request), ledger)
    user.pending = output.text


def _failed(agent: Any, stats: SimulationStats) -> bool:
    """Whether the agent's last message was an ACT parse failure (counted once)."""
    if not agent.failed:
        return False
    agent.failed = False
    stats.parse_failures += 1
    errors = agent.last_parse.errors if agent.last_parse is not None else ()
    stats.codes.extend([e.code.value for e in errors] or ["EMPTY_OUTPUT"])
    return True


def _end(orch: Any, reason: Any) -> None:
    orch.done = True
    orch.termination_reason = reason


def _hook_notes(hook: TurnHook | None, orch: Any, turn: int) -> Program[list[Any]]:
    """Turn-hook messages as tau2 messages for the agent's context."""
    if hook is None:
        return []
    msg = tau2().message
    history = tau2().llm_utils.to_litellm_messages(list(orch.agent_state.messages)) if orch.agent_state else []
    notes = yield from hook(TurnView(turn, tuple(history), tuple(events_from_messages(history))))
    make = {"system": msg.SystemMessage, "assistant": msg.AssistantMessage}
    return [
        make.get(n.get("role"), msg.UserMessage)(role=n.get("role", "user"), content=str(n.get("content", "")))
        for n in notes
    ]


def simulate(
    orch: Any,
    agent: Any,
    config: Tau2Config,
    ledger: GenerationLedger,
    seed_tag: tuple[str, int],
    hook: TurnHook | None = None,
) -> Program[SimulationStats]:
    """Run ``orch`` to the end, answering agent turns through the ``ACTOR`` seat (and, with a bridged
    customer, customer turns through the ``CUSTOMER`` seat)."""
    t = tau2()
    stats = SimulationStats(start_time=t.utils.get_now())
    tools = tuple(tool.openai_schema for tool in agent.tools)
    history = orch.task.initial_state.message_history if orch.task.initial_state else None
    solo_first = orch.solo_mode and not history
    if solo_first:
        agent.preamble = tuple((yield from _hook_notes(hook, orch, 0)))
        yield from _prepare(agent, None, agent.get_init_state(), tools, config, ledger, seed_tag, stats)
    orch.initialize()
    if solo_first and _failed(agent, stats):
        _end(orch, t.simulation.TerminationReason.AGENT_ERROR)
    turn = 0
    bridged_user = hasattr(orch.user, "request_messages")
    while not orch.done:
        if bridged_user and orch.to_role == t.orchestrator.Role.USER:
            yield from _prepare_customer(orch, config, ledger, seed_tag)
        asks_agent = orch.to_role == t.orchestrator.Role.AGENT
        if asks_agent:
            if isinstance(orch.message, t.message.UserMessage) and not orch.solo_mode:
                orch.agent_state.messages.extend((yield from _hook_notes(hook, orch, turn)))
                turn += 1
            yield from _prepare(agent, orch.message, orch.agent_state, tools, config, ledger, seed_tag, stats)
        orch.step()
        if asks_agent and _failed(agent, stats):
            _end(orch, t.simulation.TerminationReason.AGENT_ERROR)
            break
        if orch.to_role == t.orchestrator.Role.ENV:
            continue
        if orch.step_count >= orch.max_steps:
            _end(orch, t.simulation.TerminationReason.MAX_STEPS)
        if orch.num_errors >= orch.max_errors:
            _end(orch, t.simulation.TerminationReason.TOO_MANY_ERRORS)
    return stats


def finish(orch: Any, stats: SimulationStats, duration: float) -> Any:
    """The ``SimulationRun`` of a finished orchestrator (what ``Orchestrator.run`` returns)."""
    t = tau2()
    reasons = t.simulation.TerminationReason
    has_error = orch.termination_reason in (reasons.USER_ERROR, reasons.AGENT_ERROR)
    roles = t.orchestrator.Role
    if orch.to_role == roles.ENV and not has_error:
        raise ValueError(f"τ² simulation ended with a message to the environment: {orch.message}")
    orch.agent.stop(orch.message if orch.to_role == roles.AGENT else None, orch.agent_state)
    orch.user.stop(orch.message if orch.to_role == roles.USER else None, orch.user_state)
    messages = orch.get_trajectory()
    costs = t.llm_utils.get_cost(messages)
    agent_cost, user_cost = costs if costs is not None else (None, None)
    return t.simulation.SimulationRun(
        id=str(uuid.uuid4()),
        task_id=orch.task.id,
        start_time=stats.start_time,
        end_time=t.utils.get_now(),
        duration=duration,
        termination_reason=orch.termination_reason.value,
        reward_info=None,
        user_cost=user_cost,
        agent_cost=agent_cost,
        messages=messages,
        seed=orch.seed,
    )


def evaluate(simulation: Any, task: Any, domain: str, solo: bool) -> Any:
    """tau2's reward for a simulation (DB / env assertions / actions / communicated info)."""
    ev = tau2().evaluator
    return ev.evaluate_simulation(
        simulation=simulation, task=task, evaluation_type=ev.EvaluationType.ALL, solo_mode=solo, domain=domain
    )


def trajectory_turns(messages: list[Any]) -> tuple[list[Turn], list[str]]:
    """Agent generations as ``Turn`` records (real responses decoded) and the last reply of each user turn."""
    msg = tau2().message
    responses = {
        m.id: decode_tool_message(m) for m in messages if isinstance(m, msg.ToolMessage) and m.requestor == "assistant"
    }
    turns: list[Turn] = []
    answers: list[str] = []
    user_turn = -1
    for m in messages:
        if isinstance(m, msg.UserMessage) and m.has_text_content():
            user_turn += 1
        if not isinstance(m, msg.AssistantMessage) or not (m.raw_data or {}).get("text"):
            continue  # only the policy's generations (not tau2's fixed greeting)
        calls = tuple(ToolCall(c.name, dict(c.arguments), c.id) for c in m.tool_calls or ())
        turn = max(user_turn, 0)
        turns.append(Turn(m.raw_data["text"], calls, tuple(responses.get(c.id) for c in calls), False, turn))
        if not calls and m.has_text_content():
            answers.extend([""] * (turn + 1 - len(answers)))
            answers[turn] = str(m.content)
    return turns, answers


def termination_of(reason: str, stats: SimulationStats) -> Termination:
    """envace's termination label for a tau2 termination reason."""
    if reason in ("agent_stop", "user_stop"):
        return Termination.FINAL_REPLY
    if reason == "max_steps":
        return Termination.MAX_STEPS
    if reason == "agent_error" and stats.parse_failures:
        return Termination.ACT_PARSE_ERROR
    return Termination.ERROR
