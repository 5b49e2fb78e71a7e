"""Translations from the pipeline config to library objects, shared by several stages.

Each function is a small adapter around one library constructor; benchmark- and source-specific
pieces are registries keyed by the config's enumerated names (no if/elif over names).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from envace.config import to_plain
from envace.utils.io import read_json

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def data_seed(cfg: DictConfig) -> int:
    """The data's seed: ``data.seed``, or the run's ``seed`` when it is null. It picks what the data *is*
    (tool-world tasks, the CM2 val split, the test tasks an evaluation or probe samples), so runs that
    differ only in ``seed`` still meet the same tasks when ``data.seed`` is set."""
    return int(cfg.seed if cfg.data.get("seed") is None else cfg.data.seed)


def toolworld_config(cfg: DictConfig) -> Any:
    """The tool world's generator config from ``data.*`` (train/val/test sizes, seed, held-out domain)."""
    from envace.envs.toolworld import ToolWorldConfig  # LIBRARY: envace.envs.toolworld

    data = cfg.data
    return ToolWorldConfig(seed=data_seed(cfg), n_train=int(data.n_train), n_val=int(data.n_val),
                           n_test=int(data.n_test), held_out_domain=data.held_out_domain)


@dataclass(frozen=True)
class Budgets:
    """Per-episode budgets of an evaluation or a rehearsal sweep (from ``eval.*`` / ``rehearsal.*``)."""

    max_steps_per_turn: int
    max_new_tokens: int
    temperature: float
    seed: int


def _toolworld_probe_set(cfg: DictConfig, rows: list[dict[str, Any]]) -> Any:
    """The oracle's episodes (real responses) on ``train.fidelity_tasks`` of the validation ``rows``."""
    from envace.envs.toolworld import task_from_cm2_row  # LIBRARY: envace.envs.toolworld
    from envace.evaluation import oracle_probe_set, sample_tasks  # LIBRARY: envace.evaluation
    from envace.stages.suites import Suite, make_adapter  # imports this module: import it here

    if not rows:
        raise ValueError(f"train.fidelity_every={cfg.train.fidelity_every} needs validation tasks, but none were "
                         f"kept in {cfg.paths.prepared}/val.jsonl; set data.n_val > 0 or train.fidelity_every=0")
    tasks = sample_tasks([task_from_cm2_row(r) for r in rows], int(cfg.train.fidelity_tasks), data_seed(cfg))
    steps = max((len(turn) for t in tasks for turn in t.gold_calls), default=0) + 1  # gold steps + the reply
    suite = Suite("toolworld", "val", 0, Budgets(steps, 64, 0.0, int(cfg.seed)), {})
    return oracle_probe_set(make_adapter(cfg, suite), tasks)


# data.source -> the training-time fidelity probe set from validation rows (None: no real executor)
PROBE_SETS: dict[str, Callable[[DictConfig, list[dict[str, Any]]], Any] | None] = {
    "toolworld": _toolworld_probe_set,
    "cm2": None,
}


def model_spec(cfg: DictConfig, path: str | Path | None = None) -> Any:
    """``ModelSpec`` of the configured base model, or of a trained HF directory when ``path`` is given."""
    from envace.models import ModelSpec  # LIBRARY: envace.models

    model = cfg.model
    if path is not None:
        return ModelSpec(kind="path", path=str(path), dtype=model.dtype, seed=int(cfg.seed))
    return ModelSpec(kind=to_plain(model.kind), path=model.path, dtype=model.dtype, seed=int(cfg.seed))


@functools.lru_cache(maxsize=4)
def _backend(spec: Any, name: str, precision: str, prefix_cache_tokens: int) -> Any:
    from envace.inference.local import LocalHFBackend  # LIBRARY: envace.inference.local

    return LocalHFBackend.from_spec(spec, name=name, precision=precision, prefix_cache_tokens=prefix_cache_tokens)


def backend_options(cfg: DictConfig) -> tuple[str, int]:
    """``(eval.precision, eval.prefix_cache_tokens)`` of the local chat backends."""
    return str(cfg.eval.precision), int(cfg.eval.prefix_cache_tokens)


def read_manifest(cfg: DictConfig) -> dict[str, Any]:
    path = Path(cfg.paths.checkpoints) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the train stage first (`dvc repro train`)")
    return read_json(path)


def trained_backend(cfg: DictConfig, role: str) -> Any:
    """Chat backend of the trained model that plays ``role`` ("act" | "rehearse"), per the manifest."""
    manifest = read_manifest(cfg)
    rel = manifest["roles"][role]
    return _backend(model_spec(cfg, Path(cfg.paths.checkpoints) / rel), f"trained:{Path(rel).name}",
                    *backend_options(cfg))


def base_backend(cfg: DictConfig) -> Any:
    """Chat backend of the untrained base model (the baseline and the `base` rehearser)."""
    return _backend(model_spec(cfg), f"base:{cfg.model.name}", *backend_options(cfg))
