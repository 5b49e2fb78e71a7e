"""Raw CM2 rows: a reader that never crashes, validation with reasons, splits, statistics, episode specs.

A raw CM2 row is ``{uuid, messages[], tools[], checklists[variant][user_turn][item]}`` (see the public
sample described in ``../shared/data/cm2/README.md``). The full data set is user-supplied, so nothing
here trusts it:

* ``read_cm2_bytes`` / ``read_cm2_file`` accept a JSON list, a single JSON object or JSONL. Bytes that
  are not UTF-8 are kept as surrogate escapes, and the row containing them is rejected (NON_UTF8). A list
  that stops half-way (a truncated download) yields its complete elements plus one TRUNCATED_JSON
  reject; an element or line that is not JSON is an INVALID_JSON reject and reading goes on.
* ``validate_rows`` checks each row and returns ``(accepted, rejects)`` with one ``Reject`` per bad row
  (its first problem): ``len(accepted) + len(rejects) == len(rows)``.
* ``split_of`` puts a uuid into train/val by ``zlib.crc32`` (stable across processes and machines).
* ``cm2_row_to_episode_spec`` extracts what a rollout needs; ``rehearsal_examples`` returns recorded
  (call, response) pairs strictly from turns before the one being rehearsed (no future-turn leak);
  ``to_engine_spec`` converts the result into the training engines' ``EpisodeSpec``.

A JSONL reject's ``index`` is its 0-based line number; a list element's is its position. The whole file
is read into memory; ``max_row_bytes`` bounds each accepted row (measured as compact UTF-8 JSON).

Choices: tool-call arguments are checked to be JSON objects and to name a listed tool, not against the
tool's parameter schema (CM2 keeps deliberately wrong calls whose tool responses are errors); tool
names follow OpenAI's pattern ``[A-Za-z0-9_-]{1,64}`` unless configured otherwise; checklist
``dependence`` ids are not cross-checked.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tqdm import tqdm

from envace.core.checklist import (
    Checklist,
    ChecklistFormatError,
    ChecklistWeightError,
    conversation_steps,
    json_or_text,
    split_thinking,
)
from envace.core.records import ToolCall
from envace.envs.base import Task

logger = logging.getLogger(__name__)

ROLES = frozenset({"system", "user", "assistant", "tool"})
JSON_SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
_BAD_BYTES = re.compile("[\udc80-\udcff]")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|"|[{}\[\],]')
_DECODER = json.JSONDecoder()


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
    UNKNOWN_TOOL = "unknown_tool"
    BAD_TOOL_SCHEMA = "bad_tool_schema"
    THINK_TAGS = "think_tags"
    BAD_CHECKLIST = "bad_checklist"
    BAD_WEIGHTS = "bad_weights"
    CHECKLIST_TURN_MISMATCH = "checklist_turn_mismatch"


@dataclass(frozen=True)
class Reject:
    row_id: str | None  # the row's uuid when it could be read
    index: int  # list position, or 0-based line number for JSONL
    field: str
    reason_code: RejectReason
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
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


@dataclass(frozen=True)
class RawRow:
    index: int
    value: Any


class _RowProblem(Exception):
    def __init__(self, field: str, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.field, self.reason, self.message = field, reason, message


# ---- reading ------------------------------------------------------------------------------------


def _value_end(text: str, start: int) -> int | None:
    """End of the JSON value at ``start`` judged by bracket balance alone; None if the text ends first."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        tok = m.group()
        if tok == '"':
            return None  # a string that never closes
        if tok[0] == '"':
            continue
        if tok in "{[":
            depth += 1
        elif tok in "}]":
            if depth == 0:
                return m.start()
            depth -= 1
            if depth == 0:
                return m.end()
        elif depth == 0:  # a comma ends a scalar
            return m.start()
    return None


def _parse_span(span: str, index: int) -> RawRow | Reject:
    """One JSON value (a list element or a JSONL line) as a row or a reject."""
    if _BAD_BYTES.search(span):
        return Reject(None, index, "", RejectReason.NON_UTF8, "the row contains bytes that are not UTF-8")
    try:
        return RawRow(index, json.loads(span))
    except (ValueError, RecursionError) as exc:
        truncated = _value_end(span.strip(), 0) is None
        reason = RejectReason.TRUNCATED_JSON if truncated else RejectReason.INVALID_JSON
        return Reject(None, index, "", reason, f"not valid JSON: {str(exc)[:200]}")


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _next_element(text: str, pos: int, index: int) -> tuple[RawRow | Reject, int | None]:
    """The list element starting at ``pos`` and where it ends (None: the text is cut off inside it)."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):
        cut = _value_end(text, pos)
        if cut is None:
            return Reject(
                None, index, "", RejectReason.TRUNCATED_JSON, "the list is cut off inside this row"
            ), None
        end = max(cut, pos + 1)
        return _parse_span(text[pos:end], index), end
    if _BAD_BYTES.search(text, pos, end):
        return _parse_span(text[pos:end], index), end
    return RawRow(index, value), end


def _read_json_list(text: str) -> tuple[list[RawRow], list[Reject]]:
    """Elements of a JSON list one by one, so that one bad or cut-off element costs one row."""
    rows: list[RawRow] = []
    rejects: list[Reject] = []
    pos, index = _skip_ws(text, 1), 0
    while pos < len(text) and text[pos] != "]":
        item, end = _next_element(text, pos, index)
        if isinstance(item, RawRow):
            rows.append(item)
        else:
            rejects.append(item)
        if end is None:
            return rows, rejects
        index += 1
        pos = _skip_ws(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    if pos >= len(text):
        logger.warning("CM2 list has no closing ']' after %d row(s); the file may be truncated", index)
    return rows, rejects


def _read_jsonl(text: str) -> tuple[list[RawRow], list[Reject]]:
    rows: list[RawRow] = []
    rejects: list[Reject] = []
    for lineno, line in enumerate(text.split("\n")):
        if line.strip():
            item = _parse_span(line.strip(), lineno)
            if isinstance(item, RawRow):
                rows.append(item)
            else:
                rejects.append(item)
    return rows, rejects


def read_cm2_bytes(data: bytes) -> tuple[list[RawRow], list[Reject]]:
    """Rows of a JSON list, a single JSON object or JSONL; never raises on any content."""
    text = data.decode("utf-8", errors="surrogateescape").lstrip("\ufeff")
    stripped = text.strip()
    if not stripped:
        return [], []
    if stripped[0] == "[":
        return _read_json_list(stripped)
    if stripped[0] == "{" and "\n" in stripped:
        try:  # a single pretty-printed object
            whole = json.loads(stripped)
        except (ValueError, RecursionError):
            whole = None
        if isinstance(whole, dict) and _BAD_BYTES.search(stripped):
            return [], [
                Reject(None, 0, "", RejectReason.NON_UTF8, "the row contains bytes that are not UTF-8")
            ]
        if isinstance(whole, dict):
            return [RawRow(0, whole)], []
    return _read_jsonl(stripped)


def read_cm2_file(path: str | Path) -> tuple[list[RawRow], list[Reject]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CM2 data file {path} does not exist; put the raw CM2 JSON/JSONL there")
    return read_cm2_bytes(path.read_bytes())


# ---- validation ---------------------------------------------------------------------------------


def _check_size(row: Any, config: Cm2ValidationConfig) -> None:
    try:
        n_bytes = len(json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except UnicodeEncodeError:
        raise _RowProblem(
            "", RejectReason.NON_UTF8, "the row holds text that cannot be encoded as UTF-8"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise _RowProblem(
            "", RejectReason.WRONG_TYPE, f"the row is not plain JSON: {str(exc)[:200]}"
        ) from None
    if n_bytes > config.max_row_bytes:
        raise _RowProblem(
            "",
            RejectReason.ROW_TOO_LARGE,
            f"row is {n_bytes} bytes, above max_row_bytes={config.max_row_bytes}",
        )


def _require(row: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in row:
        raise _RowProblem(key, RejectReason.MISSING_FIELD, f"the row has no '{key}' field")
    value = row[key]
    if not isinstance(value, kind):
        raise _RowProblem(key, RejectReason.WRONG_TYPE, f"'{key}' must be {what}, got {type(value).__name__}")
    return value


def _check_tool_schema(tool: Any, where: str, name_re: re.Pattern[str]) -> str:
    """The name of a valid OpenAI function tool; ``_RowProblem`` otherwise."""
    bad = RejectReason.BAD_TOOL_SCHEMA
    if (
        not isinstance(tool, Mapping)
        or tool.get("type") != "function"
        or not isinstance(tool.get("function"), Mapping)
    ):
        raise _RowProblem(where, bad, 'a tool must be {"type": "function", "function": {...}}')
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not name_re.fullmatch(name):
        raise _RowProblem(
            f"{where}.function.name", bad, f"tool name {name!r} does not match {name_re.pattern}"
        )
    if not isinstance(fn.get("description", ""), str):
        raise _RowProblem(f"{where}.function.description", bad, "the description must be a string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping) or (params and params.get("type") != "object"):
        raise _RowProblem(
            f"{where}.function.parameters", bad, "parameters must be a JSON schema of type object"
        )
    props = params.get("properties", {})
    if not isinstance(props, Mapping) or not all(isinstance(p, Mapping) for p in props.values()):
        raise _RowProblem(
            f"{where}.function.parameters.properties", bad, "properties must map names to schemas"
        )
    for pname, prop in props.items():
        ptype = prop.get("type")
        types = ptype if isinstance(ptype, list) else [ptype] if ptype is not None else []
        if not all(isinstance(t, str) and t in JSON_SCHEMA_TYPES for t in types):
            raise _RowProblem(
                f"{where}.function.parameters.properties.{pname}", bad, f"unknown type {ptype!r}"
            )
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) and r in props for r in required):
        raise _RowProblem(
            f"{where}.function.parameters.required", bad, "required must list declared properties"
        )
    return name


def _check_tools(tools: list[Any], config: Cm2ValidationConfig) -> set[str]:
    name_re = re.compile(config.tool_name_pattern)
    names: list[str] = [_check_tool_schema(t, f"tools[{k}]", name_re) for k, t in enumerate(tools)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _RowProblem("tools", RejectReason.BAD_TOOL_SCHEMA, f"tools declared twice: {duplicates}")
    return set(names)


def _check_call(call: Any, where: str, tool_names: set[str]) -> None:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if (
        not isinstance(fn, Mapping)
        or not isinstance(fn.get("name"), str)
        or call.get("type", "function") != "function"
    ):
        raise _RowProblem(
            where,
            RejectReason.BAD_TOOL_CALL,
            'a tool call must be {"type": "function", "function": {"name", "arguments"}}',
        )
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            raise _RowProblem(
                f"{where}.function.arguments", RejectReason.BAD_ARGUMENTS_JSON, "arguments are not valid JSON"
            ) from None
    if not isinstance(args, Mapping):
        raise _RowProblem(
            f"{where}.function.arguments", RejectReason.BAD_ARGUMENTS_JSON, "arguments must be a JSON object"
        )
    if fn["name"] not in tool_names:
        raise _RowProblem(
            f"{where}.function.name",
            RejectReason.UNKNOWN_TOOL,
            f"call to {fn['name']!r}, which is not among the row's tools",
        )


def _check_message(msg: Any, k: int) -> None:
    where = f"messages[{k}]"
    if not isinstance(msg, Mapping):
        raise _RowProblem(
            where, RejectReason.WRONG_TYPE, f"a message must be an object, got {type(msg).__name__}"
        )
    role = msg.get("role")
    if role not in ROLES:
        raise _RowProblem(
            f"{where}.role", RejectReason.BAD_MESSAGE, f"role {role!r} is not one of {sorted(ROLES)}"
        )
    calls = msg.get("tool_calls", [])
    if calls is None:
        calls = []
    if not isinstance(calls, list):
        raise _RowProblem(f"{where}.tool_calls", RejectReason.WRONG_TYPE, "tool_calls must be a list")
    if calls and role != "assistant":
        raise _RowProblem(
            f"{where}.tool_calls", RejectReason.BAD_MESSAGE, f"a {role} message cannot carry tool calls"
        )
    content = msg.get("content")
    if not isinstance(content, str) and not (content is None and role == "assistant" and calls):
        raise _RowProblem(f"{where}.content", RejectReason.WRONG_TYPE, "content must be a string")
    if role == "user" and not content.strip():
        raise _RowProblem(f"{where}.content", RejectReason.BAD_MESSAGE, "a user message is empty")


def _check_think(msg: Mapping[str, Any], k: int, config: Cm2ValidationConfig) -> None:
    content = msg.get("content") or ""
    opens, closes = content.count("<think>"), content.count("</think>")
    field = f"messages[{k}].content"
    if msg["role"] != "assistant":
        if opens or closes:
            raise _RowProblem(field, RejectReason.THINK_TAGS, f"a {msg['role']} message contains think tags")
        return
    if opens > 1 or opens != closes:
        raise _RowProblem(
            field,
            RejectReason.THINK_TAGS,
            f"{opens} <think> and {closes} </think> tags; expected one pair at most",
        )
    if opens and (
        not content.lstrip().startswith("<think>") or content.index("<think>") > content.index("</think>")
    ):
        raise _RowProblem(field, RejectReason.THINK_TAGS, "the <think> block must open the message")
    if config.require_think and not opens:
        raise _RowProblem(
            field, RejectReason.THINK_TAGS, "require_think is set but the message has no <think> block"
        )


def _check_role_order(messages: Sequence[Mapping[str, Any]]) -> None:
    """[system] user assistant ..., each assistant call answered by one tool message, ending on a reply."""
    order, unpaired = RejectReason.BAD_ROLE_ORDER, RejectReason.UNPAIRED_TOOL_CALL
    first = 1 if messages[0]["role"] == "system" else 0
    allowed, pending = {"user"}, 0
    for k in range(first, len(messages)):
        msg, role = messages[k], messages[k]["role"]
        if pending:
            if role != "tool":
                raise _RowProblem(
                    f"messages[{k}]", unpaired, f"{pending} tool call(s) still unanswered at a {role} message"
                )
            pending -= 1
            continue
        if role == "tool":
            raise _RowProblem(f"messages[{k}]", unpaired, "a tool message that answers no tool call")
        if role not in allowed:
            raise _RowProblem(f"messages[{k}]", order, f"a {role} message where {sorted(allowed)} must come")
        calls = msg.get("tool_calls") or []
        if role == "assistant" and calls:
            _check_answer_ids(messages, k, calls)
            pending, allowed = len(calls), {"assistant"}
        else:
            allowed = {"assistant"} if role == "user" else {"user"}
    if pending:
        raise _RowProblem(
            "messages", unpaired, f"the conversation ends with {pending} unanswered tool call(s)"
        )
    if messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
        raise _RowProblem(
            f"messages[{len(messages) - 1}]", order, "the conversation must end with an assistant reply"
        )


def _check_answer_ids(messages: Sequence[Mapping[str, Any]], k: int, calls: list[Any]) -> None:
    answers = messages[k + 1 : k + 1 + len(calls)]
    call_ids = {c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str) and c["id"]}
    answer_ids = {
        m["tool_call_id"] for m in answers if isinstance(m.get("tool_call_id"), str) and m["tool_call_id"]
    }
    if call_ids and answer_ids and answer_ids != call_ids:
        raise _RowProblem(
            f"messages[{k}].tool_calls",
            RejectReason.UNPAIRED_TOOL_CALL,
            "tool_call_id values do not match the call ids",
        )


def _check_checklists(raw: list[Any], n_user_turns: int, config: Cm2ValidationConfig) -> None:
    if not raw:
        raise _RowProblem("checklists", RejectReason.BAD_CHECKLIST, "no checklist variant")
    for v, variant in enumerate(raw):
        where = f"checklists[{v}]"
        try:
            checklist = Checklist.from_raw(variant, where, weight_tolerance=config.weight_tolerance)
        except ChecklistWeightError as exc:
            raise _RowProblem(exc.field, RejectReason.BAD_WEIGHTS, exc.problem) from None
        except ChecklistFormatError as exc:
            raise _RowProblem(exc.field, RejectReason.BAD_CHECKLIST, exc.problem) from None
        if checklist.n_turns != n_user_turns:
            raise _RowProblem(
                where,
                RejectReason.CHECKLIST_TURN_MISMATCH,
                f"{checklist.n_turns} checklist turn(s) for {n_user_turns} user turn(s)",
            )


def check_row(row: Any, config: Cm2ValidationConfig = Cm2ValidationConfig()) -> None:
    """Raise ``ValueError`` naming the field and reason of the first problem of ``row``."""
    try:
        _check_row(row, config)
    except _RowProblem as p:
        raise ValueError(f"CM2 row, field {p.field or '(row)'}: {p.reason.value}: {p.message}") from None


def _check_row(row: Any, config: Cm2ValidationConfig) -> None:
    if not isinstance(row, Mapping):
        raise _RowProblem(
            "", RejectReason.WRONG_TYPE, f"a row must be a JSON object, got {type(row).__name__}"
        )
    _check_size(row, config)
    uuid = _require(row, "uuid", str, "a string")
    if not uuid.strip():
        raise _RowProblem("uuid", RejectReason.MISSING_FIELD, "the uuid is empty")
    messages = _require(row, "messages", list, "a list")
    tools = _require(row, "tools", list, "a list")
    checklists = _require(row, "checklists", list, "a list")
    if not messages:
        raise _RowProblem("messages", RejectReason.BAD_MESSAGE, "the conversation is empty")
    for k, msg in enumerate(messages):
        _check_message(msg, k)
    tool_names = _check_tools(tools, config)
    for k, msg in enumerate(messages):
        for c, call in enumerate(msg.get("tool_calls") or []):
            _check_call(call, f"messages[{k}].tool_calls[{c}]", tool_names)
        _check_think(msg, k, config)
    _check_role_order(messages)
    _check_checklists(checklists, sum(m["role"] == "user" for m in messages), config)


def _row_id(row: Any) -> str | None:
    uid = row.get("uuid") if isinstance(row, Mapping) else None
    return uid if isinstance(uid, str) else None


def validate_rows(
    rows: Sequence[Any], config: Cm2ValidationConfig = Cm2ValidationConfig()
) -> tuple[list[dict[str, Any]], list[Reject]]:
    """Accepted rows and one ``Reject`` per bad row; ``RawRow`` inputs keep their source index."""
    accepted: list[dict[str, Any]] = []
    rejects: list[Reject] = []
    seen: set[str] = set()
    for pos, item in enumerate(tqdm(rows, desc="validate CM2", disable=len(rows) < 2000)):
        index, row = (item.index, item.value) if isinstance(item, RawRow) else (pos, item)
        try:
            _check_row(row, config)
            if row["uuid"] in seen:
                raise _RowProblem(
                    "uuid", RejectReason.DUPLICATE_UUID, f"uuid {row['uuid']!r} appeared before"
                )
        except _RowProblem as p:
            rejects.append(Reject(_row_id(row), index, p.field, p.reason, p.message))
            continue
        seen.add(row["uuid"])
        accepted.append(row)
    return accepted, rejects


def load_cm2(
    path: str | Path, config: Cm2ValidationConfig = Cm2ValidationConfig()
) -> tuple[list[dict[str, Any]], list[Reject]]:
    """Read and validate a CM2 file: (accepted rows, rejects of reading and validation by index)."""
    raw, read_rejects = read_cm2_file(path)
    accepted, rejects = validate_rows(raw, config)
    all_rejects = sorted(read_rejects + rejects, key=lambda r: r.index)
    logger.info(
        "CM2 %s: %d accepted, %d rejected %s",
        path,
        len(accepted),
        len(all_rejects),
        reject_counts(all_rejects),
    )
    return accepted, all_rejects


def reject_counts(rejects: Iterable[Reject]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rejects:
        counts[r.reason_code.value] = counts.get(r.reason_code.value, 0) + 1
    return dict(sorted(counts.items()))


# ---- splits and statistics ----------------------------------------------------------------------


def split_of(uuid: str, val_fraction: float, seed: int = 0) -> str:
    """ "val" or "train" for a uuid, from ``zlib.crc32`` of (seed, uuid): stable everywhere."""
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction={val_fraction} must lie in [0, 1]")
    bucket = zlib.crc32(f"{seed}:{uuid}".encode("utf-8", errors="surrogatepass")) / 2**32
    return "val" if bucket < val_fraction else "train"


def split_rows(
    rows: Sequence[Mapping[str, Any]], val_fraction: float = 0.05, seed: int = 0
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(train, val) rows by ``split_of`` of their uuid; input order is kept within each split."""
    train, val = [], []
    for row in rows:
        (val if split_of(row["uuid"], val_fraction, seed) == "val" else train).append(row)
    return train, val


@dataclass(frozen=True)
class Distribution:
    count: int
    total: int
    mean: float
    min: int
    max: int
    histogram: tuple[tuple[int, int], ...]  # (value, how often), sorted by value

    @classmethod
    def of(cls, values: Sequence[int]) -> "Distribution":
        hist: dict[int, int] = {}
        for v in values:
            hist[v] = hist.get(v, 0) + 1
        n = len(values)
        return cls(
            n,
            sum(values),
            sum(values) / n if n else 0.0,
            min(values, default=0),
            max(values, default=0),
            tuple(sorted(hist.items())),
        )


@dataclass(frozen=True)
class Cm2Stats:
    n_rows: int
    user_turns: Distribution  # per row
    tools_per_row: Distribution
    steps_per_turn: Distribution  # assistant messages per user turn
    calls_per_turn: Distribution
    items_per_turn: Distribution  # checklist items per turn (first variant)
    variants_per_row: Distribution

    def to_json(self) -> dict[str, Any]:
        return {
            k: (
                v.__dict__ | {"histogram": [list(p) for p in v.histogram]}
                if isinstance(v, Distribution)
                else v
            )
            for k, v in self.__dict__.items()
        }


def dataset_stats(rows: Sequence[Mapping[str, Any]]) -> Cm2Stats:
    """Shape statistics of validated rows."""
    turns, tools, steps, calls, items, variants = [], [], [], [], [], []
    for row in rows:
        n_turns = sum(m["role"] == "user" for m in row["messages"])
        turns.append(n_turns)
        tools.append(len(row["tools"]))
        variants.append(len(row["checklists"]))
        per_turn_steps, per_turn_calls = [0] * n_turns, [0] * n_turns
        for st in conversation_steps(row["messages"]):
            per_turn_steps[st.turn] += 1
            per_turn_calls[st.turn] += len(st.assistant.get("tool_calls") or [])
        steps.extend(per_turn_steps)
        calls.extend(per_turn_calls)
        items.extend(len(t) for t in row["checklists"][0])
    d = Distribution.of
    return Cm2Stats(len(rows), d(turns), d(tools), d(steps), d(calls), d(items), d(variants))


# ---- episode specs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedExchange:
    """One recorded (tool call, tool response) pair of the reference conversation."""

    turn: int
    step: int
    call: ToolCall
    response: Any  # the tool message content, parsed when it is JSON


@dataclass(frozen=True)
class EpisodeSpec:
    """What a rollout needs from one CM2 row."""

    uuid: str
    system_prompt: str  # "" when the row has no system message
    tools: tuple[dict[str, Any], ...]
    user_turns: tuple[str, ...]  # replayed in order
    checklist: Checklist  # one variant, one entry per user turn
    exchanges: tuple[tuple[RecordedExchange, ...], ...]  # per user turn, in conversation order
    reference_replies: tuple[str, ...]  # per user turn: user-visible text of its last assistant message

    @property
    def n_turns(self) -> int:
        return len(self.user_turns)

    def to_engine_spec(self) -> Any:
        """This episode as an ``envace.engines.base.EpisodeSpec`` (see ``to_engine_spec``)."""
        return to_engine_spec(self)

    def to_task(self, split: str = "train", domain: str = "cm2") -> Task:
        """The environment-level ``Task`` of this episode (gold calls grouped per assistant step)."""
        gold: list[tuple[tuple[ToolCall, ...], ...]] = []
        for turn in self.exchanges:
            by_step: dict[int, list[ToolCall]] = {}
            for ex in turn:
                by_step.setdefault(ex.step, []).append(ex.call)
            gold.append(tuple(tuple(by_step[s]) for s in sorted(by_step)))
        return Task(
            task_id=self.uuid,
            domain=domain,
            split=split,
            system_prompt=self.system_prompt,
            tools=self.tools,
            user_turns=self.user_turns,
            gold_calls=tuple(gold),
            gold_answers=self.reference_replies,
            checklists=tuple(tuple(it.to_dict() for it in items) for items in self.checklist.turns),
        )


def to_engine_spec(spec: EpisodeSpec) -> Any:
    """The ``envace.engines.base.EpisodeSpec`` of a CM2 episode (recorded responses kept as gold)."""
    from envace.engines.base import EpisodeSpec as EngineSpec  # lazy: data needs no engine at import
    from envace.engines.base import GoldStep

    gold = []
    for turn in spec.exchanges:
        by_step: dict[int, list[RecordedExchange]] = {}
        for ex in turn:
            by_step.setdefault(ex.step, []).append(ex)
        gold.append(
            tuple(
                GoldStep(tuple(e.call for e in by_step[s]), tuple(e.response for e in by_step[s]))
                for s in sorted(by_step)
            )
        )
    return EngineSpec(
        task_id=spec.uuid,
        system_prompt=spec.system_prompt,
        tools=spec.tools,
        user_turns=spec.user_turns,
        checklists=tuple(tuple(it.to_dict() for it in items) for items in spec.checklist.turns),
        gold=tuple(gold),
        gold_answers=spec.reference_replies,
        answer_values=tuple(() for _ in spec.user_turns),
        domain="cm2",
        source="cm2",
    )


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    fn = call["function"]
    args = fn.get("arguments", "{}")
    return ToolCall(
        name=fn["name"],
        arguments=dict(json.loads(args) if isinstance(args, str) else args),
        id=call.get("id"),
    )


def cm2_row_to_episode_spec(
    row: Mapping[str, Any], variant: int = 0, config: Cm2ValidationConfig = Cm2ValidationConfig()
) -> EpisodeSpec:
    """Episode spec of a raw CM2 row (validated here again; ``ValueError`` names the first problem)."""
    check_row(row, config)
    if not 0 <= variant < len(row["checklists"]):
        raise ValueError(
            f"row {row['uuid']}: checklist variant {variant} requested, the row has {len(row['checklists'])}"
        )
    messages = row["messages"]
    user_turns = tuple(m["content"] for m in messages if m["role"] == "user")
    exchanges: list[list[RecordedExchange]] = [[] for _ in user_turns]
    replies = [""] * len(user_turns)
    for st in conversation_steps(messages):
        calls = st.assistant.get("tool_calls") or []
        for call, answer in zip(calls, st.tool_messages):
            exchanges[st.turn].append(
                RecordedExchange(st.turn, st.step, _tool_call(call), json_or_text(answer["content"]))
            )
        replies[st.turn] = split_thinking(st.assistant.get("content"))[1]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    return EpisodeSpec(
        uuid=row["uuid"],
        system_prompt=system,
        tools=tuple(row["tools"]),
        user_turns=user_turns,
        checklist=Checklist.from_raw(
            row["checklists"][variant], f"checklists[{variant}]", config.weight_tolerance
        ),
        exchanges=tuple(tuple(t) for t in exchanges),
        reference_replies=tuple(replies),
    )


def rehearsal_examples(
    spec: EpisodeSpec, turn_index: int, max_examples: int | None = None
) -> tuple[RecordedExchange, ...]:
    """Recorded (call, response) pairs usable as REHEARSE few-shot examples for ``turn_index``.

    Only turns strictly before ``turn_index`` contribute (the reference leaks the rehearsed turn's own
    ground truth; SPEC §1 forbids it). With ``max_examples`` the most recent ones are kept.
    """
    if not 0 <= turn_index < spec.n_turns:
        raise ValueError(f"turn_index={turn_index} outside 0..{spec.n_turns - 1} for episode {spec.uuid}")
    earlier = tuple(ex for turn in spec.exchanges[:turn_index] for ex in turn)
    if max_examples is not None:
        earlier = earlier[-max_examples:] if max_examples > 0 else ()
    assert all(ex.turn < turn_index for ex in earlier)
    return earlier
