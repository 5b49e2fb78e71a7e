"""What the engine's training-time probes share: when one runs, which model it measures, and that measuring
leaves training alone.

Two probes measure the policy while it trains: world-model fidelity of the REHEARSE model
(``envace.engines.local.fidelity.FidelityProbe``, ``fidelity_every``) and task success of the ACT model on real
validation tasks (``envace.engines.local.validation.ValidationProbe``, ``val_every``). The engine holds each as a
``ScheduledProbe`` and asks every one after the SFT warm-up (step 0) and after each RL step; a probe with
``every`` = k > 0 runs at step 0, at every step s with s % k == 0 and at the last step, and measures the model of
its role (the role's own copy when the roles have separate models, else the shared policy). A probe at step s
measures the weights after s updates, so its metrics sit in step s's row.

``untouched`` is the isolation both probes measure inside: eval mode, no gradients, and the global RNG states
(torch, CUDA, python, numpy) saved and restored, so a run with probes trains bit-identical weights to one
without (tests check both probes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from envace.core.prompts import ChatFormatter
from envace.engines.local.checkpoint import rng_state, set_rng_state


def probe_due(step: int, every: int, total_steps: int) -> bool:
    """Whether a probe runs after ``step`` updates (step 0 = before any GRPO update)."""
    return every > 0 and (step == 0 or step % every == 0 or step == total_steps)


@contextmanager
def untouched(model: torch.nn.Module) -> Iterator[None]:
    """Measure ``model`` without touching training: eval mode, no gradients, RNG states restored."""
    saved_rng, was_training = rng_state(), model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
        set_rng_state(saved_rng)


class Probe(Protocol):
    def measure(self, model: Any, tokenizer: Any, formatter: ChatFormatter) -> dict[str, float]: ...


@dataclass(frozen=True)
class ScheduledProbe:
    """``probe`` (None = off) measuring the ``role`` model every ``every`` steps (see the module docstring)."""

    probe: Probe | None
    every: int
    role: str  # "act" or "rehearse"

    def at(
        self, step: int, total_steps: int, models: Mapping[str, Any], tokenizer: Any, formatter: ChatFormatter
    ) -> dict[str, float]:
        """The probe's metrics after ``step`` updates when it is due, else {}."""
        if self.probe is None or not probe_due(step, self.every, total_steps):
            return {}
        return self.probe.measure(models.get(self.role, models.get("policy")), tokenizer, formatter)
