"""A small OpenAI-compatible chat server in front of any ``ChatBackend`` (FastAPI + uvicorn).

Routes: ``POST /v1/chat/completions`` (non-streaming, n=1), ``GET /v1/models``, ``GET /health``.

- **Binding**: 127.0.0.1 only. The socket is bound here (never by uvicorn from a host string, so
  ``localhost`` cannot resolve to another address) and any other ``host`` is refused. A PID file is
  written while the server runs; the process stops cleanly on SIGTERM/SIGINT (exit 0, PID file removed).
- **Validation** (``envace.inference.chat_api``): a bad body is answered HTTP 400 in the OpenAI error
  envelope, naming each bad field by its path. 400 and not FastAPI's usual 422 because the OpenAI API and
  vLLM answer 400 there, so clients treat our server as they treat theirs. Fields the backend has no use
  for (``top_p``, ``tool_choice``, ...) are ignored and logged once each.
- **Concurrency**: uvicorn accepts any number of connections; health checks and model listings never
  wait for generation. Chat requests go to one ``BackendWorker`` thread (``envace.inference.backend_worker``),
  the only thread that calls the backend; it batches the requests waiting (up to ``max_batch``), so
  concurrent clients share a batch (``LocalHFBackend`` decodes batches together, each row as if alone).
- **Tool calls** come back as text in the Hermes wire format inside ``message.content`` (the backend's
  chat template renders ``tools``); there is no server-side tool parser. No log-probs.

Why not ``transformers serve`` (transformers 5.10.4, tried 2026-12-02 as ``transformers serve
<converted SmolLM2 dir> --host 127.0.0.1 --device cpu`` with ``HF_HUB_OFFLINE=1``; the directory holds
our ChatML tool template). It does answer chat completions offline with our template and ``tools=``,
and binds 127.0.0.1 when told to (its default host is ``localhost``). But:
- it serves Hugging Face checkpoints only: no scripted ``ChatBackend`` and no fault injection, which the
  judge, client and benchmark tests are built on; our ``tiny`` model exists only in memory;
- ``model`` must be the exact path (``"model": "smollm2"`` -> 400 "Server is pinned to ...", and there is
  no served-name option); ``GET /v1/models`` -> 500 offline (it scans the hub cache);
- no request validation: empty ``messages`` or a message without ``role`` -> 500 Internal Server Error,
  bad JSON -> 422; ``n=2``, ``logprobs`` and ``max_completion_tokens`` are ignored with a log warning;
- structured ``tool_calls`` only for Qwen-family configs; SmolLM2 (llama) gets raw text either way;
- one request at a time: 4 concurrent greedy requests took 8.3 s against 2.3 s for one; this server
  took 3.8 s against 1.1 s (batched rows, prefix cache), same machine and load (2 shared cores);
- SIGTERM ends it with status -15. It also samples with ``generate`` rather than our seeded sampler.
FastAPI and uvicorn are installed already (MLflow and Prefect depend on them).

Fault injection, for tests of clients and judges (``FaultPlan`` / CLI flags), counted over chat
requests in arrival order: the first ``delay_count`` requests wait ``delay_s`` seconds first (-1: all),
the first ``fail_count`` answer HTTP ``fail_status``, the next ``malformed_count`` answer HTTP 200
with a body that is not JSON.

    python -m envace.inference.openai_server --model tiny --port 8011
    python -m envace.inference.openai_server --model /path/to/hf_model --port 8011 --pid-file run/srv.pid
    python -m envace.inference.openai_server --backend-factory pkg.module:make_backend --port 0

``--model`` loads ``envace.inference.local.LocalHFBackend`` for a registered model kind (``tiny``,
``smollm2``; see ``envace.models``) or a local Hugging Face model directory; ``--backend-factory`` serves
any ``ChatBackend`` built by a zero-argument callable (tests use a scripted one). ``make serve-model``
runs ``--model $(SERVE_MODEL)`` (default ``smollm2``) on port ``$(MODEL_PORT)`` (default 8011).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import itertools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from envace.inference.backend_worker import BackendWorker
from envace.inference.base import ChatBackend
from envace.inference.chat_api import (
    ChatCompletionBody,
    RequestError,
    completion_body,
    error_response,
    parse_chat_body,
)
from envace.models import model_spec_from_string
from envace.utils.io import write_text

logger = logging.getLogger(__name__)

ALLOWED_HOSTS = frozenset({"127.0.0.1", "localhost"})
BIND_ADDRESS = "127.0.0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024
MALFORMED_BODY = b'{"id": "chatcmpl-broken", "choices": [{"message": {"content": "cut'


@dataclass(frozen=True)
class FaultPlan:
    delay_s: float = 0.0
    delay_count: int = 0  # -1: every request
    fail_count: int = 0
    fail_status: int = 500
    malformed_count: int = 0


# ---- the server -----------------------------------------------------------------------------------


class ChatCompletionServer:
    """Serves one ``ChatBackend`` under ``model_name`` on 127.0.0.1:``port`` (0: an ephemeral port).

    ``max_batch``: most requests handed to one ``backend.generate`` call (default: the backend's
    ``batch_size`` when it has one, else 8).
    """

    def __init__(
        self,
        backend: ChatBackend,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan = FaultPlan(),
        pid_file: str | Path | None = None,
        max_batch: int | None = None,
    ) -> None:
        if host not in ALLOWED_HOSTS:
            raise ValueError(f"refusing to bind {host!r}: this server only listens on 127.0.0.1 (localhost)")
        self.backend = backend
        self.model_name = model_name
        self.faults = faults
        self.pid_file = Path(pid_file) if pid_file else None
        self.max_batch = int(getattr(backend, "batch_size", 8)) if max_batch is None else max_batch
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 (requests per backend call), got {self.max_batch}")
        self._counter = itertools.count()
        self._ignored_fields: set[str] = set()
        self._stopping = threading.Event()
        self._worker: BackendWorker | None = None
        self._batch_sizes: list[int] = []
        self._thread: threading.Thread | None = None
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((BIND_ADDRESS, port))
        except OSError:
            self._socket.close()
            raise
        self._port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(
            build_app(self), http="h11", loop="asyncio", lifespan="off", log_config=None,
            access_log=False, log_level="warning", timeout_graceful_shutdown=3,
        )  # fmt: skip
        self._uvicorn = uvicorn.Server(config)

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, ending in /v1."""
        return f"http://{BIND_ADDRESS}:{self.port}/v1"

    @property
    def batch_sizes(self) -> list[int]:
        """Sizes of the ``generate`` calls made so far."""
        return list(self._batch_sizes)

    def _fault_for(self, k: int) -> tuple[float, int | None]:
        """(delay seconds, forced status or None) for the k-th chat request; status 0 means malformed."""
        f = self.faults
        delay = f.delay_s if (f.delay_count < 0 or k < f.delay_count) else 0.0
        if k < f.fail_count:
            return delay, f.fail_status
        if k < f.fail_count + f.malformed_count:
            return delay, 0
        return delay, None

    async def _wait(self, seconds: float) -> None:
        """Sleep ``seconds`` unless the server is stopping."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.05))

    def _note_ignored(self, body: ChatCompletionBody) -> None:
        new = set(body.model_extra or {}) - self._ignored_fields
        if new:
            self._ignored_fields |= new
            logger.warning("ignoring request field(s) this server does not use: %s", ", ".join(sorted(new)))

    async def answer_chat(self, raw: bytes) -> Response:
        """The response to one chat completion request body (faults first, then validation, then the model)."""
        k = next(self._counter)
        delay, forced = self._fault_for(k)
        if delay > 0:
            await self._wait(delay)
            if self._stopping.is_set():
                return error_response(503, "the server is stopping", "server_error")
        if forced == 0:
            return Response(MALFORMED_BODY, media_type="application/json")
        if forced is not None:
            return error_response(forced, f"injected failure {k + 1}", "server_error")
        try:
            body = parse_chat_body(raw)
        except RequestError as exc:
            return error_response(400, str(exc))
        self._note_ignored(body)
        if self._worker is None:
            return error_response(503, "the server is not serving (not started or stopping)", "server_error")
        try:
            output = await asyncio.wrap_future(self._worker.submit(body.to_chat_request()))
        except ValueError as exc:  # the backend refused this request (e.g. a template error)
            return error_response(400, f"the backend refused the request: {exc}")
        except Exception as exc:
            logger.exception("backend %s failed on request %d", getattr(self.backend, "name", "?"), k)
            return error_response(500, f"backend failure: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(completion_body(output, self.model_name, k))

    def health(self) -> dict[str, Any]:
        worker = self._worker
        return {"status": "ok", "model": self.model_name, "pending": worker.pending if worker else 0,
                "largest_batch": max(self._batch_sizes, default=0)}  # fmt: skip

    def write_pid_file(self) -> None:
        if self.pid_file is not None:
            write_text(self.pid_file, f"{os.getpid()}\n")

    def _remove_pid(self) -> None:
        if self.pid_file is not None and self.pid_file.exists():
            self.pid_file.unlink()

    def start(self, timeout: float = 30.0) -> ChatCompletionServer:
        """Serve from a background thread; returns once the server accepts connections."""
        self._worker = BackendWorker(self.backend, self.max_batch, self._batch_sizes)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._socket]}, name="openai-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the chat server on {self.base_url} did not start within {timeout:.0f} s")
            time.sleep(0.01)
        self.write_pid_file()
        logger.info("serving %s at %s (pid %d)", self.model_name, self.base_url, os.getpid())
        return self

    def serve_forever(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve in the calling thread's stead until ``stop``/``request_stop`` (e.g. from a signal
        handler); ``on_ready`` runs once the server accepts connections."""
        self.start()
        try:
            if on_ready is not None:
                on_ready()
            while not self._stopping.is_set():
                time.sleep(0.1)  # polling keeps the signal handler free of locks
        finally:
            self.stop()

    def request_stop(self, *_: Any) -> None:
        """Ask ``serve_forever`` to return (safe in a signal handler)."""
        self._stopping.set()

    def stop(self) -> None:
        """Stop serving, release the socket and remove the PID file (a never-started server just closes)."""
        self._stopping.set()
        if self._thread is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout=10)
            self._thread = None
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._socket.close()
        self._remove_pid()

    def __enter__(self) -> ChatCompletionServer:  # noqa: PYI034 - start() returns self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_app(server: ChatCompletionServer) -> FastAPI:
    """The FastAPI routes of ``server``."""
    app = FastAPI(title="envace chat server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return error_response(exc.status_code, message)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": server.model_name, "object": "model", "owned_by": "envace", "created": 0}
        return {"object": "list", "data": [model]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return error_response(413, f"request body of {declared} bytes is above the limit of {MAX_BODY_BYTES}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return error_response(413, f"request body above the limit of {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        return await server.answer_chat(b"".join(chunks))

    return app


# ---- model backends for the command line --------------------------------------------------------


def load_model_backend(model: str) -> ChatBackend:
    """``LocalHFBackend`` for a registered model kind (``tiny``, ``smollm2``) or a local model directory."""
    # lazy: torch + transformers load only when serving a model (--backend-factory servers start without them)
    from envace.inference.local import LocalHFBackend

    return LocalHFBackend.from_spec(model_spec_from_string(model), name=f"local:{model}")


def load_backend_factory(spec: str) -> ChatBackend:
    """A backend from ``module:callable`` (the callable takes no arguments)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--backend-factory {spec!r}: expected MODULE:CALLABLE, e.g. mypkg.backends:make")
    return getattr(importlib.import_module(module_name), attr)()


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m envace.inference.openai_server", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a registered model kind (tiny, smollm2) or a local HF model directory")
    src.add_argument("--backend-factory", help="MODULE:CALLABLE returning a ChatBackend")
    p.add_argument("--served-model-name", default=None, help="model id reported to clients")
    p.add_argument("--host", default="127.0.0.1", help="only 127.0.0.1 / localhost are accepted")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--pid-file", default=None, help="default: .envace/openai_server_<port>.pid")
    p.add_argument("--ready-file", default=None, help="JSON {pid, port, base_url} written once serving")
    p.add_argument("--max-batch", type=int, default=None, help="most requests per backend call (default: "
                   "the backend's batch_size, else 8)")  # fmt: skip
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--delay-count", type=int, default=0, help="-1: delay every request")
    p.add_argument("--fail-count", type=int, default=0)
    p.add_argument("--fail-status", type=int, default=500)
    p.add_argument("--malformed-count", type=int, default=0)
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.host not in ALLOWED_HOSTS:
        logger.error("refusing --host %s: this server only listens on 127.0.0.1", args.host)
        return 2
    if args.max_batch is not None and args.max_batch < 1:
        logger.error("--max-batch must be >= 1 (requests per backend call), got %d", args.max_batch)
        return 2
    backend = load_backend_factory(args.backend_factory) if args.backend_factory else load_model_backend(args.model)
    name = args.served_model_name or args.model or getattr(backend, "name", "envace")
    faults = FaultPlan(args.delay_s, args.delay_count, args.fail_count, args.fail_status, args.malformed_count)
    try:
        server = ChatCompletionServer(backend, name, args.host, args.port, faults, max_batch=args.max_batch)
    except OSError as exc:
        logger.error("cannot listen on 127.0.0.1:%d: %s (pick another --port, or 0 for a free one)", args.port, exc)
        return 1
    server.pid_file = Path(args.pid_file or f".envace/openai_server_{server.port}.pid")

    def write_ready_file() -> None:
        if args.ready_file:
            info = {"pid": os.getpid(), "port": server.port, "base_url": server.base_url}
            write_text(Path(args.ready_file), json.dumps(info))

    signal.signal(signal.SIGTERM, server.request_stop)
    signal.signal(signal.SIGINT, server.request_stop)
    server.serve_forever(on_ready=write_ready_file)
    logger.info("stopped the server on port %d", server.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
