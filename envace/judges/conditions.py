"""Parser of plain CM2 pass conditions into machine-checkable rules (``ItemRule``).

Two shapes are understood, and only when the WHOLE condition has that shape:

* tool calls (item focused on ``assistant.tool_calls``), e.g.
  ``There exists an assistant tool call with name=get_x and arguments.city == "Paris".`` -
  an optional lead-in, clauses ``name=X`` / ``arguments.a.b == <JSON literal>`` (single-quoted
  strings too) joined by "and" or commas, an optional ``, and its tool response is not an error``
  (then the rule requires success), an optional period;
* reply text (item focused on ``assistant.content...``), e.g. ``The reply contains "Paris".``

Anything else - a negation, an "or", a comparison, a parenthetical remark, trailing prose - returns
None, and the item stays UNDECIDABLE for the rule judge: a wrong PASS/FAIL is worse than asking an LLM.
Parsed tool-call rules do not require success unless the condition says so (CM2's annotated sample
expects a call whose response was an error to pass).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from envace.core.checklist import FOCUS_TOOL_CALLS, ItemRule, RuleKind

_LEAD_IN = re.compile(
    r"(?:there\s+(?:exists|is)\s+(?:an|a|at\s+least\s+one)\s+(?:assistant\s+)?(?:tool|function)\s+call\s+"
    r"(?:with|where|whose|having|such\s+that)\s+"
    r"|the\s+assistant\s+(?:calls|called|invokes|invoked|makes|made)\s+(?:an?\s+)?(?:(?:tool|function)\s+call\s+)?"
    r"(?:with\s+)?"
    r"|(?:an?\s+)?(?:assistant\s+)?(?:tool|function)\s+call\s+(?:with|where|whose|having)\s+)?",
    re.IGNORECASE,
)
_NAME_CLAUSE = re.compile(
    r"(?:tool\s+|function\s+)?name\s*(?:==|=|is)\s*(?P<q>[\"'`]?)(?P<name>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?P=q)",
    re.IGNORECASE,
)
_ARG_CLAUSE = re.compile(
    r"arguments\.(?P<path>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*(?:==|=|equals|is)\s*"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'[^'\\]*'|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?!\w|\.\w)|true\b|false\b|null\b)"
)
_SUCCESS_SUFFIX = re.compile(r"\s*,?\s*and\s+(?:its|the)\s+(?:tool\s+)?response\s+is\s+not\s+an\s+error", re.IGNORECASE)
_SEPARATOR = re.compile(r"\s*,\s*and\s+|\s*,\s*|\s+and\s+", re.IGNORECASE)
_END = re.compile(r"\s*\.?\s*")
_CONTAINS = re.compile(
    r"(?:the\s+)?(?:final\s+)?(?:reply|answer|response)\s+(?:explicitly\s+)?(?:contains|includes|mentions)\s+"
    r"(?:the\s+(?:exact\s+)?(?:text|string|phrase|value)\s+)?\"(?P<text>[^\"]+)\"\s*\.?\s*",
    re.IGNORECASE,
)


def _literal(raw: str) -> tuple[bool, Any]:
    """(ok, value) of a literal matched by ``_ARG_CLAUSE``."""
    if raw.startswith("'"):
        return True, raw[1:-1]
    try:
        return True, json.loads(raw)
    except ValueError:
        return False, None


def _parse_tool_call_condition(text: str) -> ItemRule | None:
    lead_in = _LEAD_IN.match(text)
    pos = lead_in.end() if lead_in else 0
    name: str | None = None
    args: list[tuple[str, Any]] = []
    require_success = False
    while True:
        m_name, m_arg = _NAME_CLAUSE.match(text, pos), _ARG_CLAUSE.match(text, pos)
        if m_name and name is None:
            name, pos = m_name.group("name"), m_name.end()
        elif m_arg:
            ok, value = _literal(m_arg.group("value"))
            if not ok:
                return None
            args.append((m_arg.group("path"), value))
            pos = m_arg.end()
        else:
            return None
        success = _SUCCESS_SUFFIX.match(text, pos)
        if success and _END.fullmatch(text, success.end()):
            require_success = True
            break
        if _END.fullmatch(text, pos):
            break
        sep = _SEPARATOR.match(text, pos)
        if not sep:
            return None
        pos = sep.end()
    paths = [p for p, _ in args]
    if name is None or len(set(paths)) != len(paths):
        return None
    ordered = tuple(sorted(args, key=lambda pair: pair[0]))
    return ItemRule(RuleKind.TOOL_CALL, name, ordered, require_success=require_success)


@functools.lru_cache(maxsize=4096)
def parse_pass_condition(pass_condition: str, focus_on: str) -> ItemRule | None:
    """The rule a plain CM2 pass condition states, or None when it is not (fully) machine-checkable."""
    text = pass_condition.strip()
    if focus_on == FOCUS_TOOL_CALLS:
        return _parse_tool_call_condition(text)
    if focus_on.startswith("assistant.content"):
        m = _CONTAINS.fullmatch(text)
        if m:
            return ItemRule(RuleKind.ANSWER_CONTAINS, values=(m.group("text"),))
    return None
