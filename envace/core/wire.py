"""Wire formats of the two roles (docs/method.md §1): parse and render what the policy emits.

ACT tool calls use the Hermes/Qwen style that HF chat templates render with ``tools=``::

    optional text
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several blocks in one message are parallel calls. ``parameters`` is accepted as an alias of
``arguments``, and ``arguments`` given as a JSON *string* (OpenAI style) is decoded. A message with
no ``<tool_call>`` tag at all (and no stray closing tag) is a final reply.

REHEARSE outputs are an optional thought followed by exactly one result block::

    <think>
    ...
    </think>

    <execution_result>
    {"temperature": 21}
    </execution_result>

The result must be a JSON object or array (wrap scalars with ``as_result_object``).

Contracts:
- The parsers never raise on any string; every problem becomes a ``ParseError`` with a stable
  ``ParseErrorCode`` (usable as a metric label) and a human-readable message.
- ``parse_tool_calls`` keeps the good blocks of a message when another block is bad.
- The renderers produce exactly what the parsers read back. Reserved tags that occur *inside* JSON
  strings are written with a ``\\u003c`` escape for ``<`` (still valid JSON, decoding to the same
  string) so that a value such as ``"</tool_call>"`` cannot end its block early.
- Tool-call ids are not part of the wire format: rendered calls carry none, parsed calls get
  ``id=None`` (the rollout assigns ids when it needs them).
- ``NaN``/``Infinity`` are not JSON: parsing them is a JSON_DECODE_ERROR, rendering them raises.
- Text before/after the single ``<execution_result>`` block is ignored (small models chatter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from envace.core.records import ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"
_RESERVED_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE)
_CALL_TAG = re.compile(r"</?tool_call>")
_SNIPPET_CHARS = 200


class ParseErrorCode(str, Enum):
    """Why a model output could not be read. Values equal names (stable metric labels)."""

    # tool-call side
    NO_TOOL_CALL_FOUND = "NO_TOOL_CALL_FOUND"  # a call was required, the message has none
    JSON_DECODE_ERROR = "JSON_DECODE_ERROR"  # block (or its arguments string / result) is not JSON
    CALL_NOT_OBJECT = "CALL_NOT_OBJECT"  # block decodes to something other than a JSON object
    NO_ARGUMENTS = "NO_ARGUMENTS"  # neither "arguments" nor "parameters"
    ARGUMENTS_NOT_OBJECT = "ARGUMENTS_NOT_OBJECT"
    INVALID_TOOL_NAME = "INVALID_TOOL_NAME"  # missing, not a non-empty string, or not allowed
    UNCLOSED_TAG = "UNCLOSED_TAG"  # <tool_call> never closed
    # shared: stray closing tag, tag reopened before closing, several result blocks
    TAG_MALFORMED = "TAG_MALFORMED"
    # rehearsal side
    EMPTY_OUTPUT = "EMPTY_OUTPUT"
    NO_EXECUTION_RESULT_TAG = "NO_EXECUTION_RESULT_TAG"
    INVALID_RESULT_TYPE = "INVALID_RESULT_TYPE"  # result is JSON but neither object nor array


@dataclass(frozen=True)
class ParseError:
    code: ParseErrorCode
    message: str
    detail: str = ""  # the offending snippet (truncated)


@dataclass(frozen=True)
class ToolCallParse:
    """What one ACT message says: its calls, the text around them, and what went wrong."""

    calls: tuple[ToolCall, ...] = ()
    content: str = ""  # text outside the call blocks, thinking removed, trimmed
    errors: tuple[ParseError, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def is_final(self) -> bool:
        """A final reply: no call block at all and nothing malformed."""
        return not self.calls and not self.errors


@dataclass(frozen=True)
class RehearsalParse:
    """One REHEARSE output: the rehearsed tool response (None on error) and its thought."""

    result: Any | None = None  # dict or list when ok
    think: str = ""
    errors: tuple[ParseError, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


# ---- shared helpers ---------------------------------------------------------------------------
def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "…"


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


def _loads(text: str) -> Any:
    """Strict JSON decode; raises ValueError (or RecursionError for absurd nesting)."""
    return json.loads(text, parse_constant=_reject_constant)


def _dumps(value: Any) -> str:
    """JSON text with reserved tags inside strings escaped (``<`` → ``\\u003c``)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    for tag in _RESERVED_TAGS:
        if tag in text:
            text = text.replace(tag, "\\u003c" + tag[1:])
    return text


def _split_think(text: str) -> tuple[str, str]:
    """Split text into (visible text, thought text).

    Handles ``<think>…</think>`` blocks anywhere, a leading thought whose opening tag was in the
    prompt (text starts with a ``</think>`` before any ``<think>``), and an unclosed ``<think>``
    (everything after it is unfinished thought).
    """
    thoughts: list[str] = []
    first_close, first_open = text.find(THINK_CLOSE), text.find(THINK_OPEN)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        thoughts.append(text[:first_close])
        text = text[first_close + len(THINK_CLOSE) :]
    visible: list[str] = []
    pos = 0
    while True:
        start = text.find(THINK_OPEN, pos)
        if start == -1:
            visible.append(text[pos:])
            break
        visible.append(text[pos:start])
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end == -1:
            thoughts.append(text[start + len(THINK_OPEN) :])
            break
        thoughts.append(text[start + len(THINK_OPEN) : end])
        pos = end + len(THINK_CLOSE)
    thought = "\n".join(t.strip() for t in thoughts if t.strip())
    return "".join(visible), thought


def strip_think(text: str) -> str:
    """Remove thinking (closed blocks, a leading block opened in the prompt, an unclosed block)."""
    return _split_think(text)[0]


# ---- ACT: tool calls ----------------------------------------------------------------------------
def _split_call_blocks(text: str) -> tuple[str, list[tuple[int, str]], list[ParseError]]:
    """Scan ``<tool_call>`` tags: (text outside blocks, [(block number, raw block)], tag errors)."""
    outside: list[str] = []
    blocks: list[tuple[int, str]] = []
    errors: list[ParseError] = []
    pos, open_at, opened = 0, -1, 0
    for match in _CALL_TAG.finditer(text):
        is_open = match.group() == CALL_OPEN
        if open_at < 0 and is_open:
            outside.append(text[pos : match.start()])
            open_at, opened = match.end(), opened + 1
        elif open_at < 0:
            outside.append(text[pos : match.start()])
            pos = match.end()
            errors.append(
                ParseError(
                    ParseErrorCode.TAG_MALFORMED,
                    f"{CALL_CLOSE} at char {match.start()} has no opening {CALL_OPEN}",
                    _snippet(text[max(0, match.start() - 80) : match.end()]),
                )
            )
        elif is_open:
            errors.append(
                ParseError(
                    ParseErrorCode.TAG_MALFORMED,
                    f"tool call #{opened} reopened with {CALL_OPEN} at char {match.start()} before its {CALL_CLOSE}",
                    _snippet(text[open_at : match.start()]),
                )
            )
            open_at, opened = match.end(), opened + 1
        else:
            blocks.append((opened, text[open_at : match.start()]))
            open_at, pos = -1, match.end()
    if open_at >= 0:
        errors.append(
            ParseError(
                ParseErrorCode.UNCLOSED_TAG,
                f"tool call #{opened} has no closing {CALL_CLOSE} (truncated output?)",
                _snippet(text[open_at:]),
            )
        )
    else:
        outside.append(text[pos:])
    return "".join(outside), blocks, errors


def _decode_arguments(obj: dict[str, Any], where: str, raw: str) -> dict[str, Any] | ParseError:
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None:
        return ParseError(
            ParseErrorCode.NO_ARGUMENTS, f"{where} has no 'arguments' (or 'parameters') key", _snippet(raw)
        )
    args = obj[key]
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string; "" means no arguments
        try:
            args = _loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            return ParseError(
                ParseErrorCode.JSON_DECODE_ERROR, f"{where}: '{key}' string is not JSON ({exc})", _snippet(obj[key])
            )
    if not isinstance(args, dict):
        return ParseError(
            ParseErrorCode.ARGUMENTS_NOT_OBJECT,
            f"{where}: '{key}' must be a JSON object, got {type(args).__name__}",
            _snippet(raw),
        )
    return args


def _decode_call(raw: str, number: int, allowed: frozenset[str] | None) -> ToolCall | ParseError:
    """Decode one block body into a ToolCall, or say why it is not one."""
    where, body = f"tool call #{number}", raw.strip()
    try:
        obj = _loads(body)
    except (ValueError, RecursionError) as exc:
        return ParseError(ParseErrorCode.JSON_DECODE_ERROR, f"{where} is not valid JSON ({exc})", _snippet(body))
    if not isinstance(obj, dict):
        return ParseError(
            ParseErrorCode.CALL_NOT_OBJECT,
            f"{where} must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}",
            _snippet(body),
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ParseError(ParseErrorCode.INVALID_TOOL_NAME, f"{where} needs a non-empty string 'name'", _snippet(body))
    if allowed is not None and name not in allowed:
        shown = ", ".join(sorted(allowed)[:20]) + (", …" if len(allowed) > 20 else "")
        return ParseError(
            ParseErrorCode.INVALID_TOOL_NAME,
            f"{where} calls unknown tool {name!r}; available: {shown or '(none)'}",
            _snippet(body),
        )
    args = _decode_arguments(obj, where, body)
    if isinstance(args, ParseError):
        return args
    return ToolCall(name=name, arguments=args)


def require_tool_call(parse: ToolCallParse) -> ToolCallParse:
    """The same parse, with NO_TOOL_CALL_FOUND added when the message is a final reply."""
    if not parse.is_final:
        return parse
    error = ParseError(
        ParseErrorCode.NO_TOOL_CALL_FOUND,
        f"expected at least one {CALL_OPEN} block, found none",
        _snippet(parse.content),
    )
    return replace(parse, errors=parse.errors + (error,))


def parse_tool_calls(text: str, *, allowed_names: Iterable[str] | None = None, require: bool = False) -> ToolCallParse:
    """Read the tool calls of one ACT message (never raises on any string).

    Args:
        text: the generated message (thinking is stripped first).
        allowed_names: tool whitelist; a call to another name is INVALID_TOOL_NAME. None = any name.
        require: add NO_TOOL_CALL_FOUND when the message holds no call block.
    """
    allowed = None if allowed_names is None else frozenset(allowed_names)
    outside, blocks, errors = _split_call_blocks(strip_think(text))
    calls: list[ToolCall] = []
    for number, raw in blocks:
        decoded = _decode_call(raw, number, allowed)
        if isinstance(decoded, ParseError):
            errors.append(decoded)
        else:
            calls.append(decoded)
    parse = ToolCallParse(calls=tuple(calls), content=outside.strip(), errors=tuple(errors))
    return require_tool_call(parse) if require else parse


def render_tool_calls(calls: Iterable[ToolCall], content: str = "") -> str:
    """Render an ACT message the way Qwen/Hermes chat templates do (content, then one block per call).

    Raises TypeError/ValueError when arguments are not JSON-serialisable (or hold NaN/Infinity).
    """
    parts = [content] if content else []
    for i, call in enumerate(calls):
        if content or i > 0:
            parts.append("\n")
        body = _dumps({"name": call.name, "arguments": call.arguments})
        parts.append(f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
    return "".join(parts)


# ---- REHEARSE: execution results ----------------------------------------------------------------
def _result_block(body: str) -> str | ParseError:
    """The raw text inside the single result block of ``body`` (thinking already removed)."""
    n_open, n_close = body.count(RESULT_OPEN), body.count(RESULT_CLOSE)
    if n_open == 0 and n_close == 0:
        return ParseError(
            ParseErrorCode.NO_EXECUTION_RESULT_TAG,
            f"no {RESULT_OPEN} block after the thinking; wrap the tool response in {RESULT_OPEN}…{RESULT_CLOSE}",
            _snippet(body.strip()),
        )
    start, end = body.find(RESULT_OPEN), body.find(RESULT_CLOSE)
    if n_open != 1 or n_close != 1 or end < start:
        return ParseError(
            ParseErrorCode.TAG_MALFORMED,
            f"expected exactly one {RESULT_OPEN}…{RESULT_CLOSE} block, found {n_open} opening "
            f"and {n_close} closing tags" + (" (closing first)" if 0 <= end < start else ""),
            _snippet(body.strip()),
        )
    return body[start + len(RESULT_OPEN) : end]


def parse_rehearsal(text: str) -> RehearsalParse:
    """Read one REHEARSE output: optional thought, then one JSON object/array result (never raises)."""
    if not text.strip():
        return RehearsalParse(errors=(ParseError(ParseErrorCode.EMPTY_OUTPUT, "the rehearsal output is empty"),))
    body, think = _split_think(text)
    raw = _result_block(body)
    if isinstance(raw, ParseError):
        return RehearsalParse(think=think, errors=(raw,))
    raw = raw.strip()
    try:
        result = _loads(raw)
    except (ValueError, RecursionError) as exc:
        error = ParseError(
            ParseErrorCode.JSON_DECODE_ERROR, f"execution result is not valid JSON ({exc})", _snippet(raw)
        )
        return RehearsalParse(think=think, errors=(error,))
    if not isinstance(result, (dict, list)):
        error = ParseError(
            ParseErrorCode.INVALID_RESULT_TYPE,
            f"execution result must be a JSON object or array, got {type(result).__name__}",
            _snippet(raw),
        )
        return RehearsalParse(think=think, errors=(error,))
    return RehearsalParse(result=result, think=think)


def as_result_object(value: Any) -> dict[str, Any] | list[Any]:
    """A tool response in the shape the rehearsal format allows: objects/arrays as-is, else {"result": v}."""
    return value if isinstance(value, (dict, list)) else {"result": value}


def render_rehearsal(result: dict[str, Any] | list[Any], think: str | None = None) -> str:
    """Render a REHEARSE output that ``parse_rehearsal`` reads back as ``result`` (and ``think``).

    Raises TypeError when ``result`` is not a dict or list (use ``as_result_object``).
    """
    if not isinstance(result, (dict, list)):
        raise TypeError(
            f"render_rehearsal: result must be a dict or list, got {type(result).__name__}; "
            "wrap scalars with as_result_object(value)"
        )
    block = f"{RESULT_OPEN}\n{_dumps(result)}\n{RESULT_CLOSE}"
    if think is None:
        return block
    return f"{THINK_OPEN}\n{think}\n{THINK_CLOSE}\n\n{block}"
