"""The shape of a valid CM2 row as pydantic models; tool parameters checked with ``jsonschema``.

``row_problem(row, config)`` returns the first problem of a row as a ``Problem`` (field path, reason,
message; ``envace.data.cm2_reasons``) or None; ``check_row`` raises it as a ``ValueError``. A row is
checked in this order and the first problem found is the one reported:

1. the row is a JSON object of at most ``max_row_bytes`` (compact UTF-8 JSON);
2. ``Cm2Row``'s fields in declaration order, list items in order: ``uuid`` (a non-empty string),
   ``messages`` (``CM2Message``: role, tool calls, content, think tags), ``tools`` (``ToolSchema``; each
   ``parameters`` object must also pass ``Draft202012Validator.check_schema``), ``checklists`` (a list);
3. rules across fields (``Cm2Row``'s after-validator, run only when 2 found nothing): every call names a
   listed tool and, with ``check_call_arguments``, its arguments validate against that tool's parameters
   (``Draft202012Validator``); the role order; then the checklists (parsed by
   ``envace.core.checklist.Checklist``, one checklist turn per user message).

Compared with the hand-written checks this replaces, a row with one problem gets the same reason code;
with several, the one reported may differ (all of a message's checks run before the next message's). A
path may name the field one level deeper than before (``tools[0].type`` where it said ``tools[0]``).

Choices: call arguments are not checked against the tool's schema unless ``check_call_arguments`` is set
(CM2 keeps deliberately wrong calls whose recorded tool responses are errors); property schemas must be
JSON objects (Draft 2020-12 also allows ``true``/``false``; refused, as before); ``parameters: {}`` is the
empty schema and accepted; checklist ``dependence`` ids are not cross-checked.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from envace.core.checklist import Checklist, ChecklistFormatError, ChecklistWeightError
from envace.data.cm2_reasons import (
    Cm2ValidationConfig,
    Problem,
    RejectReason,
    StrictModel,
    config_of,
    fail,
    field_path,
    problem_of,
)

ROLES = frozenset({"system", "user", "assistant", "tool"})
JSON_SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
# no retrieval: jsonschema's default registry would fetch a remote "$ref" over the network
_OFFLINE: Registry = Registry()


# ---- tool schemas --------------------------------------------------------------------------------


class PropertySchema(StrictModel):
    type: Any = None

    @field_validator("type")
    @classmethod
    def _known_types(cls, value: Any) -> Any:
        types = value if isinstance(value, list) else [] if value is None else [value]
        if not all(isinstance(t, str) and t in JSON_SCHEMA_TYPES for t in types):
            raise fail(
                RejectReason.BAD_TOOL_SCHEMA,
                f"unknown type {value!r}; JSON schema types are {sorted(JSON_SCHEMA_TYPES)}",
            )
        return value


class ParametersSchema(StrictModel):
    """A tool's ``parameters``: an object schema whose ``required`` names declared properties, valid
    under the Draft 2020-12 meta-schema. ``raw`` is the schema as given (what arguments validate against)."""

    type: Literal["object"]
    properties: dict[str, PropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("required")
    @classmethod
    def _declared(cls, required: list[str], info: ValidationInfo) -> list[str]:
        properties = info.data.get("properties")
        undeclared = [r for r in required if properties is not None and r not in properties]
        if undeclared:
            raise fail(RejectReason.BAD_TOOL_SCHEMA, f"required lists undeclared properties {undeclared}")
        return required

    @model_validator(mode="wrap")
    @classmethod
    def _valid_json_schema(cls, data: Any, handler: Any) -> ParametersSchema:
        model = handler({"type": "object"} if data == {} else data)  # {} is the empty schema
        try:
            problem = _cached_schema_problem(json.dumps(data, sort_keys=True))
        except (TypeError, ValueError):  # keys that cannot be sorted: not worth caching
            problem = _schema_problem(data)
        if problem is not None:
            raise fail(RejectReason.BAD_TOOL_SCHEMA, problem[1], problem[0])
        model._raw = data
        return model

    @property
    def raw(self) -> dict[str, Any]:
        return self._raw


def _schema_problem(schema: Any) -> tuple[str, str] | None:
    """(path, message) of why a schema fails the Draft 2020-12 meta-schema, or None."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return field_path(list(exc.path)), f"not a valid JSON schema (Draft 2020-12): {exc.message}"
    except RecursionError:
        return "", "the schema is nested too deeply to check"
    return None


@functools.lru_cache(maxsize=4096)
def _cached_schema_problem(schema_json: str) -> tuple[str, str] | None:
    """``_schema_problem`` by canonical JSON: a check costs about a millisecond, and CM2 rows share tools."""
    return _schema_problem(json.loads(schema_json))


class FunctionSchema(StrictModel):
    name: Any = Field(None, validate_default=True)
    description: str = ""
    parameters: ParametersSchema = Field(default_factory=lambda: ParametersSchema.model_validate({}))

    @field_validator("name", mode="after")
    @classmethod
    def _name_pattern(cls, name: Any, info: ValidationInfo) -> str:
        pattern = config_of(info).tool_name_pattern
        if not isinstance(name, str) or not re.fullmatch(pattern, name):
            raise fail(RejectReason.BAD_TOOL_SCHEMA, f"tool name {name!r} does not match {pattern}")
        return name


class ToolSchema(StrictModel):
    """An OpenAI function tool ``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"]
    function: FunctionSchema


def _unique_tool_names(tools: list[ToolSchema]) -> list[ToolSchema]:
    names = [t.function.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise fail(RejectReason.BAD_TOOL_SCHEMA, f"tools declared twice: {duplicates}")
    return tools


# ---- messages and calls ----------------------------------------------------------------------------


class FunctionCall(StrictModel):
    name: str
    arguments: Any = Field("{}", validate_default=True)  # a JSON object or a string holding one; parsed

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, arguments: Any) -> dict[str, Any]:
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                raise fail(RejectReason.BAD_ARGUMENTS_JSON, "arguments are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise fail(RejectReason.BAD_ARGUMENTS_JSON, "arguments must be a JSON object")
        return arguments


class ToolCallRecord(StrictModel):
    type: Literal["function"] = "function"
    function: FunctionCall
    id: Any = None


class CM2Message(StrictModel):
    role: Any = Field(None, validate_default=True)
    tool_calls: list[ToolCallRecord] | None = None
    content: str | None = Field(None, validate_default=True)
    tool_call_id: Any = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: Any) -> str:
        if not (isinstance(role, str) and role in ROLES):
            raise fail(RejectReason.BAD_MESSAGE, f"role {role!r} is not one of {sorted(ROLES)}")
        return role

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _only_assistants_call(cls, calls: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if isinstance(calls, list) and calls and role is not None and role != "assistant":
            raise fail(RejectReason.BAD_MESSAGE, f"a {role} message cannot carry tool calls")
        return calls

    @field_validator("content")
    @classmethod
    def _content_rules(cls, content: str | None, info: ValidationInfo) -> str | None:
        role, calls = info.data.get("role"), info.data.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            raise fail(RejectReason.WRONG_TYPE, "content must be a string")
        if role == "user" and not content.strip():
            raise fail(RejectReason.BAD_MESSAGE, "a user message is empty")
        if role is not None:
            _check_think(role, content or "", config_of(info).require_think)
        return content


def _check_think(role: str, content: str, require_think: bool) -> None:
    """At most one <think>...</think> block, only in assistant messages, and only at the start."""
    opens, closes = content.count("<think>"), content.count("</think>")
    if role != "assistant":
        if opens or closes:
            raise fail(RejectReason.THINK_TAGS, f"a {role} message contains think tags")
        return
    if opens > 1 or opens != closes:
        raise fail(RejectReason.THINK_TAGS, f"{opens} <think> and {closes} </think> tags; expected one pair at most")
    if opens and (not content.lstrip().startswith("<think>") or content.index("<think>") > content.index("</think>")):
        raise fail(RejectReason.THINK_TAGS, "the <think> block must open the message")
    if require_think and not opens:
        raise fail(RejectReason.THINK_TAGS, "require_think is set but the message has no <think> block")


# ---- the row ---------------------------------------------------------------------------------------


class Cm2Row(StrictModel):
    """``{uuid, messages[], tools[], checklists[variant][user_turn][item]}`` and the rules across them."""

    uuid: str
    messages: list[CM2Message]
    tools: list[ToolSchema]
    checklists: list[Any]

    @field_validator("uuid")
    @classmethod
    def _non_empty_uuid(cls, uuid: str) -> str:
        if not uuid.strip():
            raise fail(RejectReason.MISSING_FIELD, "the uuid is empty")
        return uuid

    @field_validator("messages")
    @classmethod
    def _non_empty_conversation(cls, messages: list[CM2Message]) -> list[CM2Message]:
        if not messages:
            raise fail(RejectReason.BAD_MESSAGE, "the conversation is empty")
        return messages

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[ToolSchema]) -> list[ToolSchema]:
        return _unique_tool_names(tools)

    @model_validator(mode="after")
    def _rules_across_fields(self, info: ValidationInfo) -> Cm2Row:
        config = config_of(info)
        _check_calls(self.messages, self.tools, config.check_call_arguments)
        _check_role_order(self.messages)
        _check_checklists(self.checklists, sum(m.role == "user" for m in self.messages), config)
        return self


def _check_calls(messages: list[CM2Message], tools: list[ToolSchema], check_arguments: bool) -> None:
    """Every call names one of the row's tools; with ``check_arguments`` its arguments fit the tool's schema."""
    position = {tool.function.name: k for k, tool in enumerate(tools)}
    validators: dict[str, Draft202012Validator] = {}
    for k, msg in enumerate(messages):
        for c, call in enumerate(msg.tool_calls or []):
            where, name = f"messages[{k}].tool_calls[{c}].function", call.function.name
            if name not in position:
                raise fail(
                    RejectReason.UNKNOWN_TOOL, f"call to {name!r}, which is not among the row's tools", f"{where}.name"
                )
            if check_arguments:
                schema = tools[position[name]].function.parameters.raw
                validator = validators.setdefault(name, Draft202012Validator(schema, registry=_OFFLINE))
                _check_arguments(validator, call.function.arguments, f"{where}.arguments", position[name])


def _check_arguments(validator: Draft202012Validator, arguments: dict[str, Any], where: str, tool: int) -> None:
    try:
        error = best_match(validator.iter_errors(arguments))
    except (Unresolvable, RecursionError) as exc:
        problem = f"the schema cannot be applied to the call at {where}: {exc}"
        raise fail(RejectReason.BAD_TOOL_SCHEMA, problem, f"tools[{tool}].function.parameters") from None
    if error is not None:
        at = field_path(list(error.path))
        raise fail(
            RejectReason.ARGUMENTS_VIOLATE_SCHEMA,
            f"arguments do not fit the tool's parameters: {error.message}",
            f"{where}{'' if not at or at.startswith('[') else '.'}{at}",
        )


def _check_role_order(messages: list[CM2Message]) -> None:
    """[system] user assistant ..., each assistant call answered by one tool message, ending on a reply."""
    order, unpaired = RejectReason.BAD_ROLE_ORDER, RejectReason.UNPAIRED_TOOL_CALL
    first = 1 if messages[0].role == "system" else 0
    allowed, pending = {"user"}, 0
    for k in range(first, len(messages)):
        role = messages[k].role
        if pending:
            if role != "tool":
                raise fail(unpaired, f"{pending} tool call(s) still unanswered at a {role} message", f"messages[{k}]")
            pending -= 1
            continue
        if role == "tool":
            raise fail(unpaired, "a tool message that answers no tool call", f"messages[{k}]")
        if role not in allowed:
            raise fail(order, f"a {role} message where {sorted(allowed)} must come", f"messages[{k}]")
        calls = messages[k].tool_calls or []
        if role == "assistant" and calls:
            _check_answer_ids(messages, k, calls)
            pending, allowed = len(calls), {"assistant"}
        else:
            allowed = {"assistant"} if role == "user" else {"user"}
    if pending:
        raise fail(unpaired, f"the conversation ends with {pending} unanswered tool call(s)", "messages")
    if messages[-1].role != "assistant" or messages[-1].tool_calls:
        raise fail(order, "the conversation must end with an assistant reply", f"messages[{len(messages) - 1}]")


def _check_answer_ids(messages: list[CM2Message], k: int, calls: list[ToolCallRecord]) -> None:
    """Where both sides carry ids, the tool messages answer exactly the calls' ids."""
    call_ids = {c.id for c in calls if isinstance(c.id, str) and c.id}
    answers = messages[k + 1 : k + 1 + len(calls)]
    answer_ids = {m.tool_call_id for m in answers if isinstance(m.tool_call_id, str) and m.tool_call_id}
    if call_ids and answer_ids and answer_ids != call_ids:
        raise fail(
            RejectReason.UNPAIRED_TOOL_CALL,
            "tool_call_id values do not match the call ids",
            f"messages[{k}].tool_calls",
        )


def _check_checklists(raw: list[Any], n_user_turns: int, config: Cm2ValidationConfig) -> None:
    """Each variant parses as a ``Checklist`` (weights summing to 1 per turn) with one turn per user turn."""
    if not raw:
        raise fail(RejectReason.BAD_CHECKLIST, "no checklist variant", "checklists")
    for v, variant in enumerate(raw):
        where = f"checklists[{v}]"
        try:
            checklist = Checklist.from_raw(variant, where, weight_tolerance=config.weight_tolerance)
        except ChecklistWeightError as exc:
            raise fail(RejectReason.BAD_WEIGHTS, exc.problem, exc.field) from None
        except ChecklistFormatError as exc:
            raise fail(RejectReason.BAD_CHECKLIST, exc.problem, exc.field) from None
        if checklist.n_turns != n_user_turns:
            raise fail(
                RejectReason.CHECKLIST_TURN_MISMATCH,
                f"{checklist.n_turns} checklist turn(s) for {n_user_turns} user turn(s)",
                where,
            )


def _size_problem(row: dict[str, Any], config: Cm2ValidationConfig) -> Problem | None:
    try:
        n_bytes = len(json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except UnicodeEncodeError:
        return Problem("", RejectReason.NON_UTF8, "the row holds text that cannot be encoded as UTF-8")
    except (TypeError, ValueError, RecursionError) as exc:
        return Problem("", RejectReason.WRONG_TYPE, f"the row is not plain JSON: {str(exc)[:200]}")
    if n_bytes > config.max_row_bytes:
        return Problem(
            "", RejectReason.ROW_TOO_LARGE, f"row is {n_bytes} bytes, above max_row_bytes={config.max_row_bytes}"
        )
    return None


def row_problem(row: Any, config: Cm2ValidationConfig = Cm2ValidationConfig()) -> Problem | None:
    """The first problem of a raw row (in the order of the module docstring), or None when it is valid."""
    if isinstance(row, dict):
        problem = _size_problem(row, config)
        if problem is not None:
            return problem
    try:
        Cm2Row.model_validate(row, context={"config": config})
    except ValidationError as exc:
        return problem_of(exc.errors(include_url=False)[0])
    return None


def check_row(row: Any, config: Cm2ValidationConfig = Cm2ValidationConfig()) -> None:
    """Raise ``ValueError`` naming the field and reason of the first problem of ``row``."""
    problem = row_problem(row, config)
    if problem is not None:
        uuid = row.get("uuid") if isinstance(row, dict) else None
        name = f"CM2 row {uuid!r}" if isinstance(uuid, str) else "CM2 row"
        raise ValueError(f"{name}, field {problem.field or '(row)'}: {problem.reason.value}: {problem.message}")
