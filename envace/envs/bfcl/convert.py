"""Conversions between envace records and BFCL's formats.

* tools: BFCL function docs → OpenAI tool entries (bfcl's own ``convert_to_tool`` with a style that
  keeps dots in names, so a call can use the documented name and the checkers need no renaming);
* calls: ``ToolCall`` → BFCL's decoded AST form ``[{name: {arg: value}}]`` (what ``decode_ast`` returns)
  and → executable strings ``name(arg=repr(value),…)`` (bfcl's own ``convert_to_function_call``, what
  ``decode_execute`` returns);
* gold: multi-turn ground-truth strings → ``ToolCall`` (positional arguments named from the backend
  method's signature); single-turn possible answers → one concrete call (first allowed value of each
  parameter, an optional parameter whose first allowed value is ``""`` is left out);
* responses: BFCL's execution strings → JSON values (``decode_response``) for records and fidelity; the
  ACT prompt always gets BFCL's exact string.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
from collections.abc import Iterable, Sequence
from typing import Any

from envace.core.records import ToolCall
from envace.core.wire import ToolCallParse, render_tool_calls
from envace.envs.bfcl.upstream import bfcl

EXECUTION_ERROR_PREFIX = "Error during execution: "


def openai_tools(functions: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """OpenAI ``{"type": "function", "function": …}`` entries for BFCL function docs (input untouched)."""
    b = bfcl()
    style = b.enums.ModelStyle.FIREWORK_AI  # casts BFCL types to JSON-schema types, keeps dotted names
    return tuple(b.handler_utils.convert_to_tool(copy.deepcopy(list(functions)), b.types.GORILLA_TO_OPENAPI, style))


def ast_form(calls: Iterable[ToolCall]) -> list[dict[str, dict[str, Any]]]:
    """BFCL's decoded AST form of calls: ``[{name: {argument: value}}]``."""
    return [{call.name: dict(call.arguments)} for call in calls]


def execution_strings(calls: Iterable[ToolCall]) -> list[str]:
    """The strings BFCL executes for these calls (``name(a=1,b='x')``)."""
    return list(bfcl().handler_utils.convert_to_function_call(ast_form(calls)))


def canonical_text(parse: ToolCallParse) -> str:
    """What we write as the model output in BFCL result files: the parsed calls re-rendered in the
    Hermes format after the visible text. bfcl's Hermes decoder reads back exactly ``parse.calls``."""
    return render_tool_calls(parse.calls, parse.content)


@functools.cache
def _method_parameters(method_name: str, class_names: tuple[str, ...]) -> tuple[str, ...]:
    """Parameter names of a backend method (for positional arguments of gold calls)."""
    mapping = bfcl().backends.CLASS_FILE_PATH_MAPPING
    for class_name in class_names:
        cls = getattr(importlib.import_module(mapping[class_name]), class_name)
        method = getattr(cls, method_name, None)
        if method is not None:
            return tuple(p for p in inspect.signature(method).parameters if p != "self")
    raise KeyError(f"gold call {method_name!r} is a method of none of {list(class_names)}")


def parse_execution_string(text: str, involved_classes: Sequence[str]) -> ToolCall:
    """A BFCL ground-truth call string (``cd(folder='x')``, ``sort('a.txt')``) as a ``ToolCall``."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"BFCL gold call {text!r} is not a plain function call")  # noqa: TRY004 - bad data
    arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    if node.args:
        names = _method_parameters(node.func.id, tuple(involved_classes))
        for name, value in zip(names, node.args):
            arguments[name] = ast.literal_eval(value)
    return ToolCall(node.func.id, arguments)


def _first_allowed(allowed: Any, required: bool) -> tuple[bool, Any]:
    """(present?, value) for one parameter of a possible answer (a list of allowed values; ``""`` = may be
    omitted). Optional parameters that may be omitted are omitted; required ones take the first real value."""
    if not isinstance(allowed, list) or not allowed:
        return True, allowed
    real = [v for v in allowed if v != ""]
    if not real or ("" in allowed and not required):
        return False, None
    return True, _concrete(real[0])


def _concrete(value: Any) -> Any:
    """Nested possible answers are dicts of allowed-value lists; pick from each."""
    if isinstance(value, dict):
        out = {}
        for key, allowed in value.items():
            present, chosen = _first_allowed(allowed, required=True)
            if present:
                out[key] = chosen
        return out
    if isinstance(value, list):
        return [_concrete(v) for v in value]
    return value


_JAVA_ELEMENT = {
    "String": "String",
    "integer": "int",
    "int": "int",
    "long": "long",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
    "char": "char",
    "byte": "byte",
    "short": "short",
}


def _java_literal(value: Any, kind: str, nested: str | None = None) -> str:
    """Java source text that bfcl's java_type_converter reads back as ``value``."""
    if isinstance(value, str) and kind not in ("Array", "ArrayList", "HashMap"):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "long":
        return f"{value}L"
    if kind == "float":
        return f"{value}f"
    if kind in ("Array", "ArrayList") and isinstance(value, list):
        if kind == "Array":  # elements are converted with the nested type, unquoted
            body = ", ".join(_java_literal(v, nested or "String") for v in value)
            return f"new {_JAVA_ELEMENT.get(nested or 'String', 'Object')}[]{{{body}}}"
        quoted = [
            f'"{v}"' if nested in ("String", None) and isinstance(v, str) else _java_literal(v, nested or "")
            for v in value
        ]
        return f"new ArrayList<>(Arrays.asList({', '.join(quoted)}))"
    if kind == "HashMap" and isinstance(value, dict):
        puts = " ".join(
            f'put("{k}", {json.dumps(v) if isinstance(v, str) else _java_literal(v, "")});' for k, v in value.items()
        )
        return f"new HashMap<>() {{{{ {puts} }}}}"
    return str(value)


def _js_literal(value: Any, kind: str) -> str:
    """JavaScript source text that bfcl's js_type_converter reads back as ``value``."""
    if isinstance(value, str) and kind not in ("array", "dict"):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "Bigint":
        return f"{value}n"
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) if isinstance(v, str) else _js_literal(v, "") for v in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{k}: {json.dumps(v) if isinstance(v, str) else _js_literal(v, '')}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    return str(value)


def _as_source(value: Any, language: str, schema: dict[str, Any]) -> Any:
    """Java/JavaScript parameters are passed as source text; Python ones as JSON values."""
    kind = str(schema.get("type", ""))
    nested = (schema.get("items") or {}).get("type")
    if language == "java":
        return _java_literal(value, kind, nested)
    if language == "javascript":
        return _js_literal(value, kind)
    return value


def oracle_calls(
    possible_answer: Sequence[dict[str, dict[str, list[Any]]]],
    functions: Sequence[dict[str, Any]],
    language: str = "python",
) -> tuple[ToolCall, ...]:
    """One concrete call per function of a single-turn possible answer (``functions``: the un-hinted docs)."""
    docs = {f["name"]: f.get("parameters", {}) for f in functions}
    calls = []
    for item in possible_answer:
        for name, params in item.items():
            doc = docs.get(name, {})
            required = set(doc.get("required", ()))
            properties = doc.get("properties", {})
            arguments = {}
            for param, allowed in params.items():
                present, value = _first_allowed(allowed, param in required)
                if present:
                    arguments[param] = _as_source(value, language, properties.get(param, {}))
            calls.append(ToolCall(name, arguments))
    return tuple(calls)


def decode_response(text: str) -> Any:
    """A BFCL execution result as a JSON value: decoded JSON objects/arrays as-is, execution errors as
    ``{"error": message}``, anything else as the string itself."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, (dict, list)):
        return value
    if text.startswith(EXECUTION_ERROR_PREFIX):
        return {"error": text[len(EXECUTION_ERROR_PREFIX) :]}
    return text


def encode_response(value: Any) -> str:
    """Tool-message text for a JSON value from an executor without ``execute_text``: strings as-is,
    anything else as JSON. (Lossy only for execution errors, which BFCL shows as plain text.)"""
    return value if isinstance(value, str) else json.dumps(value)
