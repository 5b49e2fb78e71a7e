"""Which attention the verl actor and reference model load with: flash-attn when installed, else PyTorch's sdpa.

verl 0.9.1 builds the actor's and the reference model's HF config from ``actor_rollout_ref.model`` and reads the
attention implementation from ``override_config.attn_implementation``, defaulting to ``flash_attention_2``
(``verl/workers/config/model.py``: ``HFModelConfig.__post_init__``). Without the ``flash_attn`` package that
default fails when the FSDP workers load the model, after Ray and vLLM are up. vLLM (the rollout) picks its own
attention backend and does not need the package.

``attention_overrides`` decides before launch, on the launching machine:

- nothing set by the user, flash-attn installed: no override (verl's default, with padding removal);
- nothing set by the user, flash-attn missing: ``sdpa`` for the actor and the reference model, and no padding
  removal (``use_remove_padding=false``: verl's padded-token removal is written for flash-attn's variable-length
  kernels) unless the user set it; logged as a warning with the install line;
- flash attention asked for explicitly (an override of the key to ``flash_attention_2`` / ``_3``) while flash-attn
  is missing: refused (``VerlConfigError``) with the install line;
- any other explicit value: the user's choice, untouched.

Multi-node: the check runs where the launcher runs; install flash-attn on every node or on none.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence

from envace.engines.verl.config_builder import VerlConfigError

logger = logging.getLogger(__name__)

ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
REMOVE_PADDING_KEY = "actor_rollout_ref.model.use_remove_padding"
FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
FALLBACK = "sdpa"
INSTALL_LINE = "pip install flash-attn --no-build-isolation"


def flash_attn_installed() -> bool:
    """Whether the ``flash_attn`` package is importable here (found, not imported: importing it loads CUDA)."""
    return importlib.util.find_spec("flash_attn") is not None


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value the last of ``overrides`` gives ``key`` (``key=v``, ``+key=v`` or ``++key=v``; quotes removed);
    None when no override sets it."""
    value = None
    for override in overrides:
        name, sep, raw = str(override).lstrip("+").partition("=")
        if sep and name.strip() == key:
            value = raw.strip().strip("'\"")
    return value


def attention_overrides(user_overrides: Sequence[str], *, flash_installed: bool | None = None) -> list[str]:
    """Overrides to append so the actor's attention loads on this machine (module docstring); ``user_overrides``
    are the ones the user gave (``engine.overrides`` and the launcher's extra arguments). Raises
    ``VerlConfigError`` when flash attention is asked for explicitly and flash-attn is not installed."""
    installed = flash_attn_installed() if flash_installed is None else flash_installed
    asked = override_value(user_overrides, ATTN_KEY)
    if asked in FLASH_IMPLEMENTATIONS and not installed:
        raise VerlConfigError(
            f"{ATTN_KEY}={asked} but the flash_attn package is not installed where the launcher runs. Install it "
            f"on every node ({INSTALL_LINE}; a build matching the installed torch), or drop the override: without "
            f"flash-attn the launcher trains with {FALLBACK} attention"
        )
    if asked is not None or installed:
        return []
    extra = [f"+{ATTN_KEY}={FALLBACK}"]
    if override_value(user_overrides, REMOVE_PADDING_KEY) is None:
        extra.append(f"{REMOVE_PADDING_KEY}=false")
    logger.warning(
        "flash_attn is not installed: the verl actor and reference model use %s attention without padding removal "
        "(%s). For flash attention: %s",
        FALLBACK,
        " ".join(extra),
        INSTALL_LINE,
    )
    return extra
