"""The environment variables that switch off every tool's telemetry (and hub access) in this stack."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

TELEMETRY_OFF: dict[str, str] = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "DVC_STUDIO_OFFLINE": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def telemetry_off(env: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Set the variables in ``env`` (default: this process's environment) unless already set."""
    target = os.environ if env is None else env
    for key, value in TELEMETRY_OFF.items():
        target.setdefault(key, value)
    return target
