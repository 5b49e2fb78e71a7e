"""Which config keys an MLflow run logs as params, so that the runs table stays comparable.

- A **pipeline run** logs the composed config once: all of it as the artifact ``config/params.yaml``
  (``CONFIG_ARTIFACT``) and, as params, the few keys runs are filtered and grouped by (``RUN_KEYS``:
  profile, experiment_name, algo.name, model.name, engine.name, seed, data.source). Its name says the
  same at a glance: ``cpu/envace/seed0/2026-12-06T02:00`` (``pipeline_run_name``).
- A **stage run** logs the keys its DVC stage declares under ``params:`` in its ``dvc.yaml``
  (``declared_params``): a declared group (``model``) stands for every key under it, a ``foreach`` or
  ``matrix`` stage declares once for all its items, and keys of a params file other than ``params.yaml``
  are not this config's. A stage that no ``dvc.yaml`` declares (run by hand outside the project, tests)
  logs the whole config.

The stage is the one DVC names in ``DVC_STAGE`` for the command it runs (``evaluate@toolworld``,
``science/dvc.yaml:cell@grpo-1``; its file relative to ``DVC_ROOT``), else the runner's stage name
looked up in the working directory's ``dvc.yaml``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from envace.config.load import flatten

logger = logging.getLogger(__name__)

# the keys that identify a run (its profile, algorithm, model, ...); experiments.json keeps them per row
PARAM_KEYS = ("profile", "experiment_name", "algo.name", "model.name", "engine.name", "seed")
RUN_KEYS = (*PARAM_KEYS, "data.source")  # what a pipeline run logs as params: the keys runs are filtered by
CONFIG_ARTIFACT = "config/params.yaml"  # the composed config, once per pipeline run
DVC_FILE = "dvc.yaml"
PARAMS_FILE = "params.yaml"  # DVC's default params file: the composed config
WHOLE_FILE = ""  # a declared key that stands for every key of the config


# ---- the pipeline run ------------------------------------------------------------------------------------
def pipeline_run_name(profile: str, config: Mapping[str, Any]) -> str:
    """``<profile>/<variant>/seed<seed>/<start, minutes>``, e.g. ``cpu/envace/seed0/2026-12-06T02:00``."""
    variant, seed = config.get("algo.name", "unknown-variant"), config.get("seed", "?")
    return f"{profile}/{variant}/seed{seed}/{time.strftime('%Y-%m-%dT%H:%M')}"


def run_key_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RUN_KEYS`` of a flat config (those it has)."""
    return {key: config[key] for key in RUN_KEYS if key in config}


def config_yaml(config: Mapping[str, Any]) -> str:
    """A flat config (``envace.config.load.flatten``) as the nested YAML of params.yaml; flat keys when a key
    itself holds a dot, so that nothing is lost. A value YAML cannot write (a path) is written as text."""
    tree: dict[str, Any] = {}
    for key, value in config.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[leaf] = value
    document = tree if flatten(tree) == dict(config) else dict(config)
    return yaml.safe_dump(json.loads(json.dumps(document, default=str)), sort_keys=False, allow_unicode=True)


# ---- a stage run ----------------------------------------------------------------------------------------
def stage_params(stage: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of the flat ``config`` that ``stage``'s DVC stage declares (all of them when none does)."""
    declared = declared_params(stage)
    if declared is None:
        return dict(config)
    return {key: value for key, value in config.items() if any(_covers(d, key) for d in declared)}


def _covers(declared: str, key: str) -> bool:
    return declared == WHOLE_FILE or key == declared or key.startswith(f"{declared}.")


def declared_params(stage: str) -> list[str] | None:
    """The params.yaml keys the DVC stage running ``stage`` declares (``WHOLE_FILE`` for all of them);
    None when no ``dvc.yaml`` declares that stage (see the module docstring)."""
    dvc_file, name = stage_address(stage)
    try:
        stages = (yaml.safe_load(dvc_file.read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError) as exc:
        logger.info("MLflow: no stage read from %s (%s): stage %s logs the whole config", dvc_file, exc, stage)
        return None
    definition = stages.get(name.split("@")[0])
    if not isinstance(definition, dict):
        logger.info("MLflow: %s declares no stage %s; it logs the whole config", dvc_file, name)
        return None
    body = definition.get("do", definition) if "foreach" in definition else definition
    return params_keys(body.get("params") or [])


def stage_address(stage: str) -> tuple[Path, str]:
    """(the ``dvc.yaml`` declaring the running stage, its name there): from ``DVC_STAGE`` when DVC runs it."""
    running = os.environ.get("DVC_STAGE")
    if not running:
        return Path.cwd() / DVC_FILE, stage
    path, _, name = running.rpartition(":")
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()) / (path or DVC_FILE), name


def params_keys(entries: list[Any]) -> list[str]:
    """params.yaml keys of a DVC ``params:`` list: ``key``, ``file.yaml:k1,k2`` and ``{file.yaml: [keys]}``
    (``{file.yaml: null}``: the whole file); entries of other params files are left out."""
    keys: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            file, _, names = entry.rpartition(":")
            if Path(file or PARAMS_FILE).name == PARAMS_FILE:
                keys += [k.strip() for k in names.split(",") if k.strip()]
        elif isinstance(entry, dict):
            for file, names in entry.items():
                if Path(str(file)).name == PARAMS_FILE:
                    keys += [WHOLE_FILE] if not names else [str(k) for k in names]
    return keys
