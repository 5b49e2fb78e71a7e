"""Data sources as plug-ins: what the training stage and the engines need from one ``data.source``.

A ``DataSource`` turns prepared rows into episode specs and, when the source is executable, builds
real executors (``grpo`` with real responses). Sources register themselves in ``DATA_SOURCES`` when
their module is imported; ``envace.envs.data_sources`` imports the built-in ones (the tool world, CM2), so
callers look a source up by name and never import an environment package themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.env import Executor
from envace.core.records import EpisodeSpec
from envace.core.registry import Registry

ExecutorFactory = Callable[[EpisodeSpec], Executor]


@dataclass(frozen=True)
class DataSource:
    """One data source.

    episodes: prepared rows -> (episode specs, executor factory by spec, or None when not executable).
    spec_from_row: one prepared row -> its episode spec (the same rules as ``episodes``).
    executor_from_row: one prepared row -> a fresh real executor; None when the source has none.
    """

    name: str
    episodes: Callable[[Sequence[Mapping[str, Any]]], tuple[list[EpisodeSpec], ExecutorFactory | None]]
    spec_from_row: Callable[[Mapping[str, Any]], EpisodeSpec]
    executor_from_row: Callable[[Mapping[str, Any]], Executor] | None = None


DATA_SOURCES: Registry[DataSource] = Registry("data source")


def register_data_source(source: DataSource) -> DataSource:
    return DATA_SOURCES.register(source.name, source)
