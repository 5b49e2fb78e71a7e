"""VitaBench (MIT; github.com/meituan-longcat/vitabench): tasks from a user checkout, a reimplemented
environment (general / delivery / in-store tools), a simulated user and a rubric judge over endpoints."""

from envace.envs.vitabench.adapter import NEEDS_ENDPOINTS, VitaBenchAdapter, vita_task_of, vitabench_report
from envace.envs.vitabench.data import VitaFormatError, VitaTask, find_task_files, load_tasks
from envace.envs.vitabench.environment import VitaExecutor
from envace.envs.vitabench.judge import (
    JudgeFailed,
    MalformedJudgement,
    RubricJudge,
    RubricJudgeConfig,
    parse_window_states,
    render_transcript,
    sliding_windows,
)
from envace.envs.vitabench.schemas import TOOL_SPECS, tool_schemas

__all__ = [
    "NEEDS_ENDPOINTS",
    "TOOL_SPECS",
    "JudgeFailed",
    "MalformedJudgement",
    "RubricJudge",
    "RubricJudgeConfig",
    "VitaBenchAdapter",
    "VitaExecutor",
    "VitaFormatError",
    "VitaTask",
    "find_task_files",
    "load_tasks",
    "parse_window_states",
    "render_transcript",
    "sliding_windows",
    "tool_schemas",
    "vita_task_of",
    "vitabench_report",
]
