"""Tool specifications of the embedded tool world: OpenAI function schemas, argument validation and
structured errors.

A tool is a ``ToolSpec``: its parameters (``Param``), a description and a handler
``(domain_state, arguments) -> response``. Handlers signal domain failures by raising ``ToolError``;
the executor turns that into ``{"error": {"code": ..., "message": ...}}`` so callers never see an
exception, like a real API.

Validation is ``jsonschema``'s (Draft 2020-12): a ``ToolSpec`` checks its parameters object with
``Draft202012Validator.check_schema`` when it is built (a bad definition fails at import, naming the
tool), and validates call arguments with a ``Draft202012Validator`` of that schema. The schemas use
``type`` (string, integer, boolean), ``enum``, ``pattern`` (``re.search`` semantics, so patterns are
anchored explicitly), ``minLength``, ``minimum``, ``maximum``, ``required`` and
``additionalProperties: false``. Of all the violations jsonschema finds, the first in a fixed order is
reported, so error responses stay short and predictable: not an object → unexpected argument → missing
argument → then parameter by parameter in declaration order, wrong type → bad value (enum, pattern,
minLength, minimum, maximum). Codes and messages are ours (``INVALID_VALUE``: "argument 'date' must
have the format YYYY-MM-DD"), not jsonschema's. An integral float (``5.0``) is an integer for JSON
schema and is normalised to ``5``; booleans are never integers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import ValidationError as SchemaViolation

# error codes shared by every domain (UNKNOWN_TOOL belongs to the unknown-tool rule, envace.core.unknown_tool)
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

# the order a parameter's failed checks are reported in (by JSON-schema keyword)
_VALUE_CHECKS = ("type", "enum", "pattern", "minLength", "minimum", "maximum")
# and the order of the checks on the arguments object itself, which come before any parameter's
_OBJECT_CHECKS = ("type", "additionalProperties", "required")


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

    @cached_property
    def _validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.schema())

    def check(self, value: Any) -> Any:
        """Return the normalised value or raise ``ToolError`` (WRONG_TYPE / INVALID_VALUE)."""
        violations = list(self._validator.iter_errors(value))
        if violations:
            first = min(violations, key=lambda v: _rank(_VALUE_CHECKS, v.validator))
            raise self.error(str(first.validator), value)
        return self.normalise(value)

    def normalise(self, value: Any) -> Any:
        """A valid value as handlers get it: an integral float for an integer parameter becomes an int."""
        return int(value) if self.type == "integer" and isinstance(value, float) else value

    def error(self, keyword: str, value: Any) -> ToolError:
        """The ``ToolError`` for ``value`` failing this parameter's JSON-schema check ``keyword``."""
        where = f"argument '{self.name}'"
        if keyword == "type":
            return ToolError(WRONG_TYPE, f"{where} must be {self.type}, got {json_type_name(value)}")
        if keyword == "enum":
            return ToolError(INVALID_VALUE, f"{where} must be one of: {', '.join(self.enum or ())}")
        if keyword == "pattern":
            return ToolError(INVALID_VALUE, f"{where} must have the format {self.hint or self.pattern}")
        if keyword == "minLength":
            at_least = "must not be empty" if self.min_length == 1 else f"needs at least {self.min_length} characters"
            return ToolError(INVALID_VALUE, f"{where} {at_least}")
        if keyword == "minimum":
            return ToolError(INVALID_VALUE, f"{where} must be >= {self.minimum}")
        if keyword == "maximum":
            return ToolError(INVALID_VALUE, f"{where} must be <= {self.maximum}")
        return ToolError(INVALID_VALUE, f"{where} fails the schema check {keyword!r}")


def _rank(order: tuple[str, ...], keyword: Any) -> int:
    return order.index(keyword) if keyword in order else len(order)


Handler = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: name, owning domain, description, parameters and the handler that runs it."""

    name: str
    domain: str
    description: str
    params: tuple[Param, ...]
    handler: Handler

    def __post_init__(self) -> None:
        schema = self.openai_schema()["function"]["parameters"]
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            at = "/".join(str(p) for p in exc.path) or "(root)"
            raise ValueError(
                f"tool {self.name!r}: its parameters are not a valid JSON schema (Draft 2020-12) at {at}: "
                f"{exc.message}; fix the Param definitions of this tool"
            ) from None
        object.__setattr__(self, "_validator", Draft202012Validator(schema))  # frozen: set once, here

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
        violations = list(self._validator.iter_errors(arguments))
        if violations:
            raise self._first_error(violations, arguments)
        return {p.name: p.normalise(arguments[p.name]) if p.name in arguments else p.default for p in self.params}

    def _first_error(self, violations: Iterable[SchemaViolation], arguments: Any) -> ToolError:
        """The violation reported (see the module docstring for the order) as our ``ToolError``."""
        position = {p.name: k for k, p in enumerate(self.params)}

        def rank(v: SchemaViolation) -> tuple[int, int, int]:
            if not v.path:
                return (0, _rank(_OBJECT_CHECKS, v.validator), 0)
            return (1, position.get(v.path[0], len(position)), _rank(_VALUE_CHECKS, v.validator))

        first = min(violations, key=rank)
        if first.path and first.path[0] in position:
            return self.params[position[first.path[0]]].error(str(first.validator), first.instance)
        if first.validator == "type":
            return ToolError(INVALID_ARGUMENTS, f"arguments must be a JSON object, got {json_type_name(arguments)}")
        if first.validator == "additionalProperties":
            unexpected = sorted(str(k) for k in arguments if k not in position)
            return ToolError(UNEXPECTED_ARGUMENT, f"{self.name} has no argument '{unexpected[0]}'")
        if first.validator == "required":
            missing = next(p.name for p in self.params if p.required and p.name not in arguments)
            return ToolError(MISSING_ARGUMENT, f"missing required argument '{missing}'")
        return ToolError(INVALID_ARGUMENTS, f"arguments fail the schema check {first.validator!r}: {first.message}")
