"""A small OpenAI-compatible HTTP server in front of any ``ChatBackend`` (stdlib ``http.server`` only).

Routes: ``POST /v1/chat/completions`` (non-streaming, n=1), ``GET /v1/models``, ``GET /health``.
It binds 127.0.0.1 only (any other host is refused), writes a PID file while it runs, and serializes
calls into the backend (local models are not thread-safe). Tool calls come back as text in the
Hermes wire format inside ``message.content``; no server-side tool parser.

Fault injection, for tests of clients and judges (``FaultPlan`` / CLI flags), counted over chat
requests in arrival order: the first ``delay_count`` requests wait ``delay_s`` seconds first (-1: all),
the first ``fail_count`` answer HTTP ``fail_status``, the next ``malformed_count`` answer HTTP 200
with a body that is not JSON.

    python -m envace.inference.openai_server --model tiny --port 8011
    python -m envace.inference.openai_server --model /path/to/hf_model --port 8011 --pid-file run/srv.pid
    python -m envace.inference.openai_server --backend-factory pkg.module:make_backend --port 0

``--model`` loads ``envace.inference.local.LocalHFBackend`` for a registered model kind (``tiny``,
``smollm2``; see ``envace.models``) or a local Hugging Face model directory; ``--backend-factory`` serves
any ``ChatBackend`` built by a zero-argument callable (tests use a scripted one).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

from envace.inference.base import ChatBackend, ChatOutput, ChatRequest

logger = logging.getLogger(__name__)

ALLOWED_HOSTS = frozenset({"127.0.0.1", "localhost"})
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class FaultPlan:
    delay_s: float = 0.0
    delay_count: int = 0  # -1: every request
    fail_count: int = 0
    fail_status: int = 500
    malformed_count: int = 0


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so that readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RequestError(ValueError):
    """A chat request the server cannot serve (answered with HTTP 400)."""


def _text_content(content: Any) -> str | None:
    """OpenAI content (string, null or a list of text parts) as a string."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError("message content must be a string, null or a list of text parts")


def chat_request_from_body(body: Any) -> ChatRequest:
    """A ``ChatRequest`` from a chat.completions JSON body; ``RequestError`` when it is unusable."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    clean = []
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise RequestError(f"messages[{k}] must be an object with a string 'role'")
        clean.append({**msg, "content": _text_content(msg.get("content"))})
    if body.get("stream"):
        raise RequestError("streaming is not supported; send stream=false")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    tools = body.get("tools")
    try:
        return ChatRequest(
            messages=tuple(clean),
            tools=tuple(tools) if tools else None,
            temperature=float(body.get("temperature", 0.0) or 0.0),
            max_new_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 256),
            seed=int(body.get("seed", 0) or 0),
            stop=tuple(str(s) for s in stop),
        )
    except (TypeError, ValueError) as exc:
        raise RequestError(f"bad sampling parameter: {exc}") from None


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


class _Handler(BaseHTTPRequestHandler):
    server: "_HTTPServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"))

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        app = self.server.app
        if self.path.rstrip("/") == "/health":
            self._send_json(200, {"status": "ok", "model": app.model_name})
        elif self.path.rstrip("/") == "/v1/models":
            model = {"id": app.model_name, "object": "model", "owned_by": "envace", "created": 0}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._error(404, f"no route GET {self.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route POST {self.path}")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(413, f"request body above {MAX_BODY_BYTES} bytes")
            return
        raw = self.rfile.read(length)
        status, payload = self.server.app.handle_chat(raw)
        self._send(status, payload)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    app: "ChatCompletionServer"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # typically a client that gave up (timeout) before a delayed answer: not worth a traceback
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class ChatCompletionServer:
    """Serves one ``ChatBackend`` under ``model_name`` on 127.0.0.1:``port`` (0: an ephemeral port)."""

    def __init__(
        self,
        backend: ChatBackend,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan = FaultPlan(),
        pid_file: str | Path | None = None,
    ) -> None:
        if host not in ALLOWED_HOSTS:
            raise ValueError(f"refusing to bind {host!r}: this server only listens on 127.0.0.1 (localhost)")
        self.backend = backend
        self.model_name = model_name
        self.faults = faults
        self.pid_file = Path(pid_file) if pid_file else None
        self._counter = itertools.count()
        self._count_lock = threading.Lock()
        self._backend_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.app = self

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, ending in /v1."""
        return f"http://127.0.0.1:{self.port}/v1"

    def _fault_for(self, k: int) -> tuple[float, int | None]:
        """(delay seconds, forced status or None) for the k-th chat request; status 0 means malformed."""
        f = self.faults
        delay = f.delay_s if (f.delay_count < 0 or k < f.delay_count) else 0.0
        if k < f.fail_count:
            return delay, f.fail_status
        if k < f.fail_count + f.malformed_count:
            return delay, 0
        return delay, None

    def handle_chat(self, raw: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) for one chat completion request body."""
        with self._count_lock:
            k = next(self._counter)
        delay, forced = self._fault_for(k)
        if delay > 0:
            self._stopping.wait(delay)
        if forced == 0:
            return 200, b'{"id": "chatcmpl-broken", "choices": [{"message": {"content": "cut'
        if forced is not None:
            body = {"error": {"message": f"injected failure {k + 1}", "type": "server_error", "code": forced}}
            return forced, json.dumps(body).encode()
        try:
            request = chat_request_from_body(json.loads(raw.decode("utf-8")))
            with self._backend_lock:
                output = self.backend.generate([request])[0]
        except (RequestError, ValueError, UnicodeDecodeError) as exc:
            err = {"error": {"message": str(exc)[:500], "type": "invalid_request_error", "code": 400}}
            return 400, json.dumps(err).encode()
        except Exception:  # noqa: BLE001 - a backend crash must not kill the server
            logger.exception("backend %s failed on request %d", getattr(self.backend, "name", "?"), k)
            return 500, json.dumps({"error": {"message": "backend failure", "type": "server_error"}}).encode()
        return 200, json.dumps(completion_body(output, self.model_name, k)).encode("utf-8")

    def write_pid_file(self) -> None:
        if self.pid_file is not None:
            write_atomic(self.pid_file, f"{os.getpid()}\n")

    def _remove_pid(self) -> None:
        if self.pid_file is not None and self.pid_file.exists():
            self.pid_file.unlink()

    def start(self) -> "ChatCompletionServer":
        """Serve from a background thread."""
        self.write_pid_file()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="openai-server",
            daemon=True,
        )
        self._thread.start()
        logger.info("serving %s at %s", self.model_name, self.base_url)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop`` (or KeyboardInterrupt / SIGTERM via ``main``)."""
        self.write_pid_file()
        logger.info("serving %s at %s (pid %d)", self.model_name, self.base_url, os.getpid())
        try:
            self._httpd.serve_forever(poll_interval=0.2)
        finally:
            self._httpd.server_close()
            self._remove_pid()

    def stop(self) -> None:
        """Stop a server started with ``start`` (a never-started one just releases its socket)."""
        self._stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()
        self._remove_pid()

    def __enter__(self) -> "ChatCompletionServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---- model backends for the command line --------------------------------------------------------


def load_model_backend(model: str) -> ChatBackend:
    """``LocalHFBackend`` for a registered model kind (``tiny``, ``smollm2``) or a local model directory."""
    from envace.inference.local import LocalHFBackend  # torch + transformers: only when serving a model
    from envace.models import model_spec_from_string

    return LocalHFBackend.from_spec(model_spec_from_string(model), name=f"local:{model}")


def load_backend_factory(spec: str) -> ChatBackend:
    """A backend from ``module:callable`` (the callable takes no arguments)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--backend-factory {spec!r}: expected MODULE:CALLABLE, e.g. mypkg.backends:make")
    return getattr(importlib.import_module(module_name), attr)()


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m envace.inference.openai_server", description=__doc__.split("\n")[0]
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a registered model kind (tiny, smollm2) or a local HF model directory")
    src.add_argument("--backend-factory", help="MODULE:CALLABLE returning a ChatBackend")
    p.add_argument("--served-model-name", default=None, help="model id reported to clients")
    p.add_argument("--host", default="127.0.0.1", help="only 127.0.0.1 / localhost are accepted")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--pid-file", default=None, help="default: .envace/openai_server_<port>.pid")
    p.add_argument("--ready-file", default=None, help="JSON {pid, port, base_url} written once serving")
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--delay-count", type=int, default=0, help="-1: delay every request")
    p.add_argument("--fail-count", type=int, default=0)
    p.add_argument("--fail-status", type=int, default=500)
    p.add_argument("--malformed-count", type=int, default=0)
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.host not in ALLOWED_HOSTS:
        logger.error("refusing --host %s: this server only listens on 127.0.0.1", args.host)
        return 2
    backend = (
        load_backend_factory(args.backend_factory) if args.backend_factory else load_model_backend(args.model)
    )
    name = args.served_model_name or args.model or getattr(backend, "name", "envace")
    faults = FaultPlan(
        args.delay_s, args.delay_count, args.fail_count, args.fail_status, args.malformed_count
    )
    server = ChatCompletionServer(backend, name, args.host, args.port, faults)
    server.pid_file = Path(args.pid_file or f".envace/openai_server_{server.port}.pid")
    server.write_pid_file()
    if args.ready_file:
        info = {"pid": os.getpid(), "port": server.port, "base_url": server.base_url}
        write_atomic(Path(args.ready_file), json.dumps(info))

    def _on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logger.info("stopping the server on port %d", server.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
