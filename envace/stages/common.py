"""Translations from the pipeline config to library objects, shared by several stages.

Each function is a small adapter around one library constructor; benchmark- and source-specific
pieces are registries keyed by the config's enumerated names (no if/elif over names). They take the typed
``Config`` the stage runner converts once (``envace.config.load.typed_config``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.config.load import to_plain
from envace.config.schema import Config
from envace.envs.toolworld import ToolWorldConfig
from envace.utils.io import read_json

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
BASELINE_DIR = "sft"  # under paths.checkpoints: the SFT warm-up's weights (manifest "baseline")


def data_seed(cfg: Config) -> int:
    """The data's seed: ``data.seed``, or the run's ``seed`` when it is null. It picks what the data *is*
    (tool-world tasks, the CM2 val split, the test tasks an evaluation or probe samples), so runs that
    differ only in ``seed`` still meet the same tasks when ``data.seed`` is set."""
    return cfg.seed if cfg.data.seed is None else cfg.data.seed


def toolworld_config(cfg: Config) -> Any:
    """The tool world's generator config from ``data.*`` (train/val/test sizes, seed, held-out domain)."""
    data = cfg.data
    return ToolWorldConfig(
        seed=data_seed(cfg),
        n_train=int(data.n_train),
        n_val=int(data.n_val),
        n_test=int(data.n_test),
        held_out_domain=data.held_out_domain,
    )


@dataclass(frozen=True)
class Budgets:
    """Per-episode budgets of an evaluation or a rehearsal sweep (from ``eval.*`` / ``rehearsal.*``)."""

    max_steps_per_turn: int
    max_new_tokens: int
    temperature: float
    seed: int


def model_spec(cfg: Config, path: str | Path | None = None) -> Any:
    """``ModelSpec`` of the configured base model, or of a trained HF directory when ``path`` is given."""
    # lazy: envace.models imports transformers (seconds); a stage's preflight fails on a dead endpoint before that
    from envace.models import ModelSpec

    model = cfg.model
    if path is not None:
        return ModelSpec(kind="path", path=str(path), dtype=model.dtype, seed=int(cfg.seed))
    return ModelSpec(kind=to_plain(model.kind), path=model.path, dtype=model.dtype, seed=int(cfg.seed))


@functools.lru_cache(maxsize=4)
def _backend(spec: Any, name: str, precision: str, prefix_cache_tokens: int) -> Any:
    # lazy: the local backend loads torch, transformers and the local engine; preflight runs before that
    from envace.inference.local import LocalHFBackend

    return LocalHFBackend.from_spec(spec, name=name, precision=precision, prefix_cache_tokens=prefix_cache_tokens)


def eval_precision(cfg: Config) -> str:
    """The precision of the local chat backends: ``eval.precision``, where ``auto`` is the precision the
    trained checkpoint ran at (its manifest's ``precision`` record, written by the train stage) when that run
    was on a CPU, as the backends are; else ``auto`` (each backend probes)."""
    wanted = str(cfg.eval.precision)
    path = Path(cfg.paths.checkpoints) / MANIFEST
    recorded = read_json(path).get("precision") if wanted == "auto" and path.is_file() else None
    if recorded is None or recorded.get("device") != "cpu":
        return wanted
    logger.info("eval.precision auto -> %s, as recorded in %s", recorded["precision"], path)
    return str(recorded["precision"])


def backends_precision(*backends: Any) -> str | None:
    """The precision ``backends`` ran at (their ``precision``): one value, ``"bf16+fp32"`` when they
    differ, None when none has one (remote backends). Stages record it as ``precision``."""
    found = sorted({str(p) for b in backends if (p := getattr(b, "precision", None)) is not None})
    return "+".join(found) or None


def backend_options(cfg: Config) -> tuple[str, int]:
    """``(precision, eval.prefix_cache_tokens)`` of the local chat backends (``eval_precision``)."""
    return eval_precision(cfg), int(cfg.eval.prefix_cache_tokens)


def read_manifest(cfg: Config) -> dict[str, Any]:
    path = Path(cfg.paths.checkpoints) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the train stage first (`dvc repro train`)")
    return read_json(path)


def trained_backend(cfg: Config, role: str) -> Any:
    """Chat backend of the trained model that plays ``role`` ("act" | "rehearse"), per the manifest."""
    manifest = read_manifest(cfg)
    rel = manifest["roles"][role]
    return _backend(
        model_spec(cfg, Path(cfg.paths.checkpoints) / rel), f"trained:{Path(rel).name}", *backend_options(cfg)
    )


def baseline_kind(cfg: Config) -> str:
    """What the trained model is compared with (``eval.baseline``): ``sft`` (the weights RL started from,
    after the train stage's SFT warm-up) or ``base`` (the configured model, untrained); ``auto`` is ``sft``
    when the run had a warm-up (its manifest lists ``baseline``), else ``base``."""
    wanted = to_plain(cfg.eval.baseline)
    has_sft = "baseline" in read_manifest(cfg) if wanted != "base" else False
    if wanted == "sft" and not has_sft:
        raise ValueError(
            f"eval.baseline=sft but {Path(cfg.paths.checkpoints) / MANIFEST} lists no SFT warm-up weights: "
            "train with train.sft_epochs > 0 (engine=local), or set eval.baseline=base or auto"
        )
    return "sft" if has_sft else "base"


def base_backend(cfg: Config, role: str = "act") -> Any:
    """Chat backend of the baseline model playing ``role`` (the comparison in ``evaluate`` and the `base`
    rehearser of the sweep): the SFT warm-up's weights or the untrained model, per ``baseline_kind``."""
    if baseline_kind(cfg) == "sft":
        rel = read_manifest(cfg)["baseline"][role]
        spec = model_spec(cfg, Path(cfg.paths.checkpoints) / rel)
        return _backend(spec, f"sft:{cfg.model.name}:{Path(rel).name}", *backend_options(cfg))
    return _backend(model_spec(cfg), f"base:{cfg.model.name}", *backend_options(cfg))
