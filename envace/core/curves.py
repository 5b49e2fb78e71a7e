"""Per-step training curves from an engine's metrics history (what ``metrics/train.json`` stores as ``curves``).

Step convention: step s = after s GRPO updates. Step 0 is before the first update (after the SFT warm-up, if any):
it carries only the pre-training probes (fidelity, validation success); RL metrics (reward, advantages) of step s ≥
1 come from the rollout of step s (sampled before its update), and a probe at step s ≥ 1 measures the weights after
that update. Every curve has one value per step 0..N, ``None`` where the metric was not measured (always at step 0
for RL metrics; off-schedule steps for the probes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

CURVE_KEYS = (
    "reward/mean",
    "adv/act/mean",
    "adv/act/std",
    "adv/rehearse/mean",
    "adv/rehearse/std",
    "fidelity/exact_match",
    "fidelity/field_f1",
    "fidelity/error_agreement",
    "val/success",
    "val/score",
    "real_env/calls_total",
)


def _finite(value: Any) -> float | None:
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def training_curves(
    history: Sequence[Mapping[str, Any]], steps_done: int, keys: Sequence[str] = CURVE_KEYS
) -> dict[str, list[Any]]:
    """``{"step": [0..N], key: [value or None per step]}`` from history rows with a ``step`` (others ignored);
    N = max(``steps_done``, the largest step in ``history``)."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in history:
        if "step" in row:
            by_step.setdefault(int(row["step"]), {}).update(row)
    last = max([int(steps_done), *by_step])
    steps = list(range(last + 1))
    curves: dict[str, list[Any]] = {"step": steps}
    for key in keys:
        curves[key] = [_finite(by_step.get(s, {}).get(key)) for s in steps]
    return curves
