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


def toolworld_config(cfg: DictConfig) -> Any:
    """The tool world's generator config from ``data.*`` (train/val/test sizes, seed, held-out domain)."""
    from envace.envs.toolworld import ToolWorldConfig  # LIBRARY: envace.envs.toolworld

    data = cfg.data
    return ToolWorldConfig(seed=int(cfg.seed), n_train=int(data.n_train), n_val=int(data.n_val),
                           n_test=int(data.n_test), held_out_domain=data.held_out_domain)


@dataclass(frozen=True)
class Budgets:
    """Per-episode budgets of an evaluation or a rehearsal sweep (from ``eval.*`` / ``rehearsal.*``)."""

    max_steps_per_turn: int
    max_new_tokens: int
    temperature: float
    seed: int


@dataclass(frozen=True)
class Suite:
    """What an evaluation runs on one benchmark: ``eval.*`` with ``eval.suites.<benchmark>`` on top."""

    benchmark: str
    split: str
    n_tasks: int  # 0 = all (per BFCL category / τ² domain)
    budgets: Budgets
    options: dict[str, Any]  # benchmark-specific extras (τ²: max_steps, mode, user_*)
    trials: int = 1  # runs per task (eval only)

    @property
    def limit(self) -> int | None:
        return self.n_tasks or None


SUITE_OPTIONS = ("max_steps", "mode", "user_base_url", "user_model", "user_api_key_env")


def eval_suite(cfg: DictConfig, benchmark: str, section: str = "eval") -> Suite:
    """The resolved settings of ``benchmark``. ``section="eval"``: ``eval.*`` overridden by
    ``eval.suites.<benchmark>``. ``section="rehearsal"``: the sweep's own task count and budgets
    (``rehearsal.*``); the benchmark's split and extras still come from ``eval.suites.<benchmark>``."""
    over = cfg.eval.suites.get(benchmark) or {}
    options = {k: to_plain(over[k]) for k in SUITE_OPTIONS if over.get(k) is not None}
    split = over.get("split") or cfg.eval.split
    if section == "rehearsal":
        r = cfg.rehearsal
        split = over.get("split") or r.split
        budgets = Budgets(int(r.max_steps_per_turn), int(r.act_max_new_tokens), float(r.act_temperature), int(cfg.seed))
        return Suite(benchmark, str(split), int(r.n_tasks), budgets, options)
    ev = cfg.eval

    def pick(key: str) -> Any:
        return ev[key] if over.get(key) is None else over[key]

    budgets = Budgets(int(pick("max_steps_per_turn")), int(pick("act_max_new_tokens")), float(ev.temperature),
                      int(cfg.seed))
    trials = int(over.get("trials") or 1)
    if trials < 1:
        raise ValueError(f"eval.suites.{benchmark}.trials={trials}: must be >= 1")
    return Suite(benchmark, str(split), int(pick("n_tasks")), budgets, options, trials)


def _toolworld_kwargs(cfg: DictConfig, budgets: Budgets, options: dict[str, Any]) -> dict[str, Any]:
    from envace.envs.toolworld import ToolWorldEnv  # LIBRARY: envace.envs.toolworld
    from envace.evaluation import ActLoopConfig  # LIBRARY: envace.evaluation

    return {"config": ActLoopConfig(**vars(budgets)), "env": ToolWorldEnv(toolworld_config(cfg))}


def _bfcl_kwargs(cfg: DictConfig, budgets: Budgets, options: dict[str, Any]) -> dict[str, Any]:
    from envace.envs.bfcl.episode import BfclConfig  # LIBRARY: envace.envs.bfcl

    return {"config": BfclConfig(**vars(budgets))}


def _tau2_kwargs(cfg: DictConfig, budgets: Budgets, options: dict[str, Any]) -> dict[str, Any]:
    from envace.envs.tau2.config import Tau2Config  # LIBRARY: envace.envs.tau2

    # τ² budgets a whole episode in orchestrator steps (options["max_steps"]), not steps per user turn
    return {"config": Tau2Config(max_new_tokens=budgets.max_new_tokens, temperature=budgets.temperature,
                                 seed=budgets.seed, **options)}


# benchmark name -> constructor kwargs of its adapter (one line per benchmark; names = config.Benchmark)
BENCHMARK_KWARGS: dict[str, Callable[[DictConfig, Budgets], dict[str, Any]]] = {
    "toolworld": _toolworld_kwargs,
    "bfcl": _bfcl_kwargs,
    "tau2": _tau2_kwargs,
}


def make_adapter(cfg: DictConfig, suite: Suite) -> Any:
    """The benchmark adapter registered as ``suite.benchmark``, configured with the suite's budgets."""
    from envace.evaluation import get_benchmark  # LIBRARY: envace.evaluation

    unknown = sorted(set(suite.options) - set(SUITE_OPTION_USERS.get(suite.benchmark, ())))
    if unknown:
        raise ValueError(f"eval.suites.{suite.benchmark} sets {unknown}, which {suite.benchmark} does not use; "
                         f"remove them (they apply to: {', '.join(f'{b} {o}' for b, o in SUITE_OPTION_USERS.items())})")
    return get_benchmark(suite.benchmark, **BENCHMARK_KWARGS[suite.benchmark](cfg, suite.budgets, suite.options))


# which benchmark-specific suite options each adapter understands
SUITE_OPTION_USERS: dict[str, tuple[str, ...]] = {"tau2": SUITE_OPTIONS}


def _toolworld_probe_set(cfg: DictConfig, rows: list[dict[str, Any]]) -> Any:
    """The oracle's episodes (real responses) on ``train.fidelity_tasks`` of the validation ``rows``."""
    from envace.envs.toolworld import task_from_cm2_row  # LIBRARY: envace.envs.toolworld
    from envace.evaluation import oracle_probe_set, sample_tasks  # LIBRARY: envace.evaluation

    if not rows:
        raise ValueError(f"train.fidelity_every={cfg.train.fidelity_every} needs validation tasks, but none were "
                         f"kept in {cfg.paths.prepared}/val.jsonl; set data.n_val > 0 or train.fidelity_every=0")
    tasks = sample_tasks([task_from_cm2_row(r) for r in rows], int(cfg.train.fidelity_tasks), int(cfg.seed))
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
def _backend(spec: Any, name: str) -> Any:
    from envace.inference.local import LocalHFBackend  # LIBRARY: envace.inference.local

    return LocalHFBackend.from_spec(spec, name=name)


def read_manifest(cfg: DictConfig) -> dict[str, Any]:
    path = Path(cfg.paths.checkpoints) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the train stage first (`dvc repro train`)")
    return read_json(path)


def trained_backend(cfg: DictConfig, role: str) -> Any:
    """Chat backend of the trained model that plays ``role`` ("act" | "rehearse"), per the manifest."""
    manifest = read_manifest(cfg)
    rel = manifest["roles"][role]
    return _backend(model_spec(cfg, Path(cfg.paths.checkpoints) / rel), f"trained:{Path(rel).name}")


def base_backend(cfg: DictConfig) -> Any:
    """Chat backend of the untrained base model (the baseline and the `base` rehearser)."""
    return _backend(model_spec(cfg), f"base:{cfg.model.name}")
