"""The paper's numbers (docs/method.md §14, from the authors' project page), for the report's
reference column only: never measured here, never written into our columns.

Each lookup returns the text of one reference cell, or None where the paper reports no comparable row.
"""

from __future__ import annotations

REFERENCE_COLUMN = "paper (Qwen3-8B, reference)"
SOURCE = (
    "EnvACE (arXiv 2608.06197), numbers from the authors' project page (docs/method.md §14); "
    "Qwen3-8B trained on CM2 with verl on 16 GPUs. Not measured by this pipeline."
)

# main table: BFCL V4 | τ² | VitaBench | Overall (mean of the three)
_MAIN = {"base": ("Qwen3-8B", 44.04, 30.0, 11.4, 28.48), "envace": ("EnvACE-8B", 46.04, 36.7, 16.0, 32.91)}
# ablation, τ² avg (8B)
_ABLATION_TAU2 = {"grpo": 31.2, "per_role": 35.5, "envace": 36.7}
# scale, τ² avg of EnvACE per model size
_SCALE_TAU2 = {"qwen3-1.7b": 15.3, "qwen3-8b": 36.7}
# test-time N=2: (mode, rehearser) → τ², BFCL multi-turn, Overall (their mean), Δ
_TESTTIME = {
    ("none", "none"): (31.4, 41.9, 36.7, None),
    ("parallel", "base"): (32.2, 41.4, 36.8, 0.1),
    ("parallel", "trained"): (38.0, 43.9, 40.9, 4.2),
    ("sequential", "base"): (31.0, 38.8, 34.9, -1.8),
    ("sequential", "trained"): (34.8, 42.3, 38.5, 2.4),
}


def main_reference(contender: str, variant: str) -> str | None:
    """The paper's row for our base model (Qwen3-8B) or our trained policy (EnvACE-8B, variant envace)."""
    key = "base" if contender == "base" else variant
    if key not in _MAIN:
        return None
    name, bfcl, tau2, vita, overall = _MAIN[key]
    return f"{name}: Overall {overall} (BFCL {bfcl}, τ² {tau2}, Vita {vita})"


def ablation_reference(variant: str) -> str | None:
    value = _ABLATION_TAU2.get(variant)
    return None if value is None else f"τ² {value}"


def scale_reference(model: str, variant: str) -> str | None:
    value = _SCALE_TAU2.get(str(model).lower()) if variant == "envace" else None
    return None if value is None else f"τ² {value}"


def testtime_reference(n_attempts: int, mode: str, rehearser: str) -> str | None:
    """The paper's N=2 rows (and the shared no-rehearsal baseline, N=0); rehearser ``trained`` = EnvACE."""
    if not (n_attempts == 2 or (n_attempts == 0 and mode == "none")):
        return None
    row = _TESTTIME.get((mode, rehearser))
    if row is None:
        return None
    tau2, bfcl_mt, overall, gain = row
    delta = "" if gain is None else f", Δ {gain:+.1f}"
    return (
        f"N=2: Overall {overall}{delta} (τ² {tau2}, BFCL multi-turn {bfcl_mt})"
        if n_attempts
        else f"no rehearsal: Overall {overall} (τ² {tau2}, BFCL multi-turn {bfcl_mt})"
    )
