"""The built-in data sources, registered on import: the tool world and CM2 (``envace.data.source_registry``).

Import this module (not an environment package) to look a data source up by name with ``data_source``.
"""

from __future__ import annotations

from envace.data.cm2_source import CM2_SOURCE
from envace.data.source_registry import DATA_SOURCES, DataSource
from envace.envs.toolworld.data_source import TOOLWORLD_SOURCE

BUILTIN_SOURCES = (TOOLWORLD_SOURCE, CM2_SOURCE)


def data_source(name: str) -> DataSource:
    """The data source registered as ``name``; unknown names raise listing the known ones."""
    return DATA_SOURCES.get(name)


__all__ = ["BUILTIN_SOURCES", "DATA_SOURCES", "DataSource", "data_source"]
