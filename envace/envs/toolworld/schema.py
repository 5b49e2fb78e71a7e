"""Tool specifications of the embedded tool world: OpenAI function schemas, argument validation and
structured errors.

A tool is a ``ToolSpec``: its parameters (``Param``), a description and a handler
``(domain_state, arguments) -> response``. Handlers signal domain failures by raising ``ToolError``;
the executor turns that into ``{"error": {"code": ..., "message": ...}}`` so callers never see an
exception, like a real API.

Validation covers exactly the JSON-schema subset the tool world uses (a unit test enforces that no
other keyword appears, and cross-checks against the ``jsonschema`` package): ``type`` (string,
integer, boolean), ``enum``, ``pattern`` (``re.search`` semantics, so patterns are anchored
explicitly), ``minLength``, ``minimum``, ``maximum``, ``required`` and ``additionalProperties: false``.
Checks run in a fixed order and report the first problem only, so error responses stay short and
predictable: not an object → unexpected argument → missing argument → wrong type → bad value.
An integral float (``5.0``) is accepted for an integer and normalised to ``5``; booleans are never
integers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# error codes shared by every domain
UNKNOWN_TOOL = "UNKNOWN_TOOL"
INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
UNEXPECTED_ARGUMENT = "UNEXPECTED_ARGUMENT"
MISSING_ARGUMENT = "MISSING_ARGUMENT"
WRONG_TYPE = "WRONG_TYPE"
INVALID_VALUE = "INVALID_VALUE"
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
CONFLICT = "CONFLICT"
INSUFFICIENT_FUNDS = "INSUFFICIENT_FUNDS"
OUT_OF_STOCK = "OUT_OF_STOCK"
EMPTY_CART = "EMPTY_CART"
INVALID_STATE = "INVALID_STATE"
INTERNAL_ERROR = "INTERNAL_ERROR"

SUPPORTED_TYPES = ("string", "integer", "boolean")
DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
TIME_PATTERN = r"^\d{2}:\d{2}$"


class ToolError(Exception):
    """A structured tool failure; the executor returns it as an error response, never raises it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def response(self) -> dict[str, Any]:
        return error_response(self.code, self.message)


def error_response(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def is_error(response: Any) -> bool:
    """True when a tool response is a structured error (``{"error": {...}}``)."""
    return isinstance(response, dict) and isinstance(response.get("error"), dict)


def json_type_name(value: Any) -> str:
    """The JSON type name of a Python value, as error messages report it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


@dataclass(frozen=True)
class Param:
    """One tool parameter. ``hint`` is the human-readable format named in INVALID_VALUE messages."""

    name: str
    type: str
    description: str
    required: bool = True
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    hint: str | None = None
    min_length: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.type not in SUPPORTED_TYPES:
            raise ValueError(f"Param {self.name!r}: type {self.type!r} unsupported; use one of {SUPPORTED_TYPES}")

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        optional = {
            "enum": list(self.enum) if self.enum is not None else None,
            "pattern": self.pattern,
            "minLength": self.min_length,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "default": None if self.required else self.default,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def check(self, value: Any) -> Any:
        """Return the normalised value or raise ``ToolError`` (WRONG_TYPE / INVALID_VALUE)."""
        value = _check_type(self.name, self.type, value)
        where = f"argument '{self.name}'"
        if self.enum is not None and value not in self.enum:
            raise ToolError(INVALID_VALUE, f"{where} must be one of: {', '.join(self.enum)}")
        if self.pattern is not None and not re.search(self.pattern, value):
            raise ToolError(INVALID_VALUE, f"{where} must have the format {self.hint or self.pattern}")
        if self.min_length is not None and len(value) < self.min_length:
            raise ToolError(INVALID_VALUE, f"{where} must not be empty")
        if self.minimum is not None and value < self.minimum:
            raise ToolError(INVALID_VALUE, f"{where} must be >= {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ToolError(INVALID_VALUE, f"{where} must be <= {self.maximum}")
        return value


def _check_type(name: str, expected: str, value: Any) -> Any:
    if expected == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
    }[expected]
    if not ok:
        raise ToolError(WRONG_TYPE, f"argument '{name}' must be {expected}, got {json_type_name(value)}")
    return value


Handler = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: name, owning domain, description, parameters and the handler that runs it."""

    name: str
    domain: str
    description: str
    params: tuple[Param, ...]
    handler: Handler

    def openai_schema(self) -> dict[str, Any]:
        """The OpenAI function schema ``{"type": "function", "function": {...}}`` (a fresh dict)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.schema() for p in self.params},
                    "required": [p.name for p in self.params if p.required],
                    "additionalProperties": False,
                },
            },
        }

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validated arguments with defaults filled in; raises ``ToolError`` on the first problem."""
        if not isinstance(arguments, dict):
            raise ToolError(INVALID_ARGUMENTS, f"arguments must be a JSON object, got {json_type_name(arguments)}")
        known = {p.name for p in self.params}
        unexpected = sorted(str(k) for k in arguments if k not in known)
        if unexpected:
            raise ToolError(UNEXPECTED_ARGUMENT, f"{self.name} has no argument '{unexpected[0]}'")
        for p in self.params:
            if p.required and p.name not in arguments:
                raise ToolError(MISSING_ARGUMENT, f"missing required argument '{p.name}'")
        out: dict[str, Any] = {}
        for p in self.params:
            out[p.name] = p.check(arguments[p.name]) if p.name in arguments else p.default
        return out
