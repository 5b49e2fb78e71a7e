"""Raw CM2 rows: a reader that never crashes, validation with reasons, and the public API of the CM2 data
modules.

A raw CM2 row is ``{uuid, messages[], tools[], checklists[variant][user_turn][item]}`` (see the public
sample described in ``../shared/data/cm2/README.md``). The full data set is user-supplied, so nothing
here trusts it:

* ``read_cm2_bytes`` / ``read_cm2_file`` accept a JSON list, a single JSON object or JSONL. Bytes that
  are not UTF-8 are kept as surrogate escapes, and the row containing them is rejected (NON_UTF8). A list
  that stops half-way (a truncated download) yields its complete elements plus one TRUNCATED_JSON
  reject; an element or line that is not JSON is an INVALID_JSON reject and reading goes on.
* ``validate_rows`` checks each row with the pydantic models of ``envace.data.cm2_schema`` and returns
  ``(accepted, rejects)`` with one ``Reject`` per bad row (its first problem):
  ``len(accepted) + len(rejects) == len(rows)``. A reject names its file (``source``), row index, field
  path and reason: ``str(reject)`` reads ``data/raw/cm2/x.jsonl row 17 (uuid 'u'): bad_arguments_json at
  messages[2].tool_calls[0].function.arguments: arguments are not valid JSON``.
* Splits and statistics live in ``envace.data.cm2_splits``, episode specs in ``envace.data.cm2_episodes``;
  every public name is importable from here.

A JSONL reject's ``index`` is its 0-based line number; a list element's is its position. The whole file
is read into memory; ``max_row_bytes`` bounds each accepted row (measured as compact UTF-8 JSON).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from envace.data.cm2_episodes import (
    Cm2Episode,
    RecordedExchange,
    cm2_row_to_episode_spec,
    to_engine_spec,
)
from envace.data.cm2_reasons import Cm2ValidationConfig, Problem, Reject, RejectReason
from envace.data.cm2_schema import JSON_SCHEMA_TYPES, ROLES, Cm2Row, check_row, row_problem
from envace.data.cm2_splits import Cm2Stats, Distribution, dataset_stats, split_of, split_rows

__all__ = [
    "JSON_SCHEMA_TYPES",
    "ROLES",
    "Cm2Row",
    "Cm2Stats",
    "Cm2ValidationConfig",
    "Distribution",
    "Cm2Episode",
    "Problem",
    "RawRow",
    "RecordedExchange",
    "Reject",
    "RejectReason",
    "check_row",
    "cm2_row_to_episode_spec",
    "dataset_stats",
    "load_cm2",
    "read_cm2_bytes",
    "read_cm2_file",
    "reject_counts",
    "row_problem",
    "split_of",
    "split_rows",
    "to_engine_spec",
    "validate_rows",
]

logger = logging.getLogger(__name__)

_BAD_BYTES = re.compile("[\udc80-\udcff]")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|"|[{}\[\],]')
_DECODER = json.JSONDecoder()
_LOGGED_REJECTS = 20  # load_cm2 logs this many rejects one by one, then only the count


@dataclass(frozen=True)
class RawRow:
    index: int
    value: Any
    source: str | None = None  # the file it was read from


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
            return Reject(None, index, "", RejectReason.TRUNCATED_JSON, "the list is cut off inside this row"), None
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


def read_cm2_bytes(data: bytes, source: str | None = None) -> tuple[list[RawRow], list[Reject]]:
    """Rows of a JSON list, a single JSON object or JSONL; never raises on any content. ``source``
    (a file name) is recorded on every row and reject."""
    rows, rejects = _read_text(data.decode("utf-8", errors="surrogateescape"))
    if source is None:
        return rows, rejects
    return [replace(r, source=source) for r in rows], [replace(r, source=source) for r in rejects]


def _read_text(text: str) -> tuple[list[RawRow], list[Reject]]:
    text = text.lstrip("\ufeff")
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
            return [], [Reject(None, 0, "", RejectReason.NON_UTF8, "the row contains bytes that are not UTF-8")]
        if isinstance(whole, dict):
            return [RawRow(0, whole)], []
    return _read_jsonl(stripped)


def read_cm2_file(path: str | Path) -> tuple[list[RawRow], list[Reject]]:
    """Rows and read rejects of one CM2 file, each carrying the path as its ``source``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CM2 data file {path} does not exist; put the raw CM2 JSON/JSONL there")
    return read_cm2_bytes(path.read_bytes(), source=str(path))


# ---- validation ---------------------------------------------------------------------------------


def validate_rows(
    rows: Sequence[Any], config: Cm2ValidationConfig = Cm2ValidationConfig(), source: str | None = None
) -> tuple[list[dict[str, Any]], list[Reject]]:
    """Accepted rows and one ``Reject`` per bad row, so ``len(accepted) + len(rejects) == len(rows)``.

    ``RawRow`` inputs keep their index and file; plain rows are numbered by position and labelled with
    ``source``. A uuid seen before (in this call, across files) is a DUPLICATE_UUID reject.
    """
    accepted: list[dict[str, Any]] = []
    rejects: list[Reject] = []
    seen: dict[str, str] = {}  # uuid -> where it was first accepted
    for pos, item in enumerate(tqdm(rows, desc="validate CM2", disable=len(rows) < 2000)):
        raw = item if isinstance(item, RawRow) else RawRow(pos, item, source)
        origin = raw.source or source
        problem = row_problem(raw.value, config)
        if problem is None and raw.value["uuid"] in seen:
            uuid = raw.value["uuid"]
            problem = Problem("uuid", RejectReason.DUPLICATE_UUID, f"uuid {uuid!r} appeared before, at {seen[uuid]}")
        if problem is not None:
            rejects.append(
                Reject(_row_id(raw.value), raw.index, problem.field, problem.reason, problem.message, origin)
            )
            continue
        seen[raw.value["uuid"]] = f"{origin} row {raw.index}" if origin else f"row {raw.index}"
        accepted.append(raw.value)
    return accepted, rejects


def _row_id(row: Any) -> str | None:
    uid = row.get("uuid") if isinstance(row, dict) else None
    return uid if isinstance(uid, str) else None


def load_cm2(
    path: str | Path, config: Cm2ValidationConfig = Cm2ValidationConfig()
) -> tuple[list[dict[str, Any]], list[Reject]]:
    """Read and validate a CM2 file: (accepted rows, rejects of reading and validation by index)."""
    raw, read_rejects = read_cm2_file(path)
    accepted, rejects = validate_rows(raw, config)
    all_rejects = sorted(read_rejects + rejects, key=lambda r: r.index)
    for reject in all_rejects[:_LOGGED_REJECTS]:
        logger.warning("CM2 reject: %s", reject)
    logger.info(
        "CM2 %s: %d accepted, %d rejected %s",
        path,
        len(accepted),
        len(all_rejects),
        reject_counts(all_rejects),
    )
    return accepted, all_rejects


def reject_counts(rejects: Iterable[Reject]) -> dict[str, int]:
    """How many rejects each reason code has, by code."""
    counts: dict[str, int] = {}
    for r in rejects:
        counts[r.reason_code.value] = counts.get(r.reason_code.value, 0) + 1
    return dict(sorted(counts.items()))
