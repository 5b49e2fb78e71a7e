"""The embedded tool world: a small, deterministic, executable tool-use benchmark of our own design.

Five stateful domains (bank, calendar, shop, files, todo) with 26 tools, each an OpenAI function
schema; invalid calls return structured errors ``{"error": {"code", "message"}}`` and never raise.
A seeded generator builds short multi-turn tasks (1–3 user turns, mostly 1–2 steps a turn, with
parallel calls and id dependencies), their gold calls, answers, expected final states and CM2
checklists, split into train / val / test with a held-out domain and held-out tool compositions.

Entry points:
- ``ToolWorldEnv`` (``Environment``, name ``toolworld``), ``ToolWorldExecutor`` (``Executor``);
- ``generate_tasks(config=None, **overrides)``, ``ToolWorldConfig``, ``split_overlaps`` (val/test vs train);
- ``score`` / ``score_breakdown`` (verifiable scorer), ``run_oracle`` (gold replay);
- ``to_cm2_row`` / ``task_from_cm2_row`` (raw CM2 rows for the data stage);
- ``evaluate_checklists`` / ``checklist_score`` (rule-checking the CM2 items);
- ``describe_domains`` / ``split_stats`` / ``stats_markdown`` (reports).
"""

from envace.envs.toolworld.checklist import (
    TurnTranscript,
    checklist_score,
    evaluate_checklists,
    transcripts_from_turns,
)
from envace.envs.toolworld.cm2 import gold_messages, task_from_cm2_row, to_cm2_row
from envace.envs.toolworld.env import ToolWorldEnv
from envace.envs.toolworld.executor import ToolWorldExecutor
from envace.envs.toolworld.generator import SPLITS, ToolWorldConfig, generate_tasks, split_overlaps
from envace.envs.toolworld.oracle import oracle_transcript, run_oracle
from envace.envs.toolworld.registry import DOMAINS, TOOLS, get_domain, get_tool
from envace.envs.toolworld.schema import ToolError, error_response, is_error
from envace.envs.toolworld.scoring import (
    ScoreBreakdown,
    mentions,
    score,
    score_breakdown,
)
from envace.envs.toolworld.stats import describe_domains, split_stats, stats_markdown

__all__ = [
    "DOMAINS",
    "SPLITS",
    "TOOLS",
    "ScoreBreakdown",
    "ToolError",
    "ToolWorldConfig",
    "ToolWorldEnv",
    "ToolWorldExecutor",
    "TurnTranscript",
    "checklist_score",
    "describe_domains",
    "error_response",
    "evaluate_checklists",
    "generate_tasks",
    "get_domain",
    "get_tool",
    "gold_messages",
    "is_error",
    "mentions",
    "oracle_transcript",
    "run_oracle",
    "score",
    "score_breakdown",
    "split_overlaps",
    "split_stats",
    "stats_markdown",
    "task_from_cm2_row",
    "to_cm2_row",
    "transcripts_from_turns",
]
