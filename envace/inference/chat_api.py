"""The OpenAI chat.completions wire format as ``envace.inference.openai_server`` speaks it.

Request bodies are parsed by pydantic models: a bad body becomes a ``RequestError`` whose message names
each bad field by its path and says what is expected (``messages.0.role: Field required``). Refused
explicitly rather than ignored: ``stream=true``, ``n`` other than 1, ``logprobs``/``top_logprobs``,
non-text content parts. Other fields pass through as extras (the server logs them once each). Responses
are the chat.completion body and the OpenAI error envelope.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envace.inference.base import ChatOutput, ChatRequest

DEFAULT_MAX_TOKENS = 256


class RequestError(ValueError):
    """A chat request the server cannot serve (answered with HTTP 400)."""


# ---- the request schema ---------------------------------------------------------------------------


class ChatMessage(BaseModel):
    """One chat message; extra keys (``tool_calls``, ``tool_call_id``, ``name``) pass through."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        parts_ok = isinstance(value, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text", ""), str) for p in value
        )
        if not parts_ok:
            raise ValueError(
                "must be a string, null or a list of {'type': 'text', 'text': ...} parts "
                "(image, audio and file parts are not supported)"
            )
        return "".join(p.get("text", "") for p in value)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatCompletionBody(BaseModel):
    """The part of the chat.completions request body this server reads; other fields are ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None  # answered under the served name whatever is asked for, like a one-model vLLM
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatToolSpec] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @field_validator("stream")
    @classmethod
    def _no_streaming(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("streaming is not supported; send stream=false")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported; send one request per sample")
        return value

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any) -> Any:
        if value:
            raise ValueError("log-probs are not supported by this server; omit logprobs/top_logprobs")
        return value

    def to_chat_request(self) -> ChatRequest:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return ChatRequest(
            messages=tuple(m.model_dump() for m in self.messages),
            tools=tuple(t.model_dump(exclude_unset=True) for t in self.tools) if self.tools else None,
            temperature=self.temperature or 0.0,
            max_new_tokens=self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS,
            seed=self.seed or 0,
            stop=stop,
        )


def describe_validation_error(exc: ValidationError, limit: int = 5) -> str:
    """One line naming every bad field by its path (``messages.0.role: Field required``)."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}" for e in errors[:limit]]
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return "invalid chat completion request: " + "; ".join(parts) + more


def parse_chat_body(body: Any) -> ChatCompletionBody:
    """The validated body (a dict, or raw JSON bytes); ``RequestError`` naming the bad fields otherwise."""
    try:
        if isinstance(body, (bytes, str)):
            return ChatCompletionBody.model_validate_json(body)
        return ChatCompletionBody.model_validate(body)
    except ValidationError as exc:
        raise RequestError(describe_validation_error(exc)) from None


def chat_request_from_body(body: Any) -> ChatRequest:
    """A ``ChatRequest`` from a chat.completions body (dict or JSON bytes); ``RequestError`` when unusable."""
    return parse_chat_body(body).to_chat_request()


# ---- responses ------------------------------------------------------------------------------------


def completion_body(output: ChatOutput, model: str, request_id: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": output.text},
                "finish_reason": output.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
            "total_tokens": output.prompt_tokens + output.completion_tokens,
        },
    }


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """An error in the OpenAI envelope ``{"error": {"message", "type", "code"}}``."""
    return JSONResponse({"error": {"message": message[:2000], "type": kind, "code": status}}, status_code=status)
