"""One VitaBench conversation as a generation program: agent (seat ``ACTOR``), simulated user, real tools.

Flow (the reference orchestrator's, ``vita/orchestrator/orchestrator.py``): the agent's fixed greeting opens;
then, until someone stops, the user simulator writes the next user message (``###STOP###`` and the other
markers end the conversation) and the agent answers with up to ``max_steps_per_turn`` generations — tool
calls are run on the task's ``VitaExecutor`` and their results appended; a text reply goes back to the user,
and a reply containing ``###STOP###`` ends the conversation. Budgets: ``max_steps`` counts every message
(user, agent, tool batch) as in the reference; an empty agent reply is regenerated up to 3 times with new
seeds, then ends the episode (the reference's INVALID_AGENT_MESSAGE). An unparseable tool-call block also
ends it (docs/method.md §1). Those premature ends score 0 without judging, as in the reference.

The user simulator is a ``ChatBackend`` (usually an OpenAI-compatible endpoint) called directly from the
program, not through a seat, so ``evaluation.evaluate`` works unchanged; its calls and seconds go to the
episode's ledger under purpose ``user_simulator``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envace.core.prompts import Message, act_messages, act_observation_messages
from envace.core.records import ToolCall, Turn
from envace.core.seeds import derive_seed
from envace.core.wire import parse_tool_calls
from envace.envs.vitabench.prompts import STOP, flip_for_user, is_stop, user_system_prompt
from envace.evaluation.episode import ActLoopConfig, trial_tag
from envace.evaluation.programs import ACTOR, GenerationCall, GenerationLedger, GenerationReply, Program, generate_one
from envace.inference.base import ChatBackend, ChatRequest

EMPTY_REPLY_RETRIES = 3


@dataclass(frozen=True)
class VitaLoopConfig:
    act: ActLoopConfig = field(default_factory=ActLoopConfig)
    max_steps: int = 300
    user_max_new_tokens: int = 512
    user_temperature: float = 0.0


@dataclass
class ConversationState:
    agent_messages: list[Message]
    transcript: list[Message]  # what the judge and the user simulator see (no system message)
    turns: list[Turn] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    steps: int = 0
    generations: int = 0
    parse_failures: int = 0
    codes: list[str] = field(default_factory=list)
    user_turns: int = 0
    end: str = ""  # user_stop | agent_stop | max_steps | invalid_agent_message | act_parse_error

    @property
    def premature(self) -> bool:
        return self.end not in ("user_stop", "agent_stop")


class VitaConversation:
    """Runs one conversation (see the module docstring); ``run()`` is the program."""

    def __init__(
        self,
        task_id: str,
        system_prompt: str,
        tools: tuple[dict[str, Any], ...],
        greeting: str,
        persona: dict[str, Any],
        instructions: str,
        language: str,
        executor: Any,
        user: ChatBackend,
        config: VitaLoopConfig,
        ledger: GenerationLedger,
        trial: int = 0,
    ) -> None:
        system = act_messages(config.act.role_prompts, system_prompt, "")[0]
        opening = {"role": "assistant", "content": greeting}
        self.state = ConversationState([system, opening], [opening])
        self.task_id, self.tools, self.executor, self.user = task_id, tools, executor, user
        self.user_system = user_system_prompt(persona, instructions, language)
        self.config, self.ledger = config, ledger
        self.user_tag, self.act_tag = trial_tag("user", trial), trial_tag("act", trial)  # trials draw apart

    # ---- user side ----
    def user_says(self) -> str:
        cfg, st = self.config, self.state
        messages = ({"role": "system", "content": self.user_system}, *flip_for_user(st.transcript))
        for attempt in range(EMPTY_REPLY_RETRIES):
            request = ChatRequest(
                messages=messages,
                temperature=cfg.user_temperature,
                max_new_tokens=cfg.user_max_new_tokens,
                seed=derive_seed(cfg.act.seed, self.task_id, self.user_tag, st.user_turns, attempt),
            )
            start = time.perf_counter()
            output = self.user.generate([request])[0]
            self.ledger.add(
                GenerationCall("user_simulator", "user_simulator", request),
                GenerationReply(output, None, time.perf_counter() - start),
            )
            if output.text.strip():
                return output.text.strip()
        raise RuntimeError(f"user simulator returned {EMPTY_REPLY_RETRIES} empty messages for task {self.task_id}")

    # ---- agent side ----
    def _generate(self, turn: int, step: int) -> Program[tuple[str, Any]]:
        """(raw text, parse) of the agent's next message, regenerating empty replies."""
        act, st = self.config.act, self.state
        for attempt in range(EMPTY_REPLY_RETRIES):
            request = ChatRequest(
                messages=tuple(st.agent_messages),
                tools=self.tools,
                temperature=act.temperature,
                max_new_tokens=act.max_new_tokens,
                seed=derive_seed(act.seed, self.task_id, self.act_tag, turn, step, attempt),
            )
            output = yield from generate_one(GenerationCall(ACTOR, "act", request), self.ledger)
            st.generations += 1
            parse = parse_tool_calls(output.text)
            if not (parse.is_final and not parse.content.strip()):
                return output.text, parse
        return "", None

    def _run_calls(self, text: str, parse: Any, turn: int, step: int) -> None:
        st = self.state
        calls = tuple(ToolCall(c.name, c.arguments, f"call_{turn}_{step}_{i}") for i, c in enumerate(parse.calls))
        responses = tuple(self.executor.execute(c) for c in calls)
        assistant = {"role": "assistant", "content": parse.content, "tool_calls": [c.to_openai() for c in calls]}
        observations = act_observation_messages(calls, responses)
        st.agent_messages.extend([assistant, *observations])
        st.transcript.extend([assistant, *observations])
        st.turns.append(Turn(text, calls, responses, rehearsed=False, user_turn=turn))
        st.steps += 2

    def agent_turn(self, turn: int) -> Program[str | None]:
        """The agent's steps after one user message; returns an end reason or None (back to the user)."""
        st = self.state
        for step in range(self.config.act.max_steps_per_turn):
            if st.steps >= self.config.max_steps:
                return "max_steps"
            text, parse = yield from self._generate(turn, step)
            if parse is None:
                return "invalid_agent_message"
            if not parse.ok:
                st.parse_failures += 1
                st.codes.extend(e.code.value for e in parse.errors)
                st.turns.append(Turn(act_text=text, rehearsed=False, user_turn=turn))
                return "act_parse_error"
            if parse.is_final:
                reply = {"role": "assistant", "content": parse.content}
                st.agent_messages.append(reply)
                st.transcript.append(reply)
                st.turns.append(Turn(act_text=text, rehearsed=False, user_turn=turn))
                st.answers.append(parse.content)
                st.steps += 1
                return "agent_stop" if STOP in parse.content else None
            self._run_calls(text, parse, turn, step)
        return "max_steps"

    def run(self) -> Program[ConversationState]:
        st = self.state
        while not st.end:
            if st.steps >= self.config.max_steps:
                st.end = "max_steps"
                break
            text = self.user_says()
            message = {"role": "user", "content": text}
            st.agent_messages.append(message)
            st.transcript.append(message)
            st.steps += 1
            if is_stop(text):
                st.end = "user_stop"
                break
            st.end = (yield from self.agent_turn(st.user_turns)) or ""
            st.user_turns += 1
        return st
