"""Our OpenAI-compatible server and client, end to end on 127.0.0.1, with injected faults.

The server runs a real scripted ``ChatBackend`` (deterministic judge answers), in a thread or as the
``python -m envace.inference.openai_server`` process; the LLM judge talks to it over HTTP. The second
half covers the server itself: request validation (400 naming the field), concurrent clients batched
into single backend calls, failure isolation, body limits, and the official ``openai`` SDK as a client.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests

from envace.core.checklist import Checklist
from envace.core.records import TrajectoryStatus
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.chat_api import chat_request_from_body
from envace.inference.openai_client import EndpointError, OpenAIChatBackend
from envace.inference.openai_server import ChatCompletionServer, FaultPlan, main
from envace.judges import evaluate_checklist, get_judge

REPO = Path(__file__).resolve().parents[3]
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]
CHECKLIST = Checklist.from_raw(
    [
        [
            {
                "id": "C0",
                "question": "Did the assistant greet?",
                "focus_on": "assistant.content.user_visible_reply",
                "pass_condition": "The reply greets the user.",
                "weight": 1.0,
                "required_for_next_turn": False,
            }
        ]
    ]
)
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.02}


class VerdictBackend:
    """A deterministic judge model: passes when the graded turn contains 'Hello', as strict JSON."""

    name = "verdict-script"

    def generate(self, requests_: Sequence[ChatRequest]) -> list[ChatOutput]:
        outputs = []
        for req in requests_:
            prompt = req.messages[-1]["content"]
            verdict = {"analysis": "checked the reply", "answer": "Hello" in prompt}
            outputs.append(ChatOutput(json.dumps(verdict), prompt_tokens=len(prompt.split()), completion_tokens=8))
        return outputs


def make_verdict_backend() -> VerdictBackend:
    """Factory for ``--backend-factory test_openai_server:make_verdict_backend`` (tests/unit/inference on the path)."""
    return VerdictBackend()


@pytest.fixture
def serve():
    servers: list[ChatCompletionServer] = []

    def start(faults: FaultPlan | None = None, **kwargs) -> ChatCompletionServer:
        server = ChatCompletionServer(
            VerdictBackend(), "judge-script", port=0, faults=faults or FaultPlan(), **kwargs
        ).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def judge_for(server: ChatCompletionServer, timeout_s: float = 2.0, max_retries: int = 3):
    return get_judge(
        "llm",
        base_url=server.base_url,
        model="judge-script",
        timeout_s=timeout_s,
        max_retries=max_retries,
        **FAST,
    )


def test_routes_and_completion_shape(serve) -> None:
    server = serve()
    root = server.base_url.removesuffix("/v1")
    assert requests.get(f"{root}/health", timeout=2).json()["status"] == "ok"
    assert requests.get(f"{server.base_url}/models", timeout=2).json()["data"][0]["id"] == "judge-script"
    body = {
        "model": "judge-script",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
    }
    resp = requests.post(f"{server.base_url}/chat/completions", json=body, timeout=2).json()
    assert resp["object"] == "chat.completion" and resp["choices"][0]["message"]["role"] == "assistant"
    assert json.loads(resp["choices"][0]["message"]["content"])["answer"] is True
    assert resp["usage"]["total_tokens"] == resp["usage"]["prompt_tokens"] + 8
    assert requests.post(f"{server.base_url}/chat/completions", data=b"{nope", timeout=2).status_code == 400
    bad = requests.post(f"{server.base_url}/chat/completions", json={"messages": [], "model": "m"}, timeout=2)
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    assert requests.get(f"{root}/v2/else", timeout=2).status_code == 404


def test_request_parsing() -> None:
    req = chat_request_from_body(
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 7,
            "stop": "END",
            "temperature": 0.5,
            "seed": 3,
        }
    )
    assert (req.max_new_tokens, req.stop, req.temperature, req.seed) == (7, ("END",), 0.5, 3)
    for bad in [
        {"messages": [{"content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "stream": True},
    ]:
        with pytest.raises(ValueError):
            chat_request_from_body(bad)


def test_refuses_non_local_hosts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="127.0.0.1"):
        ChatCompletionServer(VerdictBackend(), "m", host="0.0.0.0")
    args = ["--backend-factory", "test_openai_server:make_verdict_backend", "--host", "192.168.1.5"]
    assert main(args + ["--pid-file", str(tmp_path / "x.pid")]) == 2


def test_judge_over_http_happy_path_and_pid_file(serve, tmp_path: Path) -> None:
    pid_file = tmp_path / "srv.pid"
    server = serve(pid_file=pid_file)
    assert pid_file.read_text().strip() == str(os.getpid())
    score, report = evaluate_checklist(judge_for(server), MESSAGES, CHECKLIST)
    assert score.reward == 1.0 and report.n_requests == 1
    server.stop()
    assert not pid_file.exists()


@pytest.mark.parametrize(
    ("faults", "requests_sent"),
    [
        (FaultPlan(fail_count=2), 3),  # HTTP 500 twice, then an answer
        (FaultPlan(malformed_count=2), 3),  # a body that is not JSON, twice
        (FaultPlan(fail_count=1, fail_status=503, malformed_count=1), 3),
        (FaultPlan(delay_s=1.0, delay_count=1), 2),  # first attempt times out
    ],
)
def test_judge_retries_through_injected_faults(serve, faults: FaultPlan, requests_sent: int) -> None:
    server = serve(faults)
    score, report = evaluate_checklist(judge_for(server, timeout_s=0.3), MESSAGES, CHECKLIST)
    assert score.status is TrajectoryStatus.OK and score.reward == 1.0
    assert report.n_requests == requests_sent and report.n_retries == requests_sent - 1


def test_persistent_failure_is_a_counted_judge_failure(serve) -> None:
    server = serve(FaultPlan(fail_count=1000))
    score, report = evaluate_checklist(judge_for(server, max_retries=2), MESSAGES, CHECKLIST)
    assert score.status is TrajectoryStatus.JUDGE_FAILED and score.reward is None
    assert report.n_errors == 1 and report.n_requests == 3


def test_client_errors_are_not_retried(serve) -> None:
    server = serve(FaultPlan(fail_count=1000, fail_status=401))
    score, report = evaluate_checklist(judge_for(server, max_retries=4), MESSAGES, CHECKLIST)
    assert score.status is TrajectoryStatus.JUDGE_FAILED and report.n_requests == 1


def test_client_backend_retries_and_batches(serve) -> None:
    server = serve(FaultPlan(fail_count=2))
    client = OpenAIChatBackend(server.base_url, "judge-script", timeout=2, max_retries=2, concurrency=3, backoff_s=0.01)
    assert client.list_models() == ["judge-script"]
    batch = [ChatRequest(messages=({"role": "user", "content": t},)) for t in ("Hello", "bye", "Hello again")]
    answers = [json.loads(o.text)["answer"] for o in client.generate(batch)]
    assert answers == [True, False, True]
    strict = OpenAIChatBackend(server.base_url, "judge-script", timeout=2, max_retries=0)
    strict_server = serve(FaultPlan(fail_count=1))
    strict.base_url = strict_server.base_url
    with pytest.raises(EndpointError) as info:
        strict.generate([batch[0]])
    assert info.value.status == 500 and info.value.retryable


def test_api_key_is_sent_but_never_logged(serve, monkeypatch, caplog) -> None:
    secret = "sk-test-" + "9" * 24
    monkeypatch.setenv("ENVACE_TEST_JUDGE_KEY", secret)
    server = serve(FaultPlan(fail_count=1))
    client = OpenAIChatBackend(server.base_url, "m", api_key_env="ENVACE_TEST_JUDGE_KEY", max_retries=1, backoff_s=0.01)
    assert secret not in repr(client)
    with caplog.at_level(logging.DEBUG):
        client.generate([ChatRequest(messages=({"role": "user", "content": "Hello"},))])
    assert "retrying" in caplog.text and secret not in caplog.text
    monkeypatch.delenv("ENVACE_TEST_JUDGE_KEY")
    with pytest.raises(EndpointError, match="ENVACE_TEST_JUDGE_KEY"):
        OpenAIChatBackend(server.base_url, "m", api_key_env="ENVACE_TEST_JUDGE_KEY")


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)


def test_module_entry_point_serves_with_faults_and_stops_on_sigterm(tmp_path: Path) -> None:
    pid_file, ready = tmp_path / "srv.pid", tmp_path / "ready.json"
    cmd = [
        sys.executable, "-m", "envace.inference.openai_server",
        "--backend-factory", "test_openai_server:make_verdict_backend",
        "--port", "0", "--pid-file", str(pid_file), "--ready-file", str(ready), "--fail-count", "1",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "unit" / "inference"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, proc)
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid and pid_file.read_text().strip() == str(proc.pid)
        judge = get_judge("llm", base_url=info["base_url"], model="m", timeout_s=2, max_retries=2, **FAST)
        score, report = evaluate_checklist(judge, MESSAGES, CHECKLIST)
        assert score.reward == 1.0 and report.n_requests == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert not pid_file.exists()


@pytest.mark.slow
def test_module_entry_point_with_tiny_model(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "envace.inference.openai_server", "--model", "tiny", "--port", "0",
           "--pid-file", str(tmp_path / "p.pid"), "--ready-file", str(ready)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, proc, timeout=120)
        client = OpenAIChatBackend(json.loads(ready.read_text())["base_url"], "tiny", timeout=60, max_retries=0)
        out = client.generate([ChatRequest(messages=({"role": "user", "content": "hi"},), max_new_tokens=5)])[0]
        assert out.completion_tokens <= 5 and out.prompt_tokens > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_stopping_a_never_started_server_returns() -> None:
    server = ChatCompletionServer(VerdictBackend(), "m")
    server.stop()  # must not wait for a serve loop that never ran


# ---- request validation, concurrency and the OpenAI SDK (FastAPI + uvicorn server) --------------------


class RecordingBackend:
    """Echoes the last message; sleeps ``delay_s`` per ``generate`` call; records batch sizes and how many
    calls ever ran at once (the server must never call the backend from two threads)."""

    name = "recording"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.batches: list[list[str]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def generate(self, requests_: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            texts = [str(r.messages[-1]["content"]) for r in requests_]
            self.batches.append(texts)
            time.sleep(self.delay_s)
            if any("boom" in t for t in texts):
                raise RuntimeError("the model crashed")
            if any("refuse" in t for t in texts):
                raise ValueError("the chat template cannot render this")
            return [ChatOutput(f"echo:{t}", prompt_tokens=1, completion_tokens=1) for t in texts]
        finally:
            self.in_flight -= 1


def post_chat(server: ChatCompletionServer, body: dict | bytes, timeout: float = 5.0) -> requests.Response:
    url = f"{server.base_url}/chat/completions"
    if isinstance(body, bytes):
        return requests.post(url, data=body, timeout=timeout)
    return requests.post(url, json=body, timeout=timeout)


def user(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"model": "m", "messages": [{"content": "x"}]}, "messages.0.role: Field required"),
        ({"messages": [{"role": "usr", "content": "x"}]}, "messages.0.role: Input should be 'system'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content: Value error, must be a string, null or a list of {'type': 'text'",
        ),
        ({**user("x"), "temperature": "hot"}, "temperature: Input should be a valid number"),
        ({**user("x"), "temperature": 3}, "temperature: Input should be less than or equal to 2"),
        ({**user("x"), "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        (
            {**user("x"), "tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools.0.function.name: Field required",
        ),
        ({**user("x"), "stream": True}, "stream: Value error, streaming is not supported; send stream=false"),
        ({**user("x"), "n": 2}, "n: Value error, only n=1 is supported"),
        ({**user("x"), "logprobs": True}, "logprobs: Value error, log-probs are not supported"),
        ({**user("x"), "stop": [1, 2]}, "stop.list[str].0: Input should be a valid string"),
        (b"[1, 2]", "body: Input should be an object"),
        (b"{nope", "body: Invalid JSON"),
    ],
)
def test_bad_requests_name_the_field_and_never_reach_the_model(body, expected: str) -> None:
    backend = RecordingBackend()
    with ChatCompletionServer(backend, "m") as server:
        resp = post_chat(server, body)
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["message"].startswith("invalid chat completion request: ") and expected in error["message"]
    assert backend.batches == []


def test_request_parsing_keeps_tools_message_keys_and_defaults() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "system", "content": None},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [{"type": "text", "text": "sun"}, {"type": "text", "text": "ny"}],
            },
        ],
        "tools": [tool],
        "max_completion_tokens": 9,
        "max_tokens": 100,
        "top_p": 0.9,  # ignored
    }
    req = chat_request_from_body(body)
    assert req.tools == (tool,)
    assert req.messages == (
        {"role": "system", "content": None},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    )
    assert (req.max_new_tokens, req.temperature, req.seed, req.stop) == (9, 0.0, 0, ())
    assert chat_request_from_body(json.dumps(user("x")).encode()).max_new_tokens == 256


def test_concurrent_requests_are_batched_and_health_answers_while_the_model_works() -> None:
    backend = RecordingBackend(delay_s=0.8)
    texts = [f"q{i}" for i in range(6)]
    with ChatCompletionServer(backend, "m") as server:
        root = server.base_url.removesuffix("/v1")
        with ThreadPoolExecutor(max_workers=6) as pool:
            futures = [pool.submit(post_chat, server, user(t)) for t in texts]
            time.sleep(0.2)  # the first batch is being generated now
            t0 = time.monotonic()
            health = requests.get(f"{root}/health", timeout=2).json()
            health_s = time.monotonic() - t0
            answers = [f.result().json()["choices"][0]["message"]["content"] for f in futures]
    assert answers == [f"echo:{t}" for t in texts]  # each client got its own answer
    assert health["status"] == "ok" and health_s < 0.4  # not queued behind the batch being generated
    assert backend.most_in_flight == 1  # one backend call at a time
    sizes = [len(b) for b in backend.batches]
    assert sum(sizes) == 6 and max(sizes) > 1 and len(sizes) <= 3, sizes
    assert server.batch_sizes == sizes


def test_max_batch_caps_each_backend_call() -> None:
    backend = RecordingBackend(delay_s=0.3)
    with ChatCompletionServer(backend, "m", max_batch=2) as server, ThreadPoolExecutor(max_workers=5) as pool:
        statuses = [r.status_code for r in pool.map(lambda t: post_chat(server, user(t)), "abcde")]
    assert statuses == [200] * 5 and max(len(b) for b in backend.batches) == 2
    with pytest.raises(ValueError, match="max_batch"):
        ChatCompletionServer(backend, "m", max_batch=0)


def test_a_failing_request_fails_alone_and_the_server_keeps_serving() -> None:
    backend = RecordingBackend(delay_s=0.3)
    with ChatCompletionServer(backend, "m") as server:
        with ThreadPoolExecutor(max_workers=5) as pool:
            futures = [pool.submit(post_chat, server, user(t)) for t in ("first", "ok1", "boom", "refuse", "ok2")]
            resps = {t: f.result() for t, f in zip(("first", "ok1", "boom", "refuse", "ok2"), futures)}
        after = post_chat(server, user("after"))
    assert {t: r.status_code for t, r in resps.items()} == {
        "first": 200,
        "ok1": 200,
        "boom": 500,
        "refuse": 400,
        "ok2": 200,
    }
    assert "backend failure: RuntimeError: the model crashed" in resps["boom"].json()["error"]["message"]
    assert "the backend refused the request" in resps["refuse"].json()["error"]["message"]
    assert resps["ok2"].json()["choices"][0]["message"]["content"] == "echo:ok2"
    assert after.status_code == 200
    assert any(len(b) > 1 for b in backend.batches)  # the failures were isolated from a shared batch


def test_oversized_body_is_refused_before_it_is_read() -> None:
    with ChatCompletionServer(RecordingBackend(), "m") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(10**10))
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 413 and "above the limit" in json.loads(resp.read())["error"]["message"]
        conn.close()


def test_unknown_routes_and_methods_answer_in_the_openai_error_envelope() -> None:
    with ChatCompletionServer(RecordingBackend(), "m") as server:
        root = server.base_url.removesuffix("/v1")
        missing = requests.get(f"{root}/v1/nothing", timeout=2)
        wrong = requests.get(f"{server.base_url}/chat/completions", timeout=2)
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no route GET /v1/nothing"
    assert wrong.status_code == 405 and wrong.json()["error"]["message"] == "no route GET /v1/chat/completions"


def test_the_openai_sdk_talks_to_the_server(caplog) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with ChatCompletionServer(RecordingBackend(), "served") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0, timeout=5)
        assert [m.id for m in client.models.list()] == ["served"]
        with caplog.at_level(logging.WARNING, logger="envace.inference.openai_server"):
            out = client.chat.completions.create(
                model="anything", messages=[{"role": "user", "content": "hi"}], tools=[tool],
                max_completion_tokens=5, top_p=0.5, tool_choice="auto",
            )  # fmt: skip
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], top_p=0.5)
        assert out.model == "served" and out.choices[0].message.content == "echo:hi"
        assert out.usage.total_tokens == 2 and out.choices[0].finish_reason == "stop"
        assert caplog.text.count("ignoring request field(s)") == 1 and "tool_choice, top_p" in caplog.text
        with pytest.raises(openai.BadRequestError, match="only n=1"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2)
        client.close()


def test_cli_refuses_a_bad_max_batch_and_a_busy_port(tmp_path: Path) -> None:
    args = ["--backend-factory", "test_openai_server:make_verdict_backend", "--pid-file", str(tmp_path / "x.pid")]
    assert main(args + ["--max-batch", "0"]) == 2
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(args + ["--port", str(busy.getsockname()[1])]) == 1
    assert not (tmp_path / "x.pid").exists()
