"""Lazy, cached access to the pieces of ``bfcl-eval`` this package uses.

Importing ``bfcl_eval`` has side effects and costs that we control here:

* ``bfcl_eval.constants.eval_config`` creates ``result/``, ``score/`` and ``.file_locks/`` under
  ``BFCL_PROJECT_ROOT`` at import time (by default *inside site-packages*). Before the first import we
  point it at ``$ENVACE_CACHE/bfcl`` (default ``~/.cache/envace/bfcl``) unless the variable is set.
* bfcl's checkers import ``bfcl_eval.constants.model_config``, which imports every model handler
  (openai, anthropic, qwen-agent …): 5–15 s on the development machines, for one dictionary the checkers
  read only to ask whether a model writes dots in function names as underscores. While importing the
  checkers we stand in a tiny module for it whose mapping holds our own model (dots kept) and falls back
  to bfcl's real registry — imported on first use — for any other name. The stand-in is removed from
  ``sys.modules`` right after, so later imports of ``model_config`` get the real module. When the real
  module is already loaded, our model is simply added to it.

Nothing here is imported when ``envace.envs.bfcl`` is; the first loading or scoring call pays ~1.5 s.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CHECKER_MODEL = "envace-hermes-FC"  # our model name in bfcl's registry (no "_" or "/": also a dir name)
_MODEL_CONFIG = "bfcl_eval.constants.model_config"


def project_root() -> Path:
    """Where bfcl keeps its result/score folders; set ``BFCL_PROJECT_ROOT`` before bfcl is imported."""
    default = Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace")) / "bfcl"
    root = Path(os.environ.setdefault("BFCL_PROJECT_ROOT", str(default)))
    root.mkdir(parents=True, exist_ok=True)
    return root


class _RegistryWithFallback(dict):
    """Our model config, plus every model of bfcl's real registry on demand."""

    def __missing__(self, key: str) -> Any:
        return importlib.import_module(_MODEL_CONFIG).MODEL_CONFIG_MAPPING[key]


def _import_checkers() -> dict[str, Any]:
    """Import bfcl's checker modules, standing in for its model registry when it is not loaded yet."""
    names = {
        "ast": "bfcl_eval.eval_checker.ast_eval.ast_checker",
        "helper": "bfcl_eval.eval_checker.eval_runner_helper",
        "multi_turn": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
        "agentic": "bfcl_eval.eval_checker.agentic_eval.agentic_checker",
    }
    if _MODEL_CONFIG in sys.modules:
        real = sys.modules[_MODEL_CONFIG]
        if CHECKER_MODEL not in real.MODEL_CONFIG_MAPPING:
            # lazy: bfcl-eval loads on first use (see the module docstring)
            from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler

            real.MODEL_CONFIG_MAPPING[CHECKER_MODEL] = real.ModelConfig(
                model_name=CHECKER_MODEL,
                display_name="envace (FC, Hermes tool calls)",
                url="",
                org="envace",
                license="Apache-2.0",
                model_handler=QwenFCHandler,
                is_fc_model=True,
                underscore_to_dot=False,
            )
        return {k: importlib.import_module(v) for k, v in names.items()}
    # lazy: bfcl-eval loads on first use (see the module docstring)
    from bfcl_eval import constants

    stand_in = types.ModuleType(_MODEL_CONFIG)
    stand_in.MODEL_CONFIG_MAPPING = _RegistryWithFallback(
        {CHECKER_MODEL: SimpleNamespace(model_name=CHECKER_MODEL, underscore_to_dot=False, is_fc_model=True)}
    )
    sys.modules[_MODEL_CONFIG] = stand_in
    try:
        return {k: importlib.import_module(v) for k, v in names.items()}
    finally:
        sys.modules.pop(_MODEL_CONFIG, None)
        if getattr(constants, "model_config", None) is stand_in:
            delattr(constants, "model_config")


@functools.cache
def bfcl() -> SimpleNamespace:
    """The bfcl-eval functions and constants used by ``envace.envs.bfcl`` (imported once)."""
    project_root()
    try:
        checkers = _import_checkers()
        # lazy: bfcl-eval loads on first use (see the module docstring)
        from bfcl_eval import utils
        from bfcl_eval.constants import (
            default_prompts,
            enums,
            executable_backend_config,
            type_mappings,
        )
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.model_handler import utils as handler_utils
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"envace.envs.bfcl needs the PyPI package bfcl-eval ({exc}); install it with "
            "`pip install --no-deps bfcl-eval` as scripts/install.sh does"
        ) from exc
    return SimpleNamespace(
        utils=utils,
        prompts=default_prompts,
        enums=enums,
        backends=executable_backend_config,
        types=type_mappings,
        helper=checkers["helper"],
        ast_checker=checkers["ast"].ast_checker,
        multi_turn_checker=checkers["multi_turn"].multi_turn_checker,
        agentic_checker=checkers["agentic"].agentic_checker,
        multi_turn_utils=multi_turn_utils,
        handler_utils=handler_utils,
    )
