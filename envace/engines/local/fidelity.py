"""World-model fidelity measured during training (docs/method.md §13): the in-training REHEARSE model, probed.

A ``FidelityProbe`` holds a fixed probe set (``envace.evaluation.ProbeSet``: the oracle's episodes on a
few validation tasks, with the real responses of its calls) and scores a torch model on it with
``envace.evaluation.measure_fidelity`` through a ``LocalHFBackend`` over the live module: greedy,
seeded with the run's seed (the same requests and seeds at every probe, so probes differ only by the
weights). Metrics: ``fidelity/{exact_match,field_f1,error_agreement,parse_failure_rate,n_calls}`` and
``time/fidelity`` (seconds).

Schedule (``probe_due``) with ``every`` = k > 0: step 0 (after the SFT warm-up, before the first GRPO
update), every step s with s % k == 0, and the last step. A probe at step s measures the weights after
s updates — the probe of RL step s runs after that step's update, so it sits in step s's metrics.

The probe leaves training untouched: the model is switched to eval mode and back, nothing needs
gradients, and the global RNG states (torch, CUDA, python, numpy) are saved and restored around it,
so a run with probes has bit-identical weights to one without (a test checks).

The engine builds its probe with ``make_probe`` (None when ``fidelity_every`` is 0) and calls ``probe_at``
after the SFT warm-up (step 0) and after every RL step; ``probe_at`` measures the REHEARSE model (the
``rehearse`` copy when the roles have separate models, else the shared policy) only when ``probe_due``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from envace.core.prompts import ChatFormatter
from envace.core.rehearse_context import DEFAULT_CONTEXT_TOKENS
from envace.engines.local.checkpoint import rng_state, set_rng_state
from envace.engines.local.config import LocalEngineConfig
from envace.evaluation.fidelity import measure_fidelity
from envace.evaluation.probes import ProbeSet
from envace.inference import (
    local as local_inference,  # a module: it imports our kv/precision (a cycle)
)

logger = logging.getLogger(__name__)

FIDELITY_PREFIX = "fidelity/"


def probe_due(step: int, every: int, total_steps: int) -> bool:
    """Whether the probe runs after ``step`` updates (step 0 = before any GRPO update)."""
    return every > 0 and (step == 0 or step % every == 0 or step == total_steps)


@contextmanager
def untouched(model: torch.nn.Module) -> Iterator[None]:
    """Measure ``model`` without touching training: eval mode, no gradients, and the global RNG states
    (torch, CUDA, python, numpy) saved and restored, so a run with probes trains bit-identical weights."""
    saved_rng, was_training = rng_state(), model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
        set_rng_state(saved_rng)


class FidelityProbe:
    """Scores a REHEARSE model on a fixed ``ProbeSet`` (see the module docstring)."""

    def __init__(
        self,
        probe_set: ProbeSet,
        *,
        max_new_tokens: int,
        seed: int,
        batch_size: int = 8,
        progress: bool = False,
        precision: str = "fp32",
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    ) -> None:
        if probe_set.n_calls == 0:
            raise ValueError(
                "FidelityProbe: the probe set has no real calls; build it with "
                "envace.evaluation.oracle_probe_set on tasks with gold calls"
            )
        self.probe_set = probe_set
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.batch_size = batch_size
        self.progress = progress
        self.precision = precision  # the engine's (resolved) precision
        self.context_tokens = context_tokens  # the rollout's REHEARSE conversation budget (same layout)

    def measure(self, model: torch.nn.Module, tokenizer: Any, formatter: ChatFormatter) -> dict[str, float]:
        """``fidelity/*`` metrics of ``model`` in the REHEARSE role; training state is left as found."""
        started = time.perf_counter()
        with untouched(model):
            backend = local_inference.LocalHFBackend(
                model,
                tokenizer,
                name="rehearse@train",
                batch_size=self.batch_size,
                formatter=formatter,
                precision=self.precision,
            )
            report = measure_fidelity(
                backend,
                self.probe_set.records,
                self.probe_set.tasks,
                max_new_tokens=self.max_new_tokens,
                temperature=0.0,
                seed=self.seed,
                progress=self.progress,
                context_tokens=self.context_tokens,
            )
        stats = report.overall
        metrics = {
            f"{FIDELITY_PREFIX}exact_match": stats.exact_match,
            f"{FIDELITY_PREFIX}field_f1": stats.field_f1,
            f"{FIDELITY_PREFIX}error_agreement": stats.error_agreement,
            f"{FIDELITY_PREFIX}parse_failure_rate": stats.parse_failure_rate,
            f"{FIDELITY_PREFIX}n_calls": float(stats.n),
            "time/fidelity": time.perf_counter() - started,
        }
        logger.info(
            "fidelity probe: %d calls, exact %.3f, field F1 %.3f, error agreement %.3f in %.1f s",
            stats.n,
            stats.exact_match,
            stats.field_f1,
            stats.error_agreement,
            metrics["time/fidelity"],
        )
        return metrics


def make_probe(cfg: LocalEngineConfig, probe_set: ProbeSet | None, precision: str) -> FidelityProbe | None:
    """The run's probe (None when ``cfg.fidelity_every`` is 0); an actionable error when it has no probe set."""
    if cfg.fidelity_every <= 0:
        return None
    if probe_set is None:
        raise ValueError(
            f"fidelity_every={cfg.fidelity_every} needs LocalEngine(fidelity_probe_set=...) (e.g. "
            "envace.evaluation.oracle_probe_set on validation tasks); or set fidelity_every=0"
        )
    return FidelityProbe(
        probe_set,
        max_new_tokens=cfg.rollout.max_rehearse_tokens,
        seed=cfg.seed,
        progress=cfg.progress,
        precision=precision,
        context_tokens=cfg.rollout.rehearse_context_tokens,
    )


def probe_at(
    probe: FidelityProbe | None,
    cfg: LocalEngineConfig,
    step: int,
    models: Mapping[str, Any],
    tokenizer: Any,
    formatter: ChatFormatter,
) -> dict[str, float]:
    """``fidelity/*`` metrics of the REHEARSE model in ``models`` after ``step`` updates when a probe is due,
    else {}."""
    if probe is None or not probe_due(step, cfg.fidelity_every, cfg.steps):
        return {}
    return probe.measure(models.get("rehearse", models.get("policy")), tokenizer, formatter)
