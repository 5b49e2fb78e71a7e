"""Keep API keys out of every error text envace logs, stores or prints.

A server may echo the key it was sent in its error body ("invalid key sk-..."); that body then travels in
exception messages, log lines, the MLflow ``error`` tag and ``error.txt``. The values to hide are
registered once per process:

- ``register_key_envs(flat_config)``: the values of the environment variables that the configuration
  names in its ``*api_key_env`` keys (``judge.api_key_env``, ``engine.simulator.api_key_env``,
  ``eval.suites.<benchmark>.user_api_key_env`` ...); the stage harness calls it when a stage starts;
- ``register_secret(value)``: one value (the OpenAI client registers every key it reads).

``redact(text)`` replaces each registered value with ``REDACTED``; ``install_log_redaction()`` puts a
filter doing the same on the root logger's handlers (message, arguments and traceback).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"
KEY_ENV_SUFFIX = "api_key_env"  # config keys naming the environment variable that holds a key
MIN_SECRET_CHARS = 4  # shorter values would blank out ordinary words; no real key is this short

_SECRETS: set[str] = set()
_LOCK = threading.Lock()


def register_secret(value: str | None) -> None:
    """Hide ``value`` from every text ``redact`` sees from now on (values under ``MIN_SECRET_CHARS`` are ignored)."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _LOCK:
            _SECRETS.add(value)


def key_env_names(flat_config: Mapping[str, Any]) -> list[str]:
    """The environment variable names a flat (dotted-key) config gives in its ``*api_key_env`` keys."""
    return sorted({str(v) for k, v in flat_config.items() if str(k).endswith(KEY_ENV_SUFFIX) and v})


def register_key_envs(flat_config: Mapping[str, Any]) -> None:
    """Register the values of the key variables the config names (``key_env_names``) that are set."""
    for name in key_env_names(flat_config):
        register_secret(os.environ.get(name))


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``REDACTED`` (longest first, so a key that
    contains another is hidden whole)."""
    with _LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that redacts a record's formatted message and its traceback text in place."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(handlers: Iterable[logging.Handler] | None = None) -> None:
    """Put one ``RedactingFilter`` on each of ``handlers`` (default: the root logger's)."""
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
