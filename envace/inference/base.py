"""Text-level generation backends: the local HF model and OpenAI-compatible HTTP endpoints.

Evaluation, test-time rehearsal and judges talk to a policy through ``ChatBackend``: chat messages in,
text out. (Training rollouts in the local engine work at token level and use the engine directly.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict[str, Any], ...]  # OpenAI-style chat messages
    tools: tuple[dict[str, Any], ...] | None = None  # OpenAI function schemas, rendered with tools=
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatOutput:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"


class ChatBackend(Protocol):
    """Anything that can answer a batch of chat requests (order preserved)."""

    name: str

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]: ...


def scripted_outputs(answer: Callable[[ChatRequest], str], requests: Sequence[ChatRequest]) -> list[ChatOutput]:
    """Outputs of a scripted (model-free) backend such as an oracle: ``answer(request)`` for each request,
    no prompt tokens, completion tokens counted as whitespace-separated words."""
    return [ChatOutput(text, prompt_tokens=0, completion_tokens=len(text.split())) for text in map(answer, requests)]
