"""Reason codes of rejected CM2 rows, the reject record, the validation config, and how a pydantic
validation error becomes a (field path, reason, message) ``Problem``.

Validators (``envace.data.cm2_schema``) raise ``fail(reason, message, field)``: a ``PydanticCustomError``
whose type is the reason's value and whose context holds the message and, for rules that span fields,
the path below pydantic's own error location. A pydantic built-in error (wrong type, missing field,
literal mismatch) takes the reason of the area of the row it occurred in (``builtin_reason``): a missing
top-level field is MISSING_FIELD, anything inside one tool is BAD_TOOL_SCHEMA, anything inside one tool
call BAD_TOOL_CALL, anything else WRONG_TYPE. Field paths are written
``messages[2].tool_calls[0].function.arguments``; "" is the row itself.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo
from pydantic_core import ErrorDetails, PydanticCustomError


class RejectReason(str, enum.Enum):
    NON_UTF8 = "non_utf8"
    TRUNCATED_JSON = "truncated_json"
    INVALID_JSON = "invalid_json"
    ROW_TOO_LARGE = "row_too_large"
    WRONG_TYPE = "wrong_type"
    MISSING_FIELD = "missing_field"
    DUPLICATE_UUID = "duplicate_uuid"
    BAD_MESSAGE = "bad_message"
    BAD_ROLE_ORDER = "bad_role_order"
    UNPAIRED_TOOL_CALL = "unpaired_tool_call"
    BAD_TOOL_CALL = "bad_tool_call"
    BAD_ARGUMENTS_JSON = "bad_arguments_json"
    ARGUMENTS_VIOLATE_SCHEMA = "arguments_violate_schema"  # only with check_call_arguments
    UNKNOWN_TOOL = "unknown_tool"
    BAD_TOOL_SCHEMA = "bad_tool_schema"
    THINK_TAGS = "think_tags"
    BAD_CHECKLIST = "bad_checklist"
    BAD_WEIGHTS = "bad_weights"
    CHECKLIST_TURN_MISMATCH = "checklist_turn_mismatch"


_REASONS = {r.value: r for r in RejectReason}


@dataclass(frozen=True)
class Reject:
    """One rejected row: where it came from (file, 0-based row index), the field and the reason."""

    row_id: str | None  # the row's uuid when it could be read
    index: int  # list position, or 0-based line number for JSONL
    field: str
    reason_code: RejectReason
    message: str
    source: str | None = None  # the file the row was read from, when it came from one

    def __str__(self) -> str:
        where = f"{self.source} row {self.index}" if self.source else f"row {self.index}"
        if self.row_id is not None:
            where += f" (uuid {self.row_id!r})"
        return f"{where}: {self.reason_code.value} at {self.field or '(row)'}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "row_id": self.row_id,
            "index": self.index,
            "field": self.field,
            "reason_code": self.reason_code.value,
            "message": self.message,
        }


@dataclass(frozen=True)
class Cm2ValidationConfig:
    max_row_bytes: int = 4 * 1024 * 1024
    weight_tolerance: float = 1e-6
    require_think: bool = False  # every assistant message must open with a <think> block
    tool_name_pattern: str = r"[A-Za-z0-9_-]{1,64}"
    check_call_arguments: bool = False  # reject calls whose arguments violate their tool's parameters

    def __post_init__(self) -> None:
        try:
            re.compile(self.tool_name_pattern)
        except re.error as exc:
            raise ValueError(
                f"Cm2ValidationConfig.tool_name_pattern={self.tool_name_pattern!r} is not a regular "
                f"expression ({exc}); give a Python regex such as [A-Za-z0-9_-]{{1,64}}"
            ) from None


@dataclass(frozen=True)
class Problem:
    """The first problem of a row: a field path ("" for the row itself), a reason, a message."""

    field: str
    reason: RejectReason
    message: str


class StrictModel(BaseModel):
    """No coercion (``"7"`` is not a number) and unknown keys kept: CM2 rows carry extra fields."""

    model_config = ConfigDict(strict=True, extra="allow")


def fail(reason: RejectReason, message: str, field: str = "") -> PydanticCustomError:
    """A validation error carrying our reason; ``field`` extends pydantic's location (cross-field rules)."""
    return PydanticCustomError(reason.value, "{message}", {"field": field, "message": message})


def config_of(info: ValidationInfo) -> Cm2ValidationConfig:
    """The ``Cm2ValidationConfig`` a validation runs under (passed as pydantic validation context)."""
    return (info.context or {}).get("config") or Cm2ValidationConfig()


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("messages", 2, "content")`` → ``messages[2].content``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


# ---- pydantic errors as problems --------------------------------------------------------------------

_EXPECTED = {
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "dict_type": "a JSON object",
    "list_type": "a list",
    "string_type": "a string",
}


def builtin_reason(loc: tuple[int | str, ...], kind: str) -> RejectReason:
    """The reason of a pydantic built-in error, by the area of the row it occurred in."""
    if len(loc) <= 1:  # the row itself or one of its four fields
        return RejectReason.MISSING_FIELD if kind == "missing" else RejectReason.WRONG_TYPE
    if loc[0] == "tools":
        return RejectReason.BAD_TOOL_SCHEMA
    if len(loc) >= 4 and loc[0] == "messages" and loc[2] == "tool_calls":
        return RejectReason.BAD_TOOL_CALL
    return RejectReason.WRONG_TYPE


def _builtin_message(error: ErrorDetails) -> str:
    """Our words for a pydantic built-in error (the field path is reported beside it)."""
    loc, kind = tuple(error["loc"]), error["type"]
    last_name = max((k for k, p in enumerate(loc) if isinstance(p, str)), default=0)
    what = f"'{field_path(loc[last_name:])}'" if loc else "a row"
    if kind == "missing":
        return f"the row has no {what} field" if len(loc) == 1 else f"required field {what} is missing"
    if kind == "literal_error":
        return f"{what} must be {(error.get('ctx') or {}).get('expected')}, got {error['input']!r:.80}"
    if kind in _EXPECTED:
        return f"{what} must be {_EXPECTED[kind]}, got {type(error['input']).__name__}"
    return f"{what}: {error['msg']}"


def problem_of(error: ErrorDetails) -> Problem:
    """The ``Problem`` of one pydantic error (one entry of ``ValidationError.errors()``)."""
    loc, kind, ctx = tuple(error["loc"]), error["type"], error.get("ctx") or {}
    if kind not in _REASONS:
        return Problem(field_path(loc), builtin_reason(loc, kind), _builtin_message(error))
    path, extra = field_path(loc), ctx.get("field", "")
    if extra:
        path = f"{path}{'' if extra.startswith('[') or not path else '.'}{extra}"
    return Problem(path, _REASONS[kind], ctx.get("message", error["msg"]))
