"""Task success measured during training: the in-training ACT policy plays validation tasks for real.

A ``ValidationSet`` (``envace.evaluation.probes``) is a benchmark adapter and a fixed list of its tasks (the train
stage builds it from the evaluation's settings: ``envace.stages.suites.VALIDATION_SETS``).
``ValidationProbe.measure`` wraps the live policy module in a ``LocalHFBackend`` and runs
``envace.evaluation.evaluate`` on those tasks — the code the evaluate stage runs, so the probe after the last step
and an evaluation of the exported weights on the same tasks play the same episodes (greedy decoding, the same
budgets). Every call goes to
the task's real executor; the probe's calls are counted apart (``val/real_calls``) from training's.

Metrics: ``val/success`` (strict success rate), ``val/score`` (mean checklist score), ``val/n``,
``val/real_calls`` (real tool calls the probe made) and ``time/val`` (seconds). The engine schedules it
on the ACT model every ``val_every`` steps (``envace.engines.local.probing``, as the fidelity probe: step 0,
every k steps, the last step), measured ``untouched`` (eval mode, no gradients, RNG states restored).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from envace.core.prompts import ChatFormatter
from envace.engines.local.config import LocalEngineConfig
from envace.engines.local.probing import untouched
from envace.evaluation.probes import ValidationSet
from envace.evaluation.runner import evaluate
from envace.inference import (
    local as local_inference,  # a module: it imports our kv/precision (a cycle)
)

logger = logging.getLogger(__name__)

VAL_PREFIX = "val/"


class ValidationProbe:
    """Plays a ``ValidationSet`` with a torch policy (see the module docstring)."""

    def __init__(self, validation_set: ValidationSet, *, precision: str = "fp32", progress: bool = False) -> None:
        self.validation_set = validation_set
        self.precision = precision  # the engine's (resolved) precision
        self.progress = progress

    def measure(self, model: torch.nn.Module, tokenizer: Any, formatter: ChatFormatter) -> dict[str, float]:
        """``val/*`` metrics of ``model`` in the ACT role; training state is left as found."""
        started = time.perf_counter()
        vs = self.validation_set
        with untouched(model):
            backend = local_inference.LocalHFBackend(
                model,
                tokenizer,
                name="act@train",
                batch_size=vs.concurrency,
                formatter=formatter,
                precision=self.precision,
                prefix_cache_tokens=vs.prefix_cache_tokens,
            )
            run = evaluate(vs.adapter, backend, vs.tasks, concurrency=vs.concurrency, progress=self.progress)
        m = run.metrics
        metrics = {
            f"{VAL_PREFIX}success": m.success_rate,
            f"{VAL_PREFIX}score": m.mean_score,
            f"{VAL_PREFIX}n": float(m.n_tasks),
            f"{VAL_PREFIX}real_calls": float(sum(r.real_calls for r in run.records)),
            f"{VAL_PREFIX}crashed": float(sum(1 for r in run.records if r.crashed)),
            "time/val": time.perf_counter() - started,
        }
        logger.info(
            "validation: %d tasks, success %.3f, score %.3f in %.1f s",
            m.n_tasks,
            m.success_rate,
            m.mean_score,
            metrics["time/val"],
        )
        return metrics


def make_validation(
    cfg: LocalEngineConfig, validation_set: ValidationSet | None, precision: str
) -> ValidationProbe | None:
    """The run's validation probe (None when ``cfg.val_every`` is 0); an actionable error without tasks."""
    if cfg.val_every <= 0:
        return None
    if validation_set is None:
        raise ValueError(
            f"val_every={cfg.val_every} needs LocalEngine(validation_set=...) (an adapter and its validation "
            "tasks: envace.evaluation.probes.ValidationSet); or set val_every=0"
        )
    return ValidationProbe(validation_set, precision=precision, progress=cfg.progress)
