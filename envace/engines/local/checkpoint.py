"""Atomic training checkpoints with everything exact resumption needs.

Layout: ``<root>/step_00000004/`` holding ``models/<name>.pt`` (state dicts of trained and frozen
models), ``optim/<name>.pt``, ``rng.pt`` (torch CPU [+ CUDA], python ``random``, numpy),
``history.json`` (the metrics of every step so far, so a resumed run reports the whole curve) and
``state.json`` (step, data position, free-form extras). A checkpoint is written into a temporary
sibling directory, flushed, and renamed into place in one ``os.rename`` — a crash mid-write leaves
only a ``.tmp-*`` directory that loading ignores (and the next save removes). ``<root>/latest`` names
the newest complete checkpoint and is itself replaced atomically; loading falls back to scanning
``step_*`` directories when it is missing or stale. ``state.json`` (written last) holds a SHA-256 of every
other file of the checkpoint: loading verifies them, and a checkpoint whose files do not match (a truncated
or overwritten file, a disk error) is passed over for the previous kept one with a warning naming both;
when no kept checkpoint is intact, ``CorruptCheckpointError`` names the bad file and what to delete.

The SFT warm-up checkpoints the same way, once per epoch, under ``<root>/sft/`` (numbered by epochs done
over all its models; ``state.json`` holds ``model_index``/``model``/``epoch`` of the last epoch done and
``sft_start_epoch`` reads where to continue). The first GRPO checkpoint supersedes them.

``RunCheckpoints`` is one training run's view of this layout under ``<output_dir>/checkpoints``: it writes
the GRPO and SFT checkpoints with the run's identity (variant, seed, LoRA record, and the precision its first
process decided: ``state.json``'s ``precision``, ``envace.runtime.precision.precision_record``), refuses
to resume from a checkpoint of another variant or LoRA setting, and restores models, optimisers and RNG on
resume. ``recorded_precision`` reads the precision record back, so that a resumed process does not probe again.

State dicts go through ``torch.save`` (not safetensors) because tied embeddings share storage. A model
with LoRA adapters (``envace.engines.local.lora``) is stored as its adapter tensors only: its base
weights never train and are rebuilt from the model spec; ``Checkpoint.restore_model`` checks that the
stored keys are exactly the model's adapter keys (or, without adapters, loads the state dict strictly).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envace.engines.local.config import LocalEngineConfig
from envace.engines.local.lora import adapter_keys, adapter_state, load_adapter_state, lora_record

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
HISTORY_FILE = "history.json"
LATEST_FILE = "latest"
SFT_DIR = "sft"  # SFT warm-up checkpoints, under the GRPO checkpoint root


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]

    def model_state(self, name: str) -> dict[str, torch.Tensor]:
        return torch.load(self.path / "models" / f"{name}.pt", map_location="cpu", weights_only=True)

    def restore_model(self, name: str, model: torch.nn.Module) -> None:
        """Load model ``name`` into ``model``: its adapter tensors when it has LoRA adapters, else all weights."""
        state = self.model_state(name)
        if adapter_keys(model):
            load_adapter_state(model, state, source=f"checkpoint {self.path / 'models' / name}.pt")
        else:
            model.load_state_dict(state)

    def optimizer_state(self, name: str) -> dict[str, Any]:
        return torch.load(self.path / "optim" / f"{name}.pt", map_location="cpu", weights_only=False)

    def model_names(self) -> list[str]:
        return sorted(p.stem for p in (self.path / "models").glob("*.pt"))

    def history(self) -> list[dict[str, Any]]:
        """The metrics history saved with the checkpoint ([] for checkpoints written without one)."""
        path = self.path / HISTORY_FILE
        return json.loads(path.read_text()) if path.is_file() else []

    def restore_rng(self) -> None:
        set_rng_state(torch.load(self.path / "rng.pt", map_location="cpu", weights_only=False))


def checkpoint_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint stores of ``model``: its adapter tensors when it has LoRA adapters, else every tensor."""
    if adapter_keys(model):
        return adapter_state(model)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


CHECKSUMS_KEY = "checksums"  # state.json: {relative path: sha256} of the checkpoint's other files


class CorruptCheckpointError(RuntimeError):
    """No kept checkpoint under a root is intact; the message names the bad file and what to delete."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checksums(path: Path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): _sha256(f) for f in sorted(path.rglob("*")) if f.is_file() and f.name != STATE_FILE
    }


def corruption(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be trusted (the first bad file and what is wrong), or None.
    A checkpoint written before checksums were recorded is trusted as it is."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"{path / STATE_FILE}: unreadable ({exc})"
    for name, expected in sorted((state.get(CHECKSUMS_KEY) or {}).items()):
        file = path / name
        if not file.is_file():
            return f"{file}: missing"
        if _sha256(file) != expected:
            return (
                f"{file}: its content does not match the checksum recorded when it was written (truncated or changed)"
            )
    return None


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST_FILE}.tmp-{os.getpid()}"
    tmp.write_text(name + "\n")
    os.replace(tmp, root / LATEST_FILE)


def save_checkpoint(
    root: str | Path,
    step: int,
    models: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer],
    state: Mapping[str, Any],
    keep: int = 2,
    history: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write checkpoint ``step`` atomically; keep the newest ``keep`` (0 = all). Returns its path.

    ``history``: metrics dicts of the run so far (JSON-able), read back by ``Checkpoint.history``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-step_{step:08d}-{os.getpid()}"
    (tmp / "models").mkdir(parents=True)
    (tmp / "optim").mkdir()
    for name, model in models.items():
        torch.save(checkpoint_model_state(model), tmp / "models" / f"{name}.pt")
    for name, opt in optimizers.items():
        torch.save(opt.state_dict(), tmp / "optim" / f"{name}.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / HISTORY_FILE).write_text(json.dumps([dict(h) for h in history], default=float))
    record = {**state, "step": step, CHECKSUMS_KEY: _checksums(tmp)}
    (tmp / STATE_FILE).write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
    _fsync_tree(tmp)
    final = _step_dir(root, step)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _write_latest(root, final.name)
    _prune(root, keep)
    logger.info("checkpoint step %d written to %s", step, final)
    return final


def _complete(path: Path) -> bool:
    return path.is_dir() and (path / STATE_FILE).is_file() and not path.name.startswith(".")


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if _complete(p))


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_latest(root: str | Path) -> Checkpoint | None:
    """The newest intact checkpoint under ``root`` (None when there is none): a newer one whose files fail
    their checksums is passed over with a warning naming it and the one used instead; when every kept
    checkpoint is bad, ``CorruptCheckpointError`` says which file and what to delete."""
    root = Path(root)
    pointer = root / LATEST_FILE
    candidates = list_checkpoints(root)
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if _complete(named) and named not in candidates:
            candidates.append(named)
    bad: list[str] = []
    for path in sorted(candidates, key=lambda p: p.name, reverse=True):
        problem = corruption(path)
        if problem is not None:
            bad.append(problem)
            continue
        if bad:
            logger.warning("checkpoint not usable: %s; resuming from the previous kept checkpoint %s", bad[0], path)
        state = json.loads((path / STATE_FILE).read_text())
        return Checkpoint(path=path, step=int(state["step"]), state=state)
    if bad:
        raise CorruptCheckpointError(
            f"no intact checkpoint under {root}: {'; '.join(bad)}. Delete {root} to start this run's training "
            "over (or restore the file from a backup)"
        )
    return None


def sft_start_epoch(ckpt: Checkpoint | None, model_index: int, epochs: int) -> int:
    """The first SFT epoch still to run for the ``model_index``-th trained model, given the latest SFT
    checkpoint (``state``: ``model_index`` and ``epoch`` of the last epoch done): 0 without one or for a
    model after that one, ``epochs`` (nothing left) for a model before it."""
    if ckpt is None:
        return 0
    done_index, done_epoch = int(ckpt.state["model_index"]), int(ckpt.state["epoch"])
    if model_index < done_index:
        return epochs
    return done_epoch + 1 if model_index == done_index else 0


class RunCheckpoints:
    """The checkpoints of one run (``cfg.output_dir``/checkpoints); every method is a no-op without an
    ``output_dir``, and the resume methods find nothing with ``cfg.resume`` off."""

    def __init__(self, cfg: LocalEngineConfig) -> None:
        self.cfg = cfg
        self.root = Path(cfg.output_dir) / "checkpoints" if cfg.output_dir else None
        # the run's precision record, set by the engine once decided (``decide_run_precision``); every
        # checkpoint written after that holds it
        self.precision: dict[str, Any] | None = None

    def identity(self) -> dict[str, Any]:
        """What a checkpoint records of the run that wrote it (``check`` compares variant and LoRA)."""
        cfg = self.cfg
        found = {"variant": cfg.variant, "seed": cfg.seed, "lora": lora_record(cfg.lora)}
        return found if self.precision is None else {**found, "precision": self.precision}

    def check(self, ckpt: Checkpoint) -> None:
        """Refuse a checkpoint written by another variant or LoRA setting (actionable error)."""
        cfg = self.cfg
        if ckpt.state.get("variant") != cfg.variant:
            raise ValueError(
                f"checkpoint {ckpt.path} is for variant {ckpt.state.get('variant')!r}, config asks "
                f"{cfg.variant!r}; use another output_dir or set resume=False"
            )
        if ckpt.state.get("lora") != lora_record(cfg.lora):
            raise ValueError(
                f"checkpoint {ckpt.path} was written with lora={ckpt.state.get('lora')}, config asks "
                f"lora={lora_record(cfg.lora)} (algo.lora_*); use another output_dir or set resume=False"
            )

    def latest(self) -> Checkpoint | None:
        """The GRPO checkpoint a resume would continue from (None: none, or resume off)."""
        return load_latest(self.root) if self.root is not None and self.cfg.resume else None

    def latest_sft(self) -> Checkpoint | None:
        """The SFT checkpoint a resume of the warm-up would continue from (None: none, or resume off)."""
        return load_latest(self.root / SFT_DIR) if self.root is not None and self.cfg.resume else None

    def recorded_precision(self) -> dict[str, Any] | None:
        """The precision record of the checkpoint a resume continues from (the latest GRPO one, else the
        latest SFT one); None without one, with resume off, or for checkpoints written before records."""
        ckpt = self.latest() or self.latest_sft()
        return None if ckpt is None else ckpt.state.get("precision")

    def save(
        self,
        step: int,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        history: Sequence[Mapping[str, Any]],
    ) -> str | None:
        """GRPO checkpoint ``step`` (trained and frozen models, optimisers, history); removes the SFT ones."""
        if self.root is None:
            return None
        state = {"data_position": step * self.cfg.prompts_per_step, **self.identity()}
        path = save_checkpoint(
            self.root, step, models, optimizers, state, keep=self.cfg.keep_checkpoints, history=history
        )
        shutil.rmtree(self.root / SFT_DIR, ignore_errors=True)  # superseded
        return str(path)

    def resume(
        self, models: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
    ) -> tuple[int, list[dict[str, float]]]:
        """(step, metrics history) of the latest checkpoint, restored into models/optimisers/RNG; (0, [])."""
        ckpt = self.latest()
        if ckpt is None:
            return 0, []
        self.check(ckpt)
        for name, model in models.items():
            ckpt.restore_model(name, model)
        for name, opt in optimizers.items():
            opt.load_state_dict(ckpt.optimizer_state(name))
        ckpt.restore_rng()
        logger.info("resumed from %s (step %d)", ckpt.path, ckpt.step)
        return ckpt.step, ckpt.history()

    def save_sft(
        self,
        index: int,
        name: str,
        epoch: int,
        models: Mapping[str, torch.nn.Module],
        optimizer: torch.optim.Optimizer,
        history: Sequence[Mapping[str, Any]],
    ) -> None:
        """The SFT checkpoint after ``epoch`` of the ``index``-th model (``name``) when ``checkpoint_every``."""
        if self.root is None or not self.cfg.checkpoint_every:
            return
        state = {"model_index": index, "model": name, "epoch": epoch, **self.identity()}
        save_checkpoint(
            self.root / SFT_DIR,
            index * self.cfg.sft.epochs + epoch + 1,
            models,
            {name: optimizer},
            state,
            keep=self.cfg.keep_checkpoints,
            history=history,
        )

    def resume_sft(self, models: Mapping[str, torch.nn.Module]) -> Checkpoint | None:
        """The latest SFT checkpoint restored into the models and RNG (None: none, or resume off)."""
        ckpt = self.latest_sft()
        if ckpt is None:
            return None
        self.check(ckpt)
        for name, model in models.items():
            ckpt.restore_model(name, model)
        ckpt.restore_rng()
        logger.info(
            "resumed the SFT warm-up from %s (model %s, epoch %d done)",
            ckpt.path,
            ckpt.state["model"],
            int(ckpt.state["epoch"]) + 1,
        )
        return ckpt
