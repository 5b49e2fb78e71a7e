"""verl plugin entry point: importing this module registers everything envace adds to verl.

``pyproject.toml`` declares ``[project.entry-points."verl.plugins"] envace = "envace.engines.verl.plugin"``;
``import verl`` loads every entry point of that group (``ep.load()`` imports the module), so every
process that imports verl — the driver, the TaskRunner, every agent-loop worker and trainer worker
Ray starts — registers, at import time:

1. the advantage estimators ``envace_rolewise`` and ``envace_grpo`` (``register_with_verl``),
2. the trainer mode ``envace`` (``EnvacePPOTrainer``, role ids into the estimator),
3. the agent loop ``envace_act_rehearse`` (``ActRehearseAgentLoop``).

Re-importing or calling ``register_all()`` again is harmless (idempotent). verl swallows plugin
exceptions at DEBUG level, so a failure is logged here as an ERROR naming the registration and the
cause; the launcher also lists this module in ``VERL_USE_EXTERNAL_MODULES`` for the Ray workers, where
an import failure is loud instead of silent.
"""

from __future__ import annotations

import importlib
import logging

from envace.engines.verl.advantages import register_with_verl

logger = logging.getLogger(__name__)

_MODULES = {
    "trainer mode 'envace'": "envace.engines.verl.trainer",
    "agent loop 'envace_act_rehearse'": "envace.engines.verl.agent_loop",
}


def register_all() -> dict[str, str]:
    """Register the estimators, the trainer mode and the agent loop; returns {what: module or 'ok'}.

    Raises the first registration error after logging it (so verl's swallowed-plugin path still leaves
    an ERROR line in the worker log).
    """
    done: dict[str, str] = {}
    try:
        done.update({f"estimator '{name}'": "ok" for name in register_with_verl()})
        for what, module in _MODULES.items():
            importlib.import_module(module)  # the modules register with verl's decorators on import
            done[what] = module
    except Exception:
        logger.exception("envace verl plugin: registration failed after %s", sorted(done) or "nothing")
        raise
    logger.debug("envace verl plugin registered: %s", sorted(done))
    return done


REGISTERED = register_all()
