"""``ChatBackend`` over any OpenAI-compatible HTTP endpoint (vLLM, sglang, our own ``openai_server``).

``POST {base_url}/chat/completions`` with ``requests``; one ``requests.Session`` per worker thread; at
most ``concurrency`` requests in flight per ``generate`` call; each attempt bounded by ``timeout`` seconds;
timeouts, connection errors, HTTP 5xx/429 and unparseable bodies are retried ``max_retries`` times with
exponential backoff (``backoff_s · 2^attempt``, capped at ``max_backoff_s``). Other HTTP errors (400, 401,
404, ...) are not retried: they will not heal by themselves.

The API key is read from the environment variable *named* by ``api_key_env`` and is never logged or
shown in ``repr``. When the server answers with structured ``tool_calls`` instead of text, they are
rendered back into the Hermes wire format (``<tool_call>{json}</tool_call>``) so callers parse one format.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import requests

from envace.inference.base import ChatOutput, ChatRequest

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class EndpointError(RuntimeError):
    """A chat request failed. ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before retry number ``attempt + 1`` (attempt counts from 0)."""
    return min(cap_s, base_s * (2.0**attempt))


def read_api_key(api_key_env: str | None) -> str | None:
    """The key stored in the environment variable named ``api_key_env`` (None when no name is given)."""
    if not api_key_env:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise EndpointError(
            f"the API key variable {api_key_env!r} is not set; export it or configure a different "
            "api_key_env (or none for endpoints without authentication)"
        )
    return key


def request_payload(model: str, request: ChatRequest, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON body of one chat completion request."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(request.messages),
        "temperature": request.temperature,
        "max_tokens": request.max_new_tokens,
        "seed": request.seed,
    }
    if request.tools:
        body["tools"] = list(request.tools)
    if request.stop:
        body["stop"] = list(request.stop)
    body.update(extra or {})
    return body


def _hermes_tool_calls(tool_calls: Any) -> str:
    blocks = []
    for call in tool_calls if isinstance(tool_calls, list) else []:
        fn = call.get("function", {}) if isinstance(call, Mapping) else {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass  # keep the raw string: the caller's parser reports the bad arguments
        blocks.append(
            "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"
        )
    return "\n".join(blocks)


def parse_completion(body: Any) -> ChatOutput:
    """A ``ChatOutput`` from a chat.completion response body; ``EndpointError`` when it is malformed."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise TypeError(f"message.content is {type(content).__name__}")
        calls = _hermes_tool_calls(message.get("tool_calls"))
        usage = body.get("usage") or {}
        return ChatOutput(
            text=(content + ("\n" if content and calls else "") + calls),
            prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
            completion_tokens=int(usage.get("completion_tokens", 0) or 0),
            finish_reason=str(choice.get("finish_reason") or "stop"),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise EndpointError(f"malformed chat completion body: {exc}", retryable=True) from None


class OpenAIChatBackend:
    """``ChatBackend`` talking to ``{base_url}/chat/completions``; ``base_url`` ends in ``/v1``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        concurrency: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("OpenAIChatBackend: need concurrency >= 1, max_retries >= 0 and timeout > 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self._api_key = read_api_key(api_key_env)
        self._local = threading.local()

    def __repr__(self) -> str:  # never show the key
        return (
            f"OpenAIChatBackend(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r})"
        )

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            if self._api_key:
                session.headers["Authorization"] = f"Bearer {self._api_key}"
            self._local.session = session
        return session

    def _post_once(self, request: ChatRequest) -> ChatOutput:
        url = f"{self.base_url}/chat/completions"
        try:
            resp = self._session().post(
                url, json=request_payload(self.model, request, self.extra_body), timeout=self.timeout
            )
        except requests.Timeout:
            raise EndpointError(f"no answer from {url} within {self.timeout}s", retryable=True) from None
        except requests.RequestException as exc:
            raise EndpointError(f"request to {url} failed: {type(exc).__name__}", retryable=True) from None
        if resp.status_code != 200:
            raise EndpointError(
                f"{url} answered HTTP {resp.status_code}: {resp.text[:200]!r}",
                status=resp.status_code,
                retryable=resp.status_code in RETRYABLE_STATUS,
            )
        try:
            body = resp.json()
        except ValueError:
            raise EndpointError(
                f"{url} answered a body that is not JSON", status=200, retryable=True
            ) from None
        return parse_completion(body)

    def complete(self, request: ChatRequest) -> ChatOutput:
        """One request with retries; raises the last ``EndpointError`` when every attempt failed."""
        for attempt in range(self.max_retries + 1):
            try:
                return self._post_once(request)
            except EndpointError as exc:
                if not exc.retryable or attempt == self.max_retries:
                    raise
                delay = backoff_delay(attempt, self.backoff_s, self.max_backoff_s)
                logger.warning(
                    "%s (attempt %d/%d); retrying in %.2fs", exc, attempt + 1, self.max_retries + 1, delay
                )
                time.sleep(delay)
        raise AssertionError("unreachable")

    def generate(self, requests_: Sequence[ChatRequest]) -> list[ChatOutput]:
        """Answer a batch (order preserved), ``concurrency`` at a time; raises if any request failed."""
        if len(requests_) <= 1:
            return [self.complete(r) for r in requests_]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests_))) as pool:
            futures = [pool.submit(self.complete, r) for r in requests_]
            return [f.result() for f in futures]

    def list_models(self) -> list[str]:
        """Model ids the endpoint serves (``GET /models``)."""
        try:
            resp = self._session().get(f"{self.base_url}/models", timeout=self.timeout)
            resp.raise_for_status()
            return [str(m["id"]) for m in resp.json()["data"]]
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            raise EndpointError(f"listing models at {self.base_url} failed: {type(exc).__name__}") from None
