"""A quiet stdlib HTTP handler answering JSON, shared by the tests' scripted OpenAI-compatible servers."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """``_send(status, text)`` writes one JSON response; request logging is off (quiet test output)."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def threaded_servers() -> Iterator[Callable[[Any], Any]]:
    """Yields ``start(server)``: serves an ``http.server`` server in a daemon thread; all are shut down on exit."""
    servers: list[Any] = []

    def start(server: Any) -> Any:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
