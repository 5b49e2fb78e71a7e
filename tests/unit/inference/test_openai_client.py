"""The openai-SDK client, its one retry policy, the pre-flight check and ``api_key_env: null``, against a real
scripted HTTP server on 127.0.0.1 (stdlib ``http.server`` in a thread, port 0)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

import openai
import pytest
from json_http import JsonHandler, threaded_servers
from tenacity import RetryCallState

from envace.config.load import ConfigError, compose
from envace.inference.base import ChatRequest
from envace.inference.openai_client import EndpointError, OpenAIChatBackend, RetryPolicy, read_api_key
from envace.inference.preflight import EndpointUnavailable, preflight, stage_endpoints

HELLO = ChatRequest(messages=({"role": "user", "content": "hi"},), max_new_tokens=4)
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.02}


def completion(content: str | None = "hello", tool_calls: list | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


class ScriptedServer(ThreadingHTTPServer):
    """Answers each path from a script of actions, one per request (the last one repeats):
    ``("json", status, body)``, ``("raw", status, text)`` (declared JSON), ``("sleep", seconds)`` (then a
    completion). Records every request's method, path, Authorization header and body."""

    daemon_threads = True

    def __init__(self, script: dict[str, list[tuple]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = {path: list(actions) for path, actions in script.items()}
        self.seen: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def next_action(self, path: str) -> tuple:
        actions = self.script.get(path) or [("json", 404, {"error": {"message": f"no route {path}"}})]
        return actions.pop(0) if len(actions) > 1 else actions[0]


class _Handler(JsonHandler):
    server: ScriptedServer

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        srv = self.server
        with srv.lock:
            srv.seen.append(
                {"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"), "body": body}
            )
            action = srv.next_action(self.path.removeprefix("/v1"))
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            if action[0] == "sleep":
                time.sleep(action[1])
                action = ("json", 200, completion(f"slept {body['messages'][0]['content']}"))
            status, payload = action[1], action[2]
            self._send(status, payload if action[0] == "raw" else json.dumps(payload))
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): nothing to answer
            pass
        finally:
            with srv.lock:
                srv.in_flight -= 1

    do_GET = do_POST = _answer


@pytest.fixture
def serve():
    with threaded_servers() as serve_in_thread:
        yield lambda script: serve_in_thread(ScriptedServer(script))


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- the client ------------------------------------------------------------------------------------
def test_completion_text_usage_and_hermes_tool_calls(serve) -> None:
    call = {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    server = serve({"/chat/completions": [("json", 200, completion("<think>x</think>", [call]))]})
    client = OpenAIChatBackend(server.base_url, "m")
    out = client.generate(
        [
            ChatRequest(
                messages=({"role": "user", "content": "w?"},),
                tools=({"type": "function", "function": {"name": "get_weather", "parameters": {}}},),
                stop=("END",),
                seed=7,
            )
        ]
    )[0]
    assert out.text == (
        '<think>x</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert (out.prompt_tokens, out.completion_tokens, out.finish_reason) == (3, 2, "stop")
    sent = server.seen[0]["body"]
    assert sent["model"] == "m" and sent["seed"] == 7 and sent["stop"] == ["END"] and sent["max_tokens"] == 256
    assert sent["tools"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("actions", "attempts", "ok"),
    [
        ([("json", 503, {"error": "busy"}), ("json", 500, {}), ("json", 200, completion())], 3, True),
        ([("json", 429, {}), ("json", 200, completion())], 2, True),
        ([("raw", 200, "{not json"), ("json", 200, {"no": "choices"}), ("json", 200, completion())], 3, True),
        ([("sleep", 1.0), ("json", 200, completion())], 2, True),  # the first attempt times out
        ([("json", 503, {})], 3, False),  # max_retries=2: three attempts, then the error
        ([("json", 401, {"error": {"message": "bad key"}})], 1, False),  # never retried
        ([("json", 400, {})], 1, False),
        ([("json", 404, {})], 1, False),
    ],
)
def test_one_retry_policy_retries_only_retryable_faults(serve, actions, attempts, ok) -> None:
    server = serve({"/chat/completions": actions})
    client = OpenAIChatBackend(server.base_url, "m", timeout=0.3, max_retries=2, **FAST)
    if ok:
        assert client.complete(HELLO).text
    else:
        with pytest.raises(EndpointError) as info:
            client.complete(HELLO)
        assert server.base_url + "/chat/completions" in str(info.value)  # names the URL
        assert isinstance(info.value.__cause__, openai.APIStatusError)  # keeps the SDK's error as the cause
    assert len(server.seen) == attempts == client.last_attempts
    assert client.stats["attempts"] == attempts and client.stats["retries"] == attempts - 1


def test_backoff_is_exponential_with_jitter_and_capped() -> None:
    retrying = RetryPolicy(max_retries=9, backoff_s=0.5, max_backoff_s=3.0).retrying()
    for attempt, low in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 3.0), (9, 3.0)]:
        state = RetryCallState(retrying, None, (), {})
        state.attempt_number = attempt
        waits = {retrying.wait(state) for _ in range(20)}
        assert all(min(low, 3.0) <= w <= min(low + 0.5, 3.0) for w in waits), (attempt, waits)
        assert len(waits) > 1 or low >= 3.0  # jitter, except where the cap holds
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


def test_refused_connection_names_url_and_cause() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    client = OpenAIChatBackend(url, "m", max_retries=1, **FAST)
    started = time.perf_counter()
    with pytest.raises(EndpointError) as info:
        client.complete(HELLO)
    assert time.perf_counter() - started < 2.0
    message = str(info.value)
    assert f"POST {url}/chat/completions" in message and "connection refused" in message.lower()
    assert info.value.retryable and info.value.status is None and client.last_attempts == 2
    assert isinstance(info.value.__cause__, openai.APIConnectionError)


def test_concurrency_bound_and_order(serve) -> None:
    server = serve({"/chat/completions": [("sleep", 0.1)]})
    client = OpenAIChatBackend(server.base_url, "m", concurrency=3)
    batch = [ChatRequest(messages=({"role": "user", "content": str(k)},)) for k in range(7)]
    assert [o.text for o in client.generate(batch)] == [f"slept {k}" for k in range(7)]
    assert 1 < server.max_in_flight <= 3


def test_key_is_sent_never_shown_and_no_key_means_no_key(serve, monkeypatch, caplog) -> None:
    secret = "sk-fake-" + "7" * 24
    monkeypatch.setenv("ENVACE_TEST_KEY", secret)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-must-not-leak")
    server = serve({"/chat/completions": [("json", 503, {}), ("json", 200, completion())]})
    client = OpenAIChatBackend(server.base_url, "m", api_key_env="ENVACE_TEST_KEY", max_retries=1, **FAST)
    with caplog.at_level(logging.DEBUG):
        client.complete(HELLO)
    assert server.seen[-1]["auth"] == f"Bearer {secret}"
    assert "retrying" in caplog.text and secret not in caplog.text and secret not in repr(client)
    OpenAIChatBackend(server.base_url, "m", api_key_env=None).complete(HELLO)
    assert server.seen[-1]["auth"] == "Bearer EMPTY"  # never the ambient OPENAI_API_KEY


def test_missing_key_error_suggests_what_the_schema_accepts(monkeypatch) -> None:
    monkeypatch.delenv("ENVACE_TEST_KEY", raising=False)
    with pytest.raises(EndpointError, match="ENVACE_TEST_KEY.*set api_key_env: null for an endpoint without auth"):
        read_api_key("ENVACE_TEST_KEY")
    assert read_api_key(None) is None
    cfg = compose(["judge=llm", "judge.api_key_env=null", "profile=smoke"])  # the suggestion composes
    assert cfg.judge.api_key_env is None


def test_list_models_and_malformed_model_list(serve) -> None:
    server = serve({"/models": [("json", 200, {"data": "nope"}), ("json", 200, {"data": [{"id": "a"}, {"id": "m"}]})]})
    assert OpenAIChatBackend(server.base_url, "m", max_retries=1, **FAST).list_models() == ["a", "m"]


# ---- pre-flight ------------------------------------------------------------------------------------
def judge_cfg(url: str, **judge: Any):
    overrides = [f"judge.{k}={'null' if v is None else v}" for k, v in judge.items()]
    return compose(["profile=smoke", "judge=llm", f"judge.base_url={url}", "judge.model=m", *overrides])


def test_preflight_refused_judge_fails_in_one_line_naming_url_cause_and_key() -> None:
    cfg = judge_cfg("http://127.0.0.1:9/v1")
    started = time.perf_counter()
    with pytest.raises(EndpointUnavailable) as info:
        preflight(cfg, "train")
    seconds = time.perf_counter() - started
    message = str(info.value)
    print(f"preflight refused: {seconds:.2f} s: {message}")
    assert seconds < 10 and "\n" not in message and isinstance(info.value, ConfigError)
    assert "http://127.0.0.1:9/v1" in message and "connection refused" in message.lower()
    assert "judge.base_url" in message
    with pytest.raises(EndpointUnavailable, match="judge.base_url=null to judge by rules only"):
        preflight(compose(["profile=smoke", "judge=composite", "judge.base_url=http://127.0.0.1:9/v1"]), "train")


def test_preflight_passes_a_healthy_endpoint_and_skips_unused_ones(serve) -> None:
    server = serve({"/models": [("json", 200, {"object": "list", "data": [{"id": "m"}]})]})
    assert [e.url_key for e in preflight(judge_cfg(server.base_url), "train")] == ["judge.base_url"]
    assert [s["path"] for s in server.seen] == ["/v1/models"]
    for overrides in (["judge=verifiable"], ["judge=rule"], ["judge=composite", "judge.base_url=null"]):
        assert stage_endpoints(compose(["profile=smoke", *overrides]), "train") == []
    assert stage_endpoints(judge_cfg(server.base_url), "evaluate") == []  # evaluate does not use judge.*
    cfg = compose(
        [
            "profile=smoke",
            "eval.benchmarks=[vitabench]",
            "eval.benchmark=vitabench",
            f"eval.suites.vitabench.user_base_url={server.base_url}",
            "eval.suites.vitabench.user_model=m",
        ]
    )
    assert [e.url_key for e in stage_endpoints(cfg, "evaluate")] == ["eval.suites.vitabench.user_base_url"]
    with pytest.raises(ConfigError, match="judge.base_url"):
        stage_endpoints(compose(["profile=smoke", "judge=llm", "judge.base_url=null"]), "train")


def test_preflight_unauthenticated_and_missing_key(serve, monkeypatch) -> None:
    server = serve({"/models": [("json", 401, {"error": {"message": "invalid api key"}})]})
    with pytest.raises(EndpointUnavailable) as info:
        preflight(judge_cfg(server.base_url), "train")
    assert (
        "HTTP 401" in str(info.value) and "judge.api_key_env" in str(info.value) and server.base_url in str(info.value)
    )
    monkeypatch.delenv("ENVACE_TEST_KEY", raising=False)
    with pytest.raises(EndpointUnavailable, match="judge.api_key_env=ENVACE_TEST_KEY .*judge.api_key_env=null"):
        preflight(judge_cfg(server.base_url, api_key_env="ENVACE_TEST_KEY"), "train")


def test_preflight_without_models_route_asks_for_one_token(serve) -> None:
    server = serve({"/chat/completions": [("json", 200, completion("pong"))]})  # /models: 404
    preflight(judge_cfg(server.base_url), "train")
    assert [s["path"] for s in server.seen] == ["/v1/models", "/v1/chat/completions"]
    assert server.seen[1]["body"]["max_tokens"] == 1
    wrong = serve(
        {
            "/models": [("json", 200, {"data": [{"id": "other"}]})],
            "/chat/completions": [("json", 404, {"error": {"message": "model m does not exist"}})],
        }
    )
    with pytest.raises(EndpointUnavailable, match="model 'm' is not served.*judge.model"):
        preflight(judge_cfg(wrong.base_url), "train")
