"""FinMCP-Bench tool schemas: read the MCP schema file, or infer minimal schemas from recorded calls.

Tool schemas are not in the samples: the authors pass one global MCP schema file (``MCP_SCHEMA_PATH``, the
server's tool list) to every request. ``load_tool_schemas`` reads such a file (OpenAI tool entries, bare
function schemas, or MCP ``{name, description, inputSchema}`` entries; a list, a ``{"tools": …}`` wrapper
or a name → schema map). Without one, ``infer_tool_schemas`` derives minimal schemas from the recorded
arguments (names and JSON types only) and says so in each description.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from envace.envs.finmcp.data import FinMCPFormatError, FinMCPSample, normalise_tool_schema


def load_tool_schemas(path: str | Path) -> list[dict[str, Any]]:
    """Tool schemas of an MCP schema file (list, ``{"tools": [...]}`` or ``{name: schema}``)."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FinMCPFormatError(f"{file}: cannot read the MCP tool schema file ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    elif isinstance(data, dict):
        data = [{"name": k, **v} if isinstance(v, dict) else v for k, v in data.items()]
    if not isinstance(data, list):
        raise FinMCPFormatError(f"{file}: expected a list of tool schemas, got {type(data).__name__}")
    return [normalise_tool_schema(t, f"{file}: tools[{i}]") for i, t in enumerate(data)]


_JSON_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: Any) -> str | None:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), None)


def infer_tool_schemas(samples: Iterable[FinMCPSample], names: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Minimal schemas from recorded calls: argument names and JSON types; required = always present."""
    seen: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for sample in samples:
        for name in sample.tool_names:
            seen.setdefault(name, [])
        for rec in sample.recorded:
            seen.setdefault(rec.call.name, []).append(rec.call.arguments)
    out = []
    for name, calls in seen.items():
        props: dict[str, dict[str, Any]] = {}
        for args in calls:
            for key, value in args.items():
                kind = _json_type(value)
                if key not in props and kind:
                    props[key] = {"type": kind}
        required = sorted(k for k in props if calls and all(k in a for a in calls))
        description = (
            f"Financial MCP tool '{name}' (schema inferred from recorded calls; pass the server's "
            "tool schema file for the real descriptions)"
        )
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {"type": "object", "properties": props, "required": required},
                },
            }
        )
    return out
