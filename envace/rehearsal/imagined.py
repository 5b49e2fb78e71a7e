"""The imagined environment of a private rehearsal attempt: tool responses come from the REHEARSE role.

``RehearserResponder`` implements the ACT loop's responder protocol without any executor. Every call is
answered by the ``REHEARSER`` seat from ``envace.core.rehearse_context.rehearse_context`` — the layout
the REHEARSE role is trained on — over the history the ACT loop hands it: the real conversation the
attempt started from (turn scope), then the attempt's own user turns, visible ACT text, and earlier
calls with the rehearser's own answers. A response that does not parse ends the attempt
(``ResponseBatch.ok=False``), as in training.
"""

from __future__ import annotations

from typing import Any

from envace.core.prompts import RolePrompts
from envace.core.records import ToolCall
from envace.core.rehearse_context import DEFAULT_CONTEXT_TOKENS, Answered, Event, rehearse_context
from envace.core.seeds import derive_seed
from envace.core.wire import parse_rehearsal
from envace.evaluation.episode import ResponseBatch
from envace.evaluation.programs import REHEARSER, GenerationCall, GenerationLedger, Program, generate_one
from envace.inference.base import ChatRequest


class RehearserResponder:
    """Answers tool calls with the rehearser's imagined responses (holds no executor by design)."""

    rehearsed = True

    def __init__(
        self,
        tools: tuple[dict[str, Any], ...],
        role_prompts: RolePrompts,
        ledger: GenerationLedger,
        *,
        max_new_tokens: int,
        temperature: float,
        seed_parts: tuple[object, ...],
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    ) -> None:
        self._tools = tools
        self._prompts = role_prompts
        self._ledger = ledger
        self._max_new_tokens = max_new_tokens
        self._temperature = temperature
        self._seed_parts = seed_parts
        self._context_tokens = context_tokens
        self.answered = 0

    def respond(
        self, calls: tuple[ToolCall, ...], user_turn: int, user_text: str, history: tuple[Event, ...] = ()
    ) -> Program[ResponseBatch]:
        responses: list[Any] = []
        texts: list[str | None] = []
        events = list(history)
        for call in calls:
            request = ChatRequest(
                messages=tuple(rehearse_context(self._prompts, self._tools, events, call, self._context_tokens)),
                tools=None,
                temperature=self._temperature,
                max_new_tokens=self._max_new_tokens,
                seed=derive_seed(*self._seed_parts, "rehearse", self.answered),
            )
            output = yield from generate_one(GenerationCall(REHEARSER, "rehearse", request), self._ledger)
            self.answered += 1
            parsed = parse_rehearsal(output.text)
            if not parsed.ok:
                return ResponseBatch(
                    tuple(responses),
                    ok=False,
                    error_codes=tuple(e.code.value for e in parsed.errors),
                    texts=tuple(texts),
                )
            events.append(Answered(call, parsed.result, output.text))
            responses.append(parsed.result)
            texts.append(output.text)
        return ResponseBatch(tuple(responses), texts=tuple(texts))
