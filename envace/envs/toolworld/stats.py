"""Descriptive helpers for reports: the domains and their tools, and counts over generated splits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from envace.core.env import Task
from envace.envs.toolworld.registry import DOMAINS


def describe_domains() -> dict[str, dict[str, Any]]:
    """Per domain: description, tool names, tool count and scenario names."""
    return {
        name: {
            "description": d.description,
            "tools": list(d.tool_names),
            "n_tools": len(d.tools),
            "scenarios": [s.name for s in d.scenarios],
        }
        for name, d in DOMAINS.items()
    }


def _split_stats(tasks: Sequence[Task]) -> dict[str, Any]:
    steps = [step for t in tasks for turn in t.gold_calls for step in turn]
    return {
        "n_tasks": len(tasks),
        "by_domain": dict(sorted(Counter(t.domain for t in tasks).items())),
        "by_held_out": dict(sorted(Counter(str(t.meta.get("held_out")) for t in tasks).items())),
        "by_composition": dict(sorted(Counter(t.meta["composition"] for t in tasks).items())),
        "by_user_turns": dict(sorted(Counter(len(t.user_turns) for t in tasks).items())),
        "n_calls": sum(len(step) for step in steps),
        "n_steps": len(steps),
        "n_parallel_steps": sum(1 for step in steps if len(step) > 1),
        "n_dependent_calls": sum(len(t.meta.get("bindings", {})) for t in tasks),
        "n_error_calls": sum(len(t.meta.get("expected_errors", {})) for t in tasks),
    }


def split_stats(tasks_by_split: Mapping[str, Sequence[Task]]) -> dict[str, dict[str, Any]]:
    """Counts per split: tasks per domain / hold-out category / composition / turn count, and steps."""
    return {split: _split_stats(tasks) for split, tasks in tasks_by_split.items()}


def stats_markdown(tasks_by_split: Mapping[str, Sequence[Task]]) -> str:
    """A compact markdown table (split × domain, plus hold-out and structure counts)."""
    stats = split_stats(tasks_by_split)
    domains = list(DOMAINS)
    header = (
        "| split | " + " | ".join(domains) + " | held-out comp. | held-out domain | parallel steps | dependent calls |"
    )
    lines = [header, "|" + "---|" * (len(domains) + 5)]
    for split, s in stats.items():
        cells = [str(s["by_domain"].get(d, 0)) for d in domains]
        cells += [
            str(s["by_held_out"].get("composition", 0)),
            str(s["by_held_out"].get("domain", 0)),
            str(s["n_parallel_steps"]),
            str(s["n_dependent_calls"]),
        ]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
