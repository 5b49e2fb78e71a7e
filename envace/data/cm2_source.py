"""CM2 as a data source: specs from the rows' recorded exchanges; no executor (``grpo`` needs the simulator)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envace.core.records import EpisodeSpec
from envace.data.source_registry import DataSource, register_data_source
from envace.data.specs import to_episode_spec


def cm2_spec(row: Mapping[str, Any]) -> EpisodeSpec:
    return to_episode_spec(dict(row))


def cm2_episodes(rows: Sequence[Mapping[str, Any]]) -> tuple[list[EpisodeSpec], None]:
    return [to_episode_spec(row) for row in rows], None


CM2_SOURCE = register_data_source(DataSource("cm2", episodes=cm2_episodes, spec_from_row=cm2_spec))
