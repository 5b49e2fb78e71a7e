"""The self-critique wire format of test-time rehearsal (docs/method.md §12): parse and render.

``<critique>{"assessment": str, "success_likely": bool, "revision": str}</critique>``. ``parse_critique``
never raises; it returns structured error codes. A failed critique is recorded on the attempt and is not
fatal.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from envace.core.wire import strip_think


class CritiqueErrorCode(str, enum.Enum):
    EMPTY_OUTPUT = "EMPTY_OUTPUT"
    NO_CRITIQUE_TAG = "NO_CRITIQUE_TAG"
    TAG_MALFORMED = "TAG_MALFORMED"  # an opening tag without its closing tag
    JSON_DECODE_ERROR = "JSON_DECODE_ERROR"
    INVALID_JSON_TYPE = "INVALID_JSON_TYPE"  # the payload is not a JSON object
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_FIELD_TYPE = "INVALID_FIELD_TYPE"


@dataclass(frozen=True)
class CritiqueError:
    code: CritiqueErrorCode
    message: str


@dataclass(frozen=True)
class Critique:
    assessment: str
    success_likely: bool
    revision: str

    def to_json(self) -> dict[str, Any]:
        return {"assessment": self.assessment, "success_likely": self.success_likely, "revision": self.revision}


@dataclass(frozen=True)
class CritiqueParse:
    critique: Critique | None
    errors: tuple[CritiqueError, ...] = ()

    @property
    def ok(self) -> bool:
        return self.critique is not None and not self.errors


_OPEN, _CLOSE = "<critique>", "</critique>"
_BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False}


def _error(code: CritiqueErrorCode, message: str) -> CritiqueParse:
    return CritiqueParse(None, (CritiqueError(code, message),))


def _coerce_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _BOOL_WORDS.get(value.strip().lower())
    return None


def parse_critique(text: str) -> CritiqueParse:
    """Parse the first ``<critique>{json}</critique>`` block; never raises.

    ``success_likely`` accepts a JSON bool or the strings true/false/yes/no; the two text fields must be
    strings. Extra keys are ignored.
    """
    body = strip_think(text if isinstance(text, str) else "").strip()
    if not body:
        return _error(CritiqueErrorCode.EMPTY_OUTPUT, "the critique generation is empty")
    start = body.find(_OPEN)
    if start < 0:
        return _error(CritiqueErrorCode.NO_CRITIQUE_TAG, f"no {_OPEN} tag in the critique output")
    end = body.find(_CLOSE, start)
    if end < 0:
        return _error(CritiqueErrorCode.TAG_MALFORMED, f"{_OPEN} is never closed by {_CLOSE}")
    payload = body[start + len(_OPEN) : end].strip()
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return _error(CritiqueErrorCode.JSON_DECODE_ERROR, f"critique payload is not JSON: {exc}")
    if not isinstance(obj, dict):
        return _error(CritiqueErrorCode.INVALID_JSON_TYPE, f"critique payload is {type(obj).__name__}, not an object")
    missing = [k for k in ("assessment", "success_likely", "revision") if k not in obj]
    if missing:
        return _error(CritiqueErrorCode.MISSING_FIELD, f"critique lacks field(s) {missing}")
    likely = _coerce_bool(obj["success_likely"])
    if likely is None or not isinstance(obj["assessment"], str) or not isinstance(obj["revision"], str):
        return _error(
            CritiqueErrorCode.INVALID_FIELD_TYPE,
            "critique fields must be assessment: str, success_likely: bool, revision: str",
        )
    return CritiqueParse(Critique(obj["assessment"], likely, obj["revision"]))


def render_critique(critique: Critique) -> str:
    """The wire form ``parse_critique`` reads (used by scripted backends and few-shot prompts)."""
    return f"{_OPEN}{json.dumps(critique.to_json(), ensure_ascii=False)}{_CLOSE}"
