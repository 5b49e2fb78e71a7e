"""The verl engine: envace's role-wise GRPO on verl 0.9.x (Ray, vLLM rollouts, FSDP actor), GPU only.

Importing this package is light (no verl, no Ray) and refuses a verl other than the pinned version
(``check_verl_version``: verl's metadata against the ``verl==`` pin in pyproject.toml). What lives where:

- ``advantages``: the role-wise estimator (envace.core.advantages) in verl's estimator signature, and
  its registration (``envace_rolewise``, ``envace_grpo``).
- ``plugin``: verl's plugin entry point; registers the estimators, the ``envace`` trainer mode and the
  ``envace_act_rehearse`` agent loop in every process that imports verl.
- ``agent_loop`` / ``episode``: the act/rehearse agent loop over verl's server manager.
- ``trainer``: verl's synchronous v1 trainer passing role ids etc. to the role-wise estimator.
- ``config_builder``: our config → ``verl.trainer.main_ppo`` overrides (and a Hydra compose check).
- ``launcher``: dataset preparation, the single-node command, Ray multi-node commands, MLflow wiring.
- ``attention_impl``: flash-attn for the actor when installed, else sdpa (logged), refused when flash is asked for.
- ``run_failure``: a spent judge budget in a worker stops the trainer within the step; a dying trainer's MLflow run
  ends FAILED.
- ``engine``: ``VerlEngine``, the ``Engine`` the ``train`` stage gets from ``get_engine("verl")``.
"""

from __future__ import annotations

import logging
import re
from importlib import metadata

logger = logging.getLogger(__name__)

_EXACT_PIN = re.compile(r"^verl(\[[^\]]*\])?==(?P<version>[\w.+!-]+)$")


class UnsupportedVerlVersion(ImportError):
    """The installed verl is not the version this engine is written against (the message says what to do)."""


def pinned_verl_version() -> str | None:
    """The verl version envace pins (``verl==X`` in its install metadata, i.e. pyproject.toml); None when envace's
    metadata is not installed (a source tree on ``PYTHONPATH``)."""
    try:
        requirements = metadata.requires("envace") or []
    except metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        match = _EXACT_PIN.match(requirement.replace(" ", ""))  # unconditional pins only (no "; extra == …")
        if match:
            return match["version"]
    return None


def installed_verl_version() -> str | None:
    """The installed verl's version (read from its metadata: verl itself is not imported); None without verl."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def check_verl_version(installed: str | None, pinned: str | None) -> None:
    """Raise ``UnsupportedVerlVersion`` when verl is installed at another version than the pin. The engine
    subclasses verl's trainer and agent loop and relies on internals (tests/unit/engines/test_verl_*.py pin them), so an
    upgrade must be a deliberate port, not a surprise in a GPU job."""
    if pinned is None:
        logger.debug("envace's install metadata has no verl pin; verl version not checked")
    if installed is None or pinned is None or installed == pinned:
        return
    raise UnsupportedVerlVersion(
        f"envace.engines.verl supports verl {pinned} (the pin verl=={pinned} in pyproject.toml and "
        f"requirements/cpu.in, locked in requirements/cpu.lock), but verl {installed} is installed. Install the "
        f"pinned version (pip install 'verl[verl-core]=={pinned}', or scripts/install.sh), or port the engine to "
        f"verl {installed}: move the pin, then run tests/unit/engines/test_verl_*.py, which pin the verl "
        "behaviours it uses"
    )


check_verl_version(installed_verl_version(), pinned_verl_version())
