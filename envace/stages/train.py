"""Stage ``train``: role-wise GRPO (or an ablation variant, ``algo.name``) with the engine ``engine.name``.

Training rows are the prepared train rows whose prompts fit (``kept_uuids.json``); each becomes an episode
spec (tool-world rows are rebuilt into tasks whose gold calls run once on a real executor, so the SFT
warm-up's REHEARSE targets are real responses, as CM2's recorded ones are). Step metrics go to MLflow (``step=``)
and ``paths.plots/train_steps.csv``; ``envace.tracking.mlflow_logging`` logs rollout tables, data sets,
system metrics, model.

With ``train.fidelity_every`` = k > 0 (engine local, tool-world data) REHEARSE predicts the real responses of the
oracle's calls on ``train.fidelity_tasks`` val tasks at step 0 (before any GRPO update), every k steps and at the
last (``fidelity/*``). With ``train.val_every`` = k > 0 the ACT model plays ``train.val_tasks`` validation tasks on
the real environment on the same schedule (``val/*``: the success curve). train.json adds ``curves``
(``envace.core.curves``) to ``final/*``. Resumable: the engine checkpoints into ``.envace/train/<config hash>``
(outside DVC's outputs); a re-run of the same config continues from the latest one. On success the final weights
move into ``paths.checkpoints/final`` with ``manifest.json`` (roles' directories, files, config hash) and the work
directory is removed.

The precision the local engine decided once for the run (``engine.precision: auto`` resolved by the first process,
``envace.runtime.precision.decide_run_precision``) goes to the manifest's ``precision`` record (which the
evaluate and rehearsal_sweep stages reuse for ``eval.precision: auto``), to the MLflow params
``engine.precision_resolved`` / ``engine.precision_cpu_model`` / ``engine.precision_bf16_supported``, and to
train.details.json's ``precision``."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from envace.config.load import flatten, to_plain
from envace.config.schema import Config
from envace.core.curves import training_curves
from envace.engines import get_engine
from envace.envs.data_sources import data_source
from envace.inference.preflight import preflight
from envace.stages.common import BASELINE_DIR, MANIFEST
from envace.stages.runner import NULL_TRACKER, Tracker, configure_torch, stage_main
from envace.stages.suites import PROBE_SETS, VALIDATION_SETS
from envace.stages.train_setup import ENGINE_CONFIGS, REWARDS, config_hash, probe_every, validation_every
from envace.tracking.mlflow_logging import train_logging
from envace.utils.io import atomic_dir, atomic_path, read_json, read_jsonl, write_json

logger = logging.getLogger(__name__)

WORK_ROOT = Path(".envace") / "train"


def split_rows(cfg: Config, split: str) -> list[dict[str, Any]]:
    """Prepared rows of ``split`` whose prompts fit (``kept_uuids.json``)."""
    kept = set(read_json(Path(cfg.paths.prompts) / "kept_uuids.json").get(split, []))
    return [row for row in read_jsonl(Path(cfg.paths.prepared) / f"{split}.jsonl") if row["uuid"] in kept]


def training_rows(cfg: Config) -> list[dict[str, Any]]:
    rows = split_rows(cfg, "train")
    if not rows:
        raise ValueError(f"train: no training rows left after template_prompts ({cfg.paths.prompts}/kept_uuids.json)")
    return rows


def write_step_csv(path: Path, history: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp:
        columns = ["step", *sorted({k for h in history for k in h} - {"step"})]
        pd.DataFrame(history, columns=columns).to_csv(tmp, index=False)


ROLE_MODELS = (("act", "act"), ("rehearse", "rehearse"))  # role -> its own model's name (else: policy)


def export_checkpoint(
    result: Any, work: Path, cfg: Config, digest: str, precision: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Move the engine's final weights (and the SFT warm-up's, when it ran) into paths.checkpoints with a
    manifest (with the run's ``precision`` record when the engine made one)."""
    final = {name: Path(path) for name, path in result.artifacts.items()}
    with atomic_dir(cfg.paths.checkpoints) as tmp:
        shutil.move(str(work / "final"), tmp / "final")
        for name, path in result.baseline.items():  # the SFT warm-up's weights: eval.baseline=sft
            (tmp / BASELINE_DIR).mkdir(exist_ok=True)
            shutil.move(path, tmp / BASELINE_DIR / name)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "schema_version": 1,
            "engine": to_plain(cfg.engine.name),
            "variant": to_plain(cfg.algo.name),
            "base_model": flatten(cfg.model),
            "steps_done": result.steps_done,
            "config_hash": digest,
            "roles": {role: f"final/{name if name in final else 'policy'}" for role, name in ROLE_MODELS},
            "files": [{"path": str(p.relative_to(tmp)), "bytes": p.stat().st_size} for p in files],
            "final_metrics": result.final_metrics,
        }
        if result.baseline:  # the weights RL started from (after the SFT warm-up), per role
            base = result.baseline
            manifest["baseline"] = {role: f"{BASELINE_DIR}/{n if n in base else 'policy'}" for role, n in ROLE_MODELS}
        if precision is not None:
            manifest["precision"] = precision
        write_json(tmp / MANIFEST, manifest)
    return manifest


def precision_params(record: dict[str, Any]) -> dict[str, Any]:
    """The MLflow params of the run's precision decision (``precision_record``)."""
    return {
        "engine.precision_resolved": record["precision"],
        "engine.precision_cpu_model": record["cpu_model"],
        "engine.precision_bf16_supported": record["bf16_supported"],
    }


def run(cfg: Config, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    preflight(cfg, "train")  # the judge/simulator endpoints answer, before the model loads
    configure_torch(cfg)
    name, source = to_plain(cfg.engine.name), to_plain(cfg.data.source)
    specs, executor_factory = data_source(source).episodes(training_rows(cfg))  # data.source: envace.envs.data_sources
    digest = config_hash(cfg)
    work = WORK_ROOT / digest
    engine_config = ENGINE_CONFIGS[name](cfg, work, tracker)
    if cfg.train.fidelity_every and not probe_every(cfg):
        logger.warning("train.fidelity_every ignored: the fidelity probe needs engine=local and a real executor")
    probe_set = PROBE_SETS[source](cfg, split_rows(cfg, "val")) if probe_every(cfg) else None  # once, up front
    if cfg.train.val_every and not validation_every(cfg):
        logger.warning("train.val_every ignored: the validation probe needs engine=local and a real executor")
    validation_set = VALIDATION_SETS[source](cfg) if validation_every(cfg) else None
    logged: set[int] = set()

    def on_step(step: int, metrics: dict[str, float]) -> None:
        tracker.log_metrics(metrics, step=step)
        if "step" in metrics:  # RL steps and the step-0 probe (SFT epochs report sft/* keys)
            logged.add(int(metrics["step"]))

    engine = get_engine(
        name,
        reward_fn=REWARDS[to_plain(cfg.judge.name)](cfg),
        executor_factory=executor_factory,
        fidelity_probe_set=probe_set,
        validation_set=validation_set,
    )
    with train_logging(cfg, tracker, engine):  # then logs manifest, train_steps.csv and the model to MLflow
        result = engine.train(engine_config, specs, callbacks=[on_step])
        precision = getattr(engine, "precision_record", None)  # the local engine's decision (verl: none)
        if precision is not None:
            tracker.log_params(precision_params(precision))
        history = [dict(h) for h in result.history if "step" in h]  # with the rows a resumed run restored:
        for row in (h for h in history if int(h["step"]) not in logged):  # MLflow gets the whole curve too
            tracker.log_metrics(row, step=int(row["step"]))
        write_step_csv(Path(cfg.paths.plots) / "train_steps.csv", history)
        manifest = export_checkpoint(result, work, cfg, digest, precision)
    shutil.rmtree(work, ignore_errors=True)
    final = {f"final/{k}": v for k, v in result.final_metrics.items() if isinstance(v, (int, float)) and k != "step"}
    return {
        "steps_done": result.steps_done,
        "n_train_rows": len(specs),
        "variant": manifest["variant"],
        "precision": None if precision is None else precision["precision"],
        **final,
        "curves": training_curves(history, result.steps_done),
    }


main = stage_main("train", run, trains=True)

if __name__ == "__main__":
    raise SystemExit(main())
