"""``ChatBackend`` over any OpenAI-compatible HTTP endpoint (vLLM, sglang, our own ``openai_server``).

Requests go through the ``openai`` SDK (``chat.completions.create``, ``models.list``) with the SDK's own
retries switched off (``max_retries=0``): every retry happens in ONE place, ``RetryPolicy`` (tenacity),
so that an attempt is counted, logged and backed off once. The policy:

* retried: timeouts, connection errors (refused, reset, DNS), HTTP 408/429/5xx, and answers whose body
  is not a chat completion (not JSON, no ``choices``) - faults that may heal by themselves;
* not retried: other HTTP errors (400, 401, 403, 404, 422 ...): trying again cannot help;
* ``max_retries`` retries after the first attempt, exponential backoff with jitter
  (``backoff_s · 2^n + U(0, backoff_s)``, at most ``max_backoff_s`` seconds), each attempt bounded by
  ``timeout`` seconds.

Every failure is an ``EndpointError`` that names the URL, says what went wrong in words
(``failure_cause``: "connection refused", "no answer within 2s", "HTTP 503 ...") and keeps the SDK's
exception as its ``__cause__``.

The API key is read from the environment variable *named* by ``api_key_env`` (None: an endpoint without
authentication); it is never logged, put in an error or shown in ``repr``, and a server that echoes it
in an error body has it redacted (``envace.utils.secrets``). Without a key the SDK is
handed a placeholder (``EMPTY``, vLLM's convention) so it never falls back on ``OPENAI_API_KEY``.
When the server answers with structured ``tool_calls`` instead of text, they are rendered back into the
Hermes wire format (``<tool_call>{json}</tool_call>``) so callers parse one format.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import openai
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from envace.inference.base import ChatOutput, ChatRequest
from envace.utils.secrets import redact, register_secret

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429})  # and every 5xx
NO_KEY = "EMPTY"  # what the SDK sends as the bearer token to an endpoint without authentication
NO_AUTH_HINT = "set api_key_env: null for an endpoint without authentication"


class EndpointError(RuntimeError):
    """A request to an endpoint failed. ``retryable``: whether trying again may help; ``status``: the HTTP
    status when the server answered; ``url``: the URL asked."""

    def __init__(
        self, message: str, status: int | None = None, retryable: bool = False, url: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.url = url


def is_retryable(exc: BaseException) -> bool:
    """True for an ``EndpointError`` that may heal by itself (the policy's retry condition)."""
    return isinstance(exc, EndpointError) and exc.retryable


def status_is_retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry policy of every endpoint call (module docstring)."""

    max_retries: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"RetryPolicy{(self.max_retries, self.backoff_s, self.max_backoff_s)}: need "
                "max_retries >= 0 and 0 <= backoff_s <= max_backoff_s"
            )

    def retrying(self, retry_on: Callable[[BaseException], bool] = is_retryable, what: str = "request") -> Retrying:
        """A tenacity ``Retrying`` that re-runs its block on exceptions ``retry_on`` accepts, then re-raises."""

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            logger.debug(
                "%s: %s (attempt %d/%d); retrying in %.2fs",
                what,
                exc,
                state.attempt_number,
                self.max_retries + 1,
                state.upcoming_sleep,
            )

        return Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential_jitter(initial=self.backoff_s, max=self.max_backoff_s, jitter=self.backoff_s),
            retry=retry_if_exception(retry_on),
            before_sleep=log_retry,
            reraise=True,
        )


def read_api_key(api_key_env: str | None) -> str | None:
    """The key stored in the environment variable named ``api_key_env`` (None when no name is given)."""
    if not api_key_env:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise EndpointError(
            f"the API key variable {api_key_env!r} (api_key_env) is not set: export it, name the variable that "
            f"holds the key, or {NO_AUTH_HINT}"
        )
    register_secret(key)  # a server that echoes it in an error body: redacted from every error text
    return key


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def failure_cause(exc: BaseException) -> str:
    """What went wrong, in words, from an exception and its causes ("connection refused", "timed out" ...)."""
    chain = _chain(exc)
    root = chain[-1]
    detail = str(root).strip() or type(root).__name__
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "connection refused" in detail.lower():
        return f"connection refused ({detail})"
    if any(isinstance(e, socket.gaierror) for e in chain):
        return f"host name not resolved ({detail})"
    if any(isinstance(e, (TimeoutError, openai.APITimeoutError)) for e in chain) or "timed out" in detail.lower():
        return "timed out"
    return detail


def endpoint_error(exc: BaseException, method: str, url: str, timeout: float) -> EndpointError:
    """``EndpointError`` for an SDK (or body-parsing) exception; the caller raises it ``from exc``."""
    where = f"{method} {url}"
    if isinstance(exc, openai.APITimeoutError):
        return EndpointError(f"{where}: no answer within {timeout:g}s (timed out)", retryable=True, url=url)
    if isinstance(exc, openai.APIConnectionError):
        return EndpointError(f"{where}: cannot connect: {failure_cause(exc)}", retryable=True, url=url)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        hint = {
            401: " (unauthenticated: wrong or missing API key)",
            403: " (forbidden: the key lacks access)",
            404: " (not found: check the base URL, which ends in /v1, and the model name)",
        }.get(status, "")
        body = redact(exc.response.text)[:200] if exc.response is not None else ""
        return EndpointError(
            f"{where} answered HTTP {status}{hint}: {body!r}",
            status=status,
            retryable=status_is_retryable(status),
            url=url,
        )
    # a 200 whose body is not the JSON asked for: a broken proxy or an overloaded server, may heal
    return EndpointError(
        f"{where} answered a malformed body: {type(exc).__name__}: {exc}", status=200, retryable=True, url=url
    )


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
        blocks.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>")
    return "\n".join(blocks)


def parse_completion(body: Any) -> ChatOutput:
    """A ``ChatOutput`` from a chat.completion response body; ``ValueError`` when it is malformed."""
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
        raise ValueError(f"not a chat completion: {type(exc).__name__}: {exc}") from exc


class OpenAIChatBackend:
    """``ChatBackend`` talking to ``{base_url}/chat/completions``; ``base_url`` ends in ``/v1``.

    ``stats`` counts attempts, retries and failed requests over the backend's life; ``last_attempts`` is
    the number of attempts of the latest request made *on the calling thread* (a judge reads it to
    count the requests behind one verdict)."""

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
        if concurrency < 1 or timeout <= 0:
            raise ValueError("OpenAIChatBackend: need concurrency >= 1 and timeout > 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.policy = RetryPolicy(max_retries, backoff_s, max_backoff_s)
        self.concurrency = concurrency
        self.extra_body = dict(extra_body or {})
        self._api_key = read_api_key(api_key_env)
        self._lock = threading.Lock()
        self._client: openai.OpenAI | None = None
        self._client_url = ""
        self._local = threading.local()
        self.stats = {"attempts": 0, "retries": 0, "failed": 0}

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIChatBackend(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    @property
    def max_retries(self) -> int:
        return self.policy.max_retries

    @property
    def last_attempts(self) -> int:
        return int(getattr(self._local, "attempts", 0))

    def _sdk(self) -> openai.OpenAI:
        """One SDK client (thread-safe, pooled connections), rebuilt if ``base_url`` was changed."""
        with self._lock:
            if self._client is None or self._client_url != self.base_url:
                self._client = openai.OpenAI(
                    base_url=self.base_url, api_key=self._api_key or NO_KEY, timeout=self.timeout, max_retries=0
                )
                self._client_url = self.base_url
            return self._client

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _call(self, method: str, path: str, send: Callable[[openai.OpenAI], Any], parse: Callable[[Any], Any]) -> Any:
        """``parse(send(client))`` under the retry policy; ``EndpointError`` (naming the URL) when it fails."""
        url = f"{self.base_url}{path}"
        self._local.attempts = 0
        try:
            for attempt in self.policy.retrying(what=f"{method} {url}"):
                with attempt:
                    self._local.attempts += 1
                    self._count("attempts")
                    if self._local.attempts > 1:
                        self._count("retries")
                    try:
                        raw = send(self._sdk())
                        return parse(json.loads(raw.http_response.text))
                    except (openai.OpenAIError, ValueError) as exc:
                        raise endpoint_error(exc, method, url, self.timeout) from exc
        except EndpointError:
            self._count("failed")
            raise
        raise AssertionError("unreachable")

    def complete(self, request: ChatRequest) -> ChatOutput:
        """One chat request under the retry policy; raises the last ``EndpointError`` when it failed."""
        payload = request_payload(self.model, request, None)
        return self._call(
            "POST",
            "/chat/completions",
            lambda client: client.chat.completions.with_raw_response.create(
                **payload, extra_body=self.extra_body or None
            ),
            parse_completion,
        )

    def generate(self, requests_: Sequence[ChatRequest]) -> list[ChatOutput]:
        """Answer a batch (order preserved), ``concurrency`` at a time; raises if any request failed."""
        if len(requests_) <= 1:
            return [self.complete(r) for r in requests_]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests_))) as pool:
            futures = [pool.submit(self.complete, r) for r in requests_]
            return [f.result() for f in futures]

    def list_models(self) -> list[str]:
        """Model ids the endpoint serves (``GET /models``), under the same retry policy."""

        def ids(body: Any) -> list[str]:
            try:
                return [str(m["id"]) for m in body["data"]]
            except (KeyError, TypeError) as exc:
                raise ValueError(f"not a model list: {type(exc).__name__}: {exc}") from exc

        return self._call("GET", "/models", lambda client: client.models.with_raw_response.list(), ids)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None
