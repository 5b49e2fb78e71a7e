"""World-model fidelity measured during training (docs/method.md §13): the in-training REHEARSE model, probed.

A ``FidelityProbe`` holds a fixed probe set (``envace.evaluation.ProbeSet``: the oracle's episodes on a
few validation tasks, with the real responses of its calls) and scores a torch model on it with
``envace.evaluation.measure_fidelity`` through a ``LocalHFBackend`` over the live module: greedy,
seeded with the run's seed (the same requests and seeds at every probe, so probes differ only by the
weights). Metrics: ``fidelity/{exact_match,field_f1,error_agreement,parse_failure_rate,n_calls}`` and
``time/fidelity`` (seconds).

The engine builds the probe with ``make_probe`` (None when ``fidelity_every`` is 0) and schedules it on the
REHEARSE model every ``fidelity_every`` steps (``envace.engines.local.probing``: the schedule, and
``untouched``, which keeps the measurement from changing training).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from envace.core.prompts import ChatFormatter
from envace.core.rehearse_context import DEFAULT_CONTEXT_TOKENS
from envace.engines.local.config import LocalEngineConfig
from envace.engines.local.probing import untouched
from envace.evaluation.fidelity import measure_fidelity
from envace.evaluation.probes import ProbeSet
from envace.inference import (
    local as local_inference,  # a module: it imports our kv/precision (a cycle)
)

logger = logging.getLogger(__name__)

FIDELITY_PREFIX = "fidelity/"


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
