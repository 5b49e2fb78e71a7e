"""The report's paired comparison: the trained policy − the evaluation's baseline (``eval.baseline``: the
SFT warm-up's weights RL started from, or the untrained model), per benchmark and subset, from the
``gain_vs_base`` block ``evaluate`` writes (a paired percentile bootstrap over the same tasks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from envace.reporting.tables import Score

BASELINE_NAMES = {"sft": "SFT'd start", "base": "base"}  # base: the untrained model
SUBSET_NAMES = {"all": "all tasks", "in_domain": "in-domain", "held_out_domain": "held-out domain"}

GAIN_NOTE = (
    "Trained policy − baseline, success in percentage points, paired on the same tasks: the difference of "
    "the two success rates with its 95% percentile bootstrap interval (2000 resamples of the tasks, the "
    "same draw for both models); n = tasks. `verdict`: `A > B` or `A < B` when the interval excludes 0, "
    "`cannot tell` when it covers 0."
)


def baseline_name(m: Mapping[str, Any]) -> str:
    """What the evaluations compared the policy with (``SFT'd start`` / ``base``)."""
    kinds = {doc.get("baseline") for key, doc in m.items() if key.startswith("evaluate_") and isinstance(doc, dict)}
    kinds.discard(None)
    return " / ".join(BASELINE_NAMES.get(k, k) for k in sorted(kinds)) or BASELINE_NAMES["base"]


def gain_table(m: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (benchmark, subset) whose evaluation compared the policy with a baseline."""
    rows = []
    for key in sorted(k for k in m if k.startswith("evaluate_")):
        doc = m[key]
        for subset, d in (doc.get("gain_vs_base") or {}).items():
            ci = d.get("ci95")
            score = Score(100 * d["diff"], int(d["n_tasks"]), (100 * ci[0], 100 * ci[1]) if ci else None)
            rows.append(
                {
                    "benchmark": doc.get("benchmark", key.removeprefix("evaluate_")),
                    "baseline": BASELINE_NAMES.get(doc.get("baseline"), doc.get("baseline")),
                    "tasks": SUBSET_NAMES.get(subset, subset),
                    **score.columns("gain_pp"),
                    "verdict": d.get("verdict"),
                }
            )
    return pd.DataFrame(rows)
