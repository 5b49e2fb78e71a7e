"""The embedded tool world as a benchmark: ``EnvironmentAdapter`` over ``ToolWorldEnv``.

Subsets are the tool world's splits (``train``, ``val``, ``test``); the held-out domain's tasks carry
``task.meta['held_out']`` and are reported as ``transfer`` by ``evaluation.metrics``. Scores come from
the tool world's own verifiable scorer (final state + key values in the replies); success = score 1.
"""

from __future__ import annotations

from typing import Any

from envace.core.env import Environment
from envace.envs.toolworld.env import ToolWorldEnv
from envace.evaluation.base import EnvironmentAdapter
from envace.evaluation.episode import ActLoopConfig


class ToolWorldAdapter(EnvironmentAdapter):
    """``get_benchmark("toolworld", config=ActLoopConfig(...), env=None, **env_kwargs)``."""

    def __init__(self, config: ActLoopConfig | None = None, env: Environment | None = None, **env_kwargs: Any) -> None:
        if env is None:
            env = ToolWorldEnv(**env_kwargs)
        elif env_kwargs:
            raise ValueError(f"ToolWorldAdapter: env given, so {sorted(env_kwargs)} cannot configure it")
        super().__init__(env, config, name="toolworld")
