"""τ² tasks (tau2's bundled data) and their envace ``Task`` view (imports tau2).

A task id is ``"<domain>:<tau2 id>"`` (tau2 ids repeat across domains). The envace view carries what
rehearsal and oracles read: the agent's system prompt for the mode (tau2's own text; solo mode includes
the ticket), the agent's tools (solo: plus the customer's device tools and ``done``), one user turn (the
ticket in solo mode, else the customer's reason for calling), and the gold actions as one call per step
(solo: every action, then ``done``; otherwise the agent's actions) with the information to communicate
as the gold answer. The tau2 task itself is in ``meta["tau2_task"]``.
"""

from __future__ import annotations

import functools
from typing import Any

from envace.core.env import Task
from envace.core.records import ToolCall
from envace.envs.tau2.agent import BridgedAgent, BridgedSoloAgent, opening_text
from envace.envs.tau2.config import Tau2Mode
from envace.envs.tau2.upstream import tau2


@functools.cache
def load_tau2_tasks(domain: str, split: str) -> tuple[Any, ...]:
    """tau2's tasks of a domain split (``base`` is the standard set)."""
    splits = tau2().registry.get_task_splits_loader(domain)
    if splits is not None and split not in (names := splits()):
        raise KeyError(f"τ² {domain} has no split {split!r}; valid: {', '.join(sorted(names))}")
    return tuple(tau2().registry.get_tasks_loader(domain)(task_split_name=split))


def make_environment(domain: str, solo: bool) -> Any:
    """A fresh tau2 environment of ``domain`` (initial database; solo mode when asked)."""
    constructor = tau2().registry.get_env_constructor(domain)
    return constructor(solo_mode=True) if solo else constructor()


def user_tools(environment: Any) -> list[Any] | None:
    """The customer-side tools of an environment (None for domains without them)."""
    try:
        return environment.get_user_tools()
    except Exception:  # noqa: BLE001 - tau2 raises a bare ValueError when a domain has none
        return None


@functools.cache
def domain_view(domain: str, solo: bool) -> tuple[str, tuple[Any, ...]]:
    """(policy text, agent tools) of a domain — identical for every task, so built once."""
    environment = make_environment(domain, solo)
    tools = environment.get_tools() + ((user_tools(environment) or []) if solo else [])
    return environment.get_policy(), tuple(tools)


def make_agent(domain: str, mode: Tau2Mode, task: Any) -> Any:
    """The bridged agent of ``mode`` (tau2's prompts and tool lists; tools are only shown, never run)."""
    policy, tools = domain_view(domain, mode is Tau2Mode.SOLO)
    if mode is Tau2Mode.SOLO:
        return BridgedSoloAgent(list(tools), policy, task)
    return BridgedAgent(list(tools), policy)


def solo_valid(task: Any) -> bool:
    return bool(tau2().llm_agent.LLMSoloAgent.check_valid_task(task))


def _gold(task: Any, mode: Tau2Mode) -> tuple[tuple[tuple[ToolCall, ...], ...], str]:
    criteria = task.evaluation_criteria
    actions = list(criteria.actions or []) if criteria else []
    if mode is not Tau2Mode.SOLO:
        actions = [a for a in actions if a.requestor == "assistant"]
    steps = [(ToolCall(a.name, dict(a.arguments)),) for a in actions]
    if mode is Tau2Mode.SOLO:
        steps.append((ToolCall(tau2().llm_agent.LLMSoloAgent.STOP_FUNCTION_NAME, {}),))
    info = (criteria.communicate_info or []) if criteria else []
    return tuple(steps), " ".join(str(i) for i in info)


def to_task(task: Any, domain: str, split: str, mode: Tau2Mode) -> Task:
    """The envace view of a tau2 task in ``mode`` (see the module docstring)."""
    agent = make_agent(domain, mode, task)
    steps, answer = _gold(task, mode)
    first_turn = str(task.ticket) if mode is Tau2Mode.SOLO else opening_text(task)
    return Task(
        task_id=f"{domain}:{task.id}",
        domain=domain,
        split=split,
        system_prompt=agent.system_prompt,
        tools=tuple(t.openai_schema for t in agent.tools),
        user_turns=(first_turn,),
        gold_calls=(steps,),
        gold_answers=(answer,),
        meta={"benchmark": "tau2", "tau2_task": task, "tau2_domain": domain, "tau2_mode": mode.value},
    )
