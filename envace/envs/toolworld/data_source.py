"""The tool world as a data source: prepared CM2-format rows are rebuilt into tasks whose gold calls run
on a real executor (so recorded responses are real), and every task is executable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envace.core.records import EpisodeSpec
from envace.data.source_registry import DataSource, register_data_source
from envace.data.specs import episode_spec_from_task
from envace.envs.toolworld.cm2 import task_from_cm2_row
from envace.envs.toolworld.executor import ToolWorldExecutor


def toolworld_spec(row: Mapping[str, Any]) -> EpisodeSpec:
    task = task_from_cm2_row(dict(row))
    return episode_spec_from_task(task, ToolWorldExecutor(task))


def toolworld_executor(row: Mapping[str, Any]) -> ToolWorldExecutor:
    return ToolWorldExecutor(task_from_cm2_row(dict(row)))


def toolworld_episodes(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[list[EpisodeSpec], Callable[[EpisodeSpec], ToolWorldExecutor]]:
    tasks = {row["uuid"]: task_from_cm2_row(row) for row in rows}
    specs = [episode_spec_from_task(task, ToolWorldExecutor(task)) for task in tasks.values()]
    return specs, lambda spec: ToolWorldExecutor(tasks[spec.task_id])


TOOLWORLD_SOURCE = register_data_source(
    DataSource(
        "toolworld", episodes=toolworld_episodes, spec_from_row=toolworld_spec, executor_from_row=toolworld_executor
    )
)
