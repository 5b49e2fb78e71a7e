"""A server that echoes the API key in its error body: the key reaches neither stderr (the stage's error
line, its traceback with ENVACE_DEBUG=1, the judge's log lines) nor the MLflow run (tags, ``error.txt``)."""

from __future__ import annotations

import json
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from json_http import JsonHandler, threaded_servers
from mlflow.tracking import MlflowClient

from envace.config.load import CONF_DIR, write_params
from envace.core.checklist import Checklist
from envace.judges import get_judge
from envace.stages import runner
from envace.utils import secrets

KEY = "sk-test-9f8e7d6c5b4a"  # what the echoing server sends back
KEY_ENV = "ENVACE_TEST_JUDGE_KEY"


@pytest.fixture(autouse=True)
def _forget_secrets(monkeypatch):
    """Each test starts with no registered secrets (the registry is process-wide)."""
    monkeypatch.setattr(secrets, "_SECRETS", set())


class _EchoKeyHandler(JsonHandler):
    """Every request: HTTP 401 whose body quotes the Authorization header it got."""

    def _refuse(self) -> None:
        sent = self.headers.get("Authorization", "")
        self._send(401, json.dumps({"error": {"message": f"invalid api key: {sent}", "type": "auth"}}))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._refuse()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._refuse()


def _judge_one_item(cfg, tracker):
    """The train stage's judge path: an llm judge built from ``cfg.judge``, asked about one item."""
    judge = get_judge(
        "llm",
        base_url=cfg.judge.base_url,
        model=cfg.judge.model,
        api_key_env=cfg.judge.api_key_env,
        max_retries=0,
        max_failure_rate=0.0,
        failure_window=1,
    )
    item = {
        "id": "A",
        "question": "replied?",
        "focus_on": "assistant.content.user_visible_reply",
        "pass_condition": "The reply is polite.",
        "failure_examples": [],
        "evidence": [],
        "weight": 1.0,
        "required_for_next_turn": False,
        "dependence": [],
    }
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    judge.judge(messages, Checklist.from_raw([[item]]))
    return {}


def test_error_text_redacts_secrets(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(runner.ENV_DEBUG, "1")  # the traceback goes to stderr too
    monkeypatch.delenv("ENVACE_PARENT_RUN_ID", raising=False)
    with threaded_servers() as start:
        server = start(ThreadingHTTPServer(("127.0.0.1", 0), _EchoKeyHandler))
        base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        write_params(
            [
                "profile=smoke",
                "tracking.experiment=secrets",
                f"judge.base_url={base_url}",
                "judge.model=judge-model",
                f"judge.api_key_env={KEY_ENV}",
            ],
            tmp_path,
            CONF_DIR,
        )
        status = runner.stage_main("demo", _judge_one_item)([])
    err = capfd.readouterr().err
    assert status == runner.EXIT_USAGE, err  # an exhausted judge budget is a configuration error
    assert "HTTP 401" in err and "no verdict" in err and "Traceback" in err  # the texts that carried the key
    assert KEY not in err

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("secrets").experiment_id])  # the stage's and its parent
    assert len(runs) == 2 and not [k for r in runs for k, v in {**r.data.tags, **r.data.params}.items() if KEY in v]
    (run,) = [r for r in runs if r.data.tags.get("envace.stage") == "demo" and "error" in r.data.tags]
    assert run.info.status == "FAILED" and "HTTP 401" in run.data.tags["error"]
    text = Path(client.download_artifacts(run.info.run_id, "error.txt", str(tmp_path))).read_text()
    assert "AuthenticationError" in text and KEY not in text
