"""The imagined environment of a private rehearsal attempt: tool responses come from the REHEARSE role.

``RehearserResponder`` implements the ACT loop's responder protocol without any executor: it keeps one
REHEARSE stream per attempt (SPEC §1 rollout shape) — the REHEARSE system prompt with the tool schemas
and the real (call, response) examples of earlier user turns, then for every call a user message with
the call and the rehearser's own answer — and asks the ``REHEARSER`` seat for one response per call.
A response that does not parse ends the attempt (``ResponseBatch.ok=False``), as in training.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from envace.core.prompts import RolePrompts, rehearse_call_message, rehearse_messages, tool_function
from envace.core.records import ToolCall
from envace.core.seeds import derive_seed
from envace.core.wire import as_result_object, parse_rehearsal
from envace.evaluation.episode import ResponseBatch
from envace.evaluation.programs import REHEARSER, GenerationCall, GenerationLedger, Program, generate_one
from envace.inference.base import ChatRequest


def _schema_for(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((t for t in tools if tool_function(t).get("name") == name), None)


class RehearserResponder:
    """Answers tool calls with the rehearser's imagined responses (holds no executor by design)."""

    rehearsed = True

    def __init__(
        self,
        tools: tuple[dict[str, Any], ...],
        examples: tuple[tuple[ToolCall, Any], ...],
        role_prompts: RolePrompts,
        ledger: GenerationLedger,
        *,
        max_new_tokens: int,
        temperature: float,
        seed_parts: tuple[object, ...],
    ) -> None:
        shaped = [(c, as_result_object(r)) for c, r in examples]
        self._tools = tools
        self._prompts = role_prompts
        self._ledger = ledger
        self._max_new_tokens = max_new_tokens
        self._temperature = temperature
        self._seed_parts = seed_parts
        self._stream: list[dict[str, Any]] = list(rehearse_messages(role_prompts, tools, shaped))
        self.answered = 0

    def respond(self, calls: tuple[ToolCall, ...], user_turn: int, user_text: str) -> Program[ResponseBatch]:
        responses: list[Any] = []
        for call in calls:
            message = rehearse_call_message(self._prompts, call, _schema_for(self._tools, call.name), user_text)
            request = ChatRequest(
                messages=tuple([*self._stream, message]),
                tools=None,
                temperature=self._temperature,
                max_new_tokens=self._max_new_tokens,
                seed=derive_seed(*self._seed_parts, "rehearse", self.answered),
            )
            output = yield from generate_one(GenerationCall(REHEARSER, "rehearse", request), self._ledger)
            self.answered += 1
            parsed = parse_rehearsal(output.text)
            if not parsed.ok:
                return ResponseBatch(tuple(responses), ok=False, error_codes=tuple(e.code.value for e in parsed.errors))
            self._stream.extend([message, {"role": "assistant", "content": output.text}])
            responses.append(parsed.result)
        return ResponseBatch(tuple(responses))
