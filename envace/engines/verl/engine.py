"""``VerlEngine``: the ``Engine`` behind ``get_engine("verl")`` for the ``train`` stage.

The stage calls ``get_engine("verl", reward_fn=…, executor_factory=…)`` and ``engine.train(config,
specs, callbacks)`` like for the local engine. Differences, because verl runs in other processes:

- the reward function and the executor factory cannot be shipped to Ray workers; the agent loop rebuilds
  them by name from the config (``judge.name``, ``data.source``), so the ones given here are ignored
  (logged once);
- the episodes come from the pipeline's files (``prepare_verl_data``) restricted to the task ids of
  ``data``: the files also hold the raw rows that real executors are rebuilt from;
- ``callbacks`` are replayed after training from verl's per-step metric lines (``<output_dir>/metrics``).

``VerlEngineConfig.cfg`` is our whole config as the typed ``Config`` (a ``DictConfig`` or plain mapping given
there is converted once, on construction); ``output_dir`` the stage's work directory (stable per config, so
``train.resume`` continues from verl's latest checkpoint there).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.config.load import typed_config
from envace.config.schema import Config
from envace.engines.base import Engine, EpisodeSpec, StepCallback, TrainResult, register_engine
from envace.engines.verl.config_builder import checkpoint_dir
from envace.engines.verl.launcher import launch_verl_training

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerlEngineConfig:
    cfg: Config
    output_dir: str
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    extra_overrides: tuple[str, ...] = ()
    dry_run: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cfg", typed_config(self.cfg))


def read_step_metrics(metrics_dir: Path) -> dict[int, dict[str, float]]:
    """verl ``file`` logger lines (every launch, oldest first) → {step: numeric metrics}; later lines win."""
    steps: dict[int, dict[str, float]] = {}
    for path in sorted(metrics_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            numbers = {
                k: float(v)
                for k, v in entry.get("data", {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            steps.setdefault(int(entry["step"]), {}).update(numbers)
    return steps


def has_weights(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


def latest_hf_weights(output_dir: Path) -> Path | None:
    """``checkpoints/global_step_N/actor/huggingface`` of the highest N holding weights (verl always writes
    config and tokenizer there; the weights only with ``hf_model`` in ``checkpoint.save_contents``)."""
    best: tuple[int, Path] | None = None
    for step_dir in checkpoint_dir(output_dir).glob("global_step_*"):
        hf = step_dir / "actor" / "huggingface"
        step = int(step_dir.name.rsplit("_", 1)[-1])
        if hf.is_dir() and has_weights(hf) and (best is None or step > best[0]):
            best = (step, hf)
    return None if best is None else best[1]


@register_engine("verl")
class VerlEngine(Engine):
    """Runs ``launch_verl_training`` for the pipeline (module docstring)."""

    name = "verl"

    def __init__(self, reward_fn: Any = None, executor_factory: Any = None, **_: Any) -> None:
        if reward_fn is not None or executor_factory is not None:
            logger.debug(
                "verl engine: rewards and executors are rebuilt inside the Ray workers from the config "
                "(judge.name, data.source); the in-process ones passed to the engine are not used"
            )

    def train(
        self, config: VerlEngineConfig, data: Sequence[EpisodeSpec], callbacks: Sequence[StepCallback] = ()
    ) -> TrainResult:
        out = Path(config.output_dir).resolve()
        code = launch_verl_training(
            config.cfg,
            dry_run=config.dry_run,
            output_dir=out,
            uuids=[spec.task_id for spec in data],
            tracking_uri=config.tracking_uri,
            parent_run_id=config.parent_run_id,
            extra_overrides=config.extra_overrides,
        )
        if code != 0:
            raise RuntimeError(f"verl training failed with exit code {code}; the command is in {out / 'command.sh'}")
        history = []
        for step, metrics in sorted(read_step_metrics(out / "metrics").items()):
            row = {"step": float(step), **metrics}
            history.append(row)
            for callback in callbacks:
                callback(step, row)
        return TrainResult(
            steps_done=int(history[-1]["step"]) if history else 0,
            history=tuple(history),
            checkpoint_dir=str(checkpoint_dir(out)),
            artifacts=self._export(out),
        )

    @staticmethod
    def _export(out: Path) -> dict[str, str]:
        """Copy the latest HF weights to ``<output_dir>/final/policy`` (the stage's export layout)."""
        hf = latest_hf_weights(out)
        if hf is None:
            logger.warning(
                "verl engine: no HF weights under %s; nothing exported. Merge a sharded checkpoint with "
                "`python -m verl.model_merger merge --backend fsdp --local_dir <global_step_N>/actor "
                "--target_dir <dir>`",
                checkpoint_dir(out),
            )
            return {}
        target = out / "final" / "policy"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(hf, target)
        return {"policy": str(target)}
