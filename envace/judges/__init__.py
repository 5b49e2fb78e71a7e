"""Checklist judges (rule, LLM, composite) selected by name: ``get_judge("composite", **settings)``;
``checklist_reward_fn(judge)`` makes one an engine reward function."""

from envace.judges import composite, llm, rule  # noqa: F401  (register the judges)
from envace.judges.base import ChecklistJudge, JudgeReport, evaluate_checklist, get_judge, judge_names
from envace.judges.reward import checklist_reward_fn, trajectory_messages

__all__ = [
    "ChecklistJudge",
    "JudgeReport",
    "checklist_reward_fn",
    "evaluate_checklist",
    "get_judge",
    "judge_names",
    "trajectory_messages",
]
