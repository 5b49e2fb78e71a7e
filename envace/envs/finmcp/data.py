"""FinMCP-Bench samples: load, validate and normalise a user-supplied JSON / JSONL file.

FinMCP-Bench (Qwen DianJin team; arXiv 2603.24943) is distributed on a model hub only, so the user passes
a path. Format, as documented by the authors' DianJin-TIR release (``README.md``, ``infer/demo_infer.json``,
``eval/evaluation.py`` in github.com/aliyun/qwen-dianjin):

* a JSON list of samples (``benchmark_final.json`` = the union of ``benchmark_stss.json`` single step,
  ``benchmark_stms.json`` multi step and ``benchmark_multi_turn.json``); JSONL (one sample per line) and a
  ``{"data": [...]}`` wrapper are accepted too;
* a sample: ``id``; ``messages`` — the expert-checked ground-truth conversation in OpenAI chat format:
  ``user`` messages, ``assistant`` messages with ``tool_calls`` (``function.arguments`` a JSON *string*)
  and/or ``content`` (``reasoning_content`` may be present), ``tool`` messages with ``tool_call_id`` and the
  recorded MCP response as text; ``tool_list`` — the tools used, a list of per-step lists for single/multi
  step samples and a flat list for multi-turn ones (the training demo calls it ``tool_path``);
  ``scenery`` ("level1-level2-…"), ``first-class``, ``sub-class``, ``diff_level`` ({turns, tool_number,
  para_tool_call_number, level}), ``task`` ("single step" | "multi step" | "multi turn"), ``question``,
  ``answer``, ``task info`` (multi-turn user-simulation instruction), ``annotation``.
* Tool *schemas* are not in the samples: the authors pass one global MCP schema file to every request
  (``envace.envs.finmcp.tools`` reads it, or infers minimal schemas from the recorded calls). A sample
  that does carry ``tools`` has them normalised by ``normalise_tool_schema``.

Multi-turn samples end with a user message ``###STOP###`` (the user simulator's stop marker); it is not a
request and is dropped. Every problem raises ``FinMCPFormatError`` naming the file, row and field.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.core.prompts import Message
from envace.core.records import ToolCall

logger = logging.getLogger(__name__)

STOP_MARKERS = frozenset({"###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"})
_ID_KEYS = ("id", "sample_id", "uuid")
_TOOL_LIST_KEYS = ("tool_list", "tool_path")
_WRAPPER_KEYS = ("data", "samples", "examples")
_ROLES = frozenset({"system", "user", "assistant", "tool"})


class FinMCPFormatError(ValueError):
    """A FinMCP-Bench file does not have the documented shape (message names file, row and field)."""


@dataclass(frozen=True)
class RecordedCall:
    """One ground-truth call and the MCP response recorded for it."""

    turn: int  # user turn it belongs to
    call: ToolCall
    response: Any  # decoded JSON when the recorded text is JSON, else the text itself
    has_response: bool = True


@dataclass(frozen=True)
class FinMCPSample:
    sample_id: str
    source: str  # "file:row"
    system_prompt: str
    user_turns: tuple[str, ...]
    turn_messages: tuple[tuple[Message, ...], ...]  # per user turn: the gold messages that follow it
    gold_calls: tuple[tuple[tuple[ToolCall, ...], ...], ...]  # per turn, per assistant step
    gold_answers: tuple[str, ...]
    recorded: tuple[RecordedCall, ...]
    tool_names: tuple[str, ...]  # tools the sample uses (tool_list ∪ names in messages), first-seen order
    tools: tuple[dict[str, Any], ...] = ()  # per-sample schemas when the file carries them
    scenario: str = ""
    category: str = "unknown"
    sub_category: str = ""
    task_type: str = "unknown"  # single_step | multi_step | multi_turn
    difficulty: str = "unknown"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def gold_tool_sequence(self) -> tuple[str, ...]:
        """Tool names of every gold call, in conversation order (what the official scorer compares)."""
        return tuple(c.name for turn in self.gold_calls for step in turn for c in step)

    def history_before(self, turn: int) -> tuple[Message, ...]:
        """Gold messages (after the system message) that precede user turn ``turn``."""
        out: list[Message] = []
        for k in range(turn):
            out.append({"role": "user", "content": self.user_turns[k]})
            out.extend(self.turn_messages[k])
        return tuple(out)


# ---- reading files --------------------------------------------------------------------------------
def _rows_of_json(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FinMCPFormatError(
            f"{path}: not valid JSON ({exc}); FinMCP-Bench files are a JSON list of samples "
            "or JSONL (one sample per line, use the .jsonl suffix)"
        ) from None
    if isinstance(data, dict):
        key = next((k for k in _WRAPPER_KEYS if isinstance(data.get(k), list)), None)
        if key is None:
            raise FinMCPFormatError(
                f"{path}: top level is an object without a sample list under "
                f"{list(_WRAPPER_KEYS)}; expected a JSON list of samples"
            )
        data = data[key]
    if not isinstance(data, list):
        raise FinMCPFormatError(f"{path}: top level is {type(data).__name__}; expected a JSON list of samples")
    return data


def _rows_of_jsonl(path: Path) -> list[Any]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise FinMCPFormatError(f"{path}: line {number + 1} is not valid JSON ({exc})") from None
    return rows


def read_rows(path: str | Path) -> list[tuple[str, int, Any]]:
    """(file, row, raw sample) for a file, or for every .json/.jsonl file of a directory (sorted)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(
            f"FinMCP-Bench data not found at {root}; the benchmark is hub-only: download it "
            "(e.g. benchmark_final.json) and pass its path"
        )
    files = sorted(p for p in root.iterdir() if p.suffix in (".json", ".jsonl")) if root.is_dir() else [root]
    if not files:
        raise FinMCPFormatError(f"{root}: directory holds no .json or .jsonl file")
    out = []
    for file in files:
        rows = _rows_of_jsonl(file) if file.suffix == ".jsonl" else _rows_of_json(file)
        out.extend((str(file), i, row) for i, row in enumerate(rows))
    return out


# ---- normalising one sample ------------------------------------------------------------------------
class _Where:
    """Builds error messages that point at one field of one row."""

    def __init__(self, file: str, row: int, sample_id: str | None) -> None:
        self.prefix = f"{file}: row {row}" + (f" (id {sample_id})" if sample_id else "")

    def error(self, field_path: str, problem: str) -> FinMCPFormatError:
        return FinMCPFormatError(f"{self.prefix}: field '{field_path}': {problem}")


def _decode_arguments(raw: Any, where: _Where, path: str) -> dict[str, Any]:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise where.error(path, f"arguments string is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise where.error(path, f"arguments must be a JSON object, got {type(raw).__name__}")
    return raw


def _calls_of(message: Mapping[str, Any], where: _Where, path: str) -> list[tuple[str | None, ToolCall]]:
    """(recorded id, call) pairs of an assistant message (``tool_calls`` or a legacy ``function_call``)."""
    raw_calls = message.get("tool_calls")
    if raw_calls in (None, "None", ""):
        raw_calls = [message["function_call"]] if isinstance(message.get("function_call"), dict) else []
    if not isinstance(raw_calls, list):
        raise where.error(f"{path}.tool_calls", f"must be a list, got {type(raw_calls).__name__}")
    out = []
    for k, entry in enumerate(raw_calls):
        here = f"{path}.tool_calls[{k}]"
        if not isinstance(entry, dict):
            raise where.error(here, "must be an object")
        fn = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise where.error(f"{here}.function.name", "missing or not a non-empty string")
        args_key = "arguments" if "arguments" in fn else "parameters"
        args = _decode_arguments(fn.get(args_key), where, f"{here}.function.{args_key}")
        call_id = entry.get("id") if isinstance(entry.get("id"), str) and entry.get("id") else None
        out.append((call_id, ToolCall(name, args, call_id or f"gold_{path[len('messages[') : -1]}_{k}")))
    return out


def decode_tool_content(content: Any) -> Any:
    """A recorded tool message's content as a JSON value: decoded when it is JSON text, else kept."""
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


@dataclass
class _TurnBuilder:
    user: str
    messages: list[Message] = field(default_factory=list)
    steps: list[tuple[ToolCall, ...]] = field(default_factory=list)
    answer: str = ""


def _assistant(
    message: Mapping[str, Any],
    where: _Where,
    path: str,
    turn: _TurnBuilder,
    pending: list[tuple[str | None, ToolCall, int]],
    turn_index: int,
) -> None:
    calls = _calls_of(message, where, path)
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    normalised: Message = {"role": "assistant", "content": content}
    if calls:
        normalised["tool_calls"] = [c.to_openai() for _, c in calls]
        turn.steps.append(tuple(c for _, c in calls))
        pending.extend((cid, c, turn_index) for cid, c in calls)
    elif content.strip():
        turn.answer = content
    turn.messages.append(normalised)


def _tool(
    message: Mapping[str, Any],
    where: _Where,
    path: str,
    turn: _TurnBuilder,
    pending: list[tuple[str | None, ToolCall, int]],
    recorded: list[RecordedCall],
) -> None:
    if not pending:
        raise where.error(path, "tool message without a preceding unanswered assistant tool call")
    call_id = message.get("tool_call_id")
    index = next((i for i, (cid, _, _) in enumerate(pending) if call_id and cid == call_id), 0)
    _, call, call_turn = pending.pop(index)
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    recorded.append(RecordedCall(call_turn, call, decode_tool_content(content)))
    turn.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text})


def _walk_messages(messages: Sequence[Any], where: _Where) -> tuple[str, list[_TurnBuilder], list[RecordedCall]]:
    """Split the gold conversation into (system text, per-user-turn builders, recorded calls)."""
    system, turns, recorded = "", [], []
    pending: list[tuple[str | None, ToolCall, int]] = []
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise where.error(path, f"must be an object with role in {sorted(_ROLES)}")
        role = message["role"]
        if role == "system":
            if turns:
                raise where.error(path, "a system message after the first user message is not supported")
            system = str(message.get("content") or "")
        elif role == "user":
            text = message.get("content")
            if not isinstance(text, str):
                raise where.error(f"{path}.content", "user content must be a string")
            if text.strip() in STOP_MARKERS:
                break
            turns.append(_TurnBuilder(text))
        elif not turns:
            raise where.error(path, f"{role} message before the first user message")
        elif role == "assistant":
            _assistant(message, where, path, turns[-1], pending, len(turns) - 1)
        else:
            _tool(message, where, path, turns[-1], pending, recorded)
    recorded.extend(RecordedCall(t, c, None, has_response=False) for _, c, t in pending)
    return system, turns, recorded


def _tool_names(raw: Mapping[str, Any], turns: Sequence[_TurnBuilder], where: _Where) -> tuple[str, ...]:
    names: list[str] = []
    key = next((k for k in _TOOL_LIST_KEYS if k in raw), None)
    listed = raw.get(key) if key else None
    if listed is not None and not isinstance(listed, list):
        raise where.error(key or "tool_list", f"must be a list, got {type(listed).__name__}")
    for entry in listed or []:
        for name in entry if isinstance(entry, list) else [entry]:
            if isinstance(name, str) and name not in names:
                names.append(name)
    for turn in turns:
        for step in turn.steps:
            names.extend(c.name for c in step if c.name not in names)
    return tuple(names)


def _task_type(raw: Mapping[str, Any]) -> str:
    text = str(raw.get("task") or "").strip().lower().replace(" ", "_").replace("-", "_")
    return text or "unknown"


def sample_from_raw(raw: Any, file: str, row: int) -> FinMCPSample:
    """One validated, normalised sample (raises ``FinMCPFormatError`` naming file/row/field)."""
    if not isinstance(raw, dict):
        raise FinMCPFormatError(f"{file}: row {row}: a sample must be a JSON object, got {type(raw).__name__}")
    sid = next((str(raw[k]) for k in _ID_KEYS if raw.get(k) not in (None, "")), None)
    where = _Where(file, row, sid)
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise where.error(
            "messages",
            "missing or empty; FinMCP-Bench samples carry the ground-truth "
            "conversation (user / assistant tool_calls / tool responses) under 'messages'",
        )
    system, turns, recorded = _walk_messages(messages, where)
    if not turns:
        raise where.error("messages", "no user message (before any ###STOP### marker)")
    tools = raw.get("tools") or ()
    if not isinstance(tools, (list, tuple)):
        raise where.error("tools", "per-sample tool schemas must be a list")
    scenario = str(raw.get("scenery") or raw.get("scenario") or "")
    diff = raw.get("diff_level") if isinstance(raw.get("diff_level"), dict) else {}
    return FinMCPSample(
        sample_id=sid or f"{Path(file).stem}-{row}",
        source=f"{file}:{row}",
        system_prompt=system,
        user_turns=tuple(t.user for t in turns),
        turn_messages=tuple(tuple(t.messages) for t in turns),
        gold_calls=tuple(tuple(t.steps) for t in turns),
        gold_answers=tuple(t.answer for t in turns),
        recorded=tuple(recorded),
        tool_names=_tool_names(raw, turns, where),
        tools=tuple(normalise_tool_schema(t, f"{where.prefix}: tools") for t in tools),
        scenario=scenario,
        category=str(raw.get("first-class") or scenario.split("-")[0].strip() or "unknown"),
        sub_category=str(raw.get("sub-class") or ""),
        task_type=_task_type(raw),
        difficulty=str(diff.get("level") or "unknown"),
        raw=raw,
    )


def load_samples(path: str | Path) -> list[FinMCPSample]:
    """Every sample of ``path`` (file or directory), validated; sample ids must be unique."""
    samples, seen = [], {}
    for file, row, raw in read_rows(path):
        sample = sample_from_raw(raw, file, row)
        if sample.sample_id in seen:
            raise FinMCPFormatError(
                f"{file}: row {row}: sample id {sample.sample_id!r} already used at {seen[sample.sample_id]} "
                "(benchmark_final.json is the union of the other three files: pass one file, not the folder)"
            )
        seen[sample.sample_id] = sample.source
        samples.append(sample)
    logger.info("loaded %d FinMCP-Bench samples from %s", len(samples), path)
    return samples


# ---- per-sample tool schemas -------------------------------------------------------------------------
def normalise_tool_schema(entry: Any, where: str) -> dict[str, Any]:
    """An OpenAI tool entry from an OpenAI entry, a bare function schema or an MCP tool description."""
    if not isinstance(entry, dict):
        raise FinMCPFormatError(f"{where}: a tool schema must be an object, got {type(entry).__name__}")
    fn = entry.get("function") if isinstance(entry.get("function"), dict) else entry
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise FinMCPFormatError(f"{where}: tool schema without a 'name': {json.dumps(entry)[:120]}")
    params = (
        fn.get("parameters") or fn.get("inputSchema") or fn.get("input_schema") or {"type": "object", "properties": {}}
    )
    return {
        "type": "function",
        "function": {"name": name, "description": str(fn.get("description") or ""), "parameters": params},
    }
