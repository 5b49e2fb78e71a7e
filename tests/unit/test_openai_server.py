"""Our OpenAI-compatible server and client, end to end on 127.0.0.1, with injected faults.

The server runs a real scripted ``ChatBackend`` (deterministic judge answers), in a thread or as the
``python -m envace.inference.openai_server`` process; the LLM judge talks to it over HTTP.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest
import requests

from envace.core.checklist import Checklist
from envace.core.records import TrajectoryStatus
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.openai_client import EndpointError, OpenAIChatBackend
from envace.inference.openai_server import ChatCompletionServer, FaultPlan, chat_request_from_body, main
from envace.judges import evaluate_checklist, get_judge

REPO = Path(__file__).resolve().parents[2]
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
            outputs.append(
                ChatOutput(json.dumps(verdict), prompt_tokens=len(prompt.split()), completion_tokens=8)
            )
        return outputs


def make_verdict_backend() -> VerdictBackend:
    """Factory for ``--backend-factory test_openai_server:make_verdict_backend`` (tests/unit on the path)."""
    return VerdictBackend()


@pytest.fixture
def serve():
    servers: list[ChatCompletionServer] = []

    def start(faults: FaultPlan = FaultPlan(), **kwargs) -> ChatCompletionServer:
        server = ChatCompletionServer(
            VerdictBackend(), "judge-script", port=0, faults=faults, **kwargs
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
    client = OpenAIChatBackend(
        server.base_url, "judge-script", timeout=2, max_retries=2, concurrency=3, backoff_s=0.01
    )
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
    client = OpenAIChatBackend(
        server.base_url, "m", api_key_env="ENVACE_TEST_JUDGE_KEY", max_retries=1, backoff_s=0.01
    )
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
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "unit"), os.environ.get("PYTHONPATH", "")]),
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
        client = OpenAIChatBackend(
            json.loads(ready.read_text())["base_url"], "tiny", timeout=60, max_retries=0
        )
        out = client.generate([ChatRequest(messages=({"role": "user", "content": "hi"},), max_new_tokens=5)])[
            0
        ]
        assert out.completion_tokens <= 5 and out.prompt_tokens > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_stopping_a_never_started_server_returns() -> None:
    server = ChatCompletionServer(VerdictBackend(), "m")
    server.stop()  # must not wait for a serve loop that never ran
