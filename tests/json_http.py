"""A quiet stdlib HTTP handler answering JSON, shared by the tests' scripted OpenAI-compatible servers."""

from __future__ import annotations

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
