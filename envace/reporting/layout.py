"""What the report shows around each table: its title, its note, its number format and the metrics
files it is built from (for the stale mark, ``envace.reporting.provenance``)."""

from __future__ import annotations

from envace.reporting.reference import SOURCE

REFERENCE_TITLE = "Reference: the paper's numbers (not measured here)"
REFERENCE_NOTE = (
    f"Source of the `paper (Qwen3-8B, reference)` column: {SOURCE} Main table: the paper's Qwen3-8B "
    "(base row) and EnvACE-8B (trained row); ablation and scale: τ²; test-time: the N=2 rows (Overall "
    "= mean of τ² and BFCL multi-turn). `—` where the paper has no comparable row."
)


TITLES = {
    "main": "Main table (success % of tasks)",
    "gain": "Trained − baseline, paired on the same tasks (percentage points)",
    "benchmarks": "Each benchmark's own aggregates",
    "ablation": "Ablation: training variant (success %, same profile and model)",
    "scale": "Scale: model (success %, same profile and training variant)",
    "domains": "Per domain and held-out transfer",
    "fidelity": "World-model fidelity (REHEARSE vs real execution)",
    "testtime": "Test-time private rehearsal",
    "efficiency": "Sample efficiency: success vs real environment calls used in training",
    "training": "Training",
    "data": "Data",
}


EFFICIENCY_NOTE = (
    "Real environment calls a policy's training consumed: the SFT warm-up's gold responses (executed once on a "
    "fresh environment) plus every call its RL rollouts ran on the real environment (grpo with "
    "`algo.grpo_responses=executor`; envace and the frozen-role variants make none). The fidelity probe's "
    "measurement calls are not counted. Success is on the first benchmark, as in the main table."
)

FIDELITY_NOTE = (
    "Rates over the n (call, real response) pairs with Wilson 95% intervals; `field_f1` is a mean of "
    "per-pair F1s, given without interval (the per-pair values are in the evaluation outputs, not the "
    "metrics). `—` = no pair measured (n = 0)."
)


TESTTIME_NOTE = (
    "Scope `turn` rehearses user turn t from what is known at turn t. Rows with scope "
    "`task (sees future turns)` rehearsed every user turn before the first real call, so their "
    "rehearsal and the memory the committed run read saw requests revealed only later: not comparable "
    "with turn-scope rows. N=0 is the shared no-rehearsal baseline (scope `none`). success_rate is a "
    "fraction (0-1) with its Wilson 95% interval over the n tasks; costs as the sweep records them."
)


PER_ROLE_VERL_NOTE = (
    "No `per_role` row from this engine: per_role trains one model per role, and verl trains one actor, so "
    "the verl launcher refuses it before launch (`envace.engines.verl.config_builder.check_supported`). Only "
    "the local engine trains it (one process, CPU or one GPU); the science matrix (`make science`) has it at "
    "CPU scale."
)


SFT_NOTE = (
    "The SFT warm-up's REHEARSE targets are real tool responses: when the train stage builds its episodes "
    "it runs each gold call once on the real tool world (the analogue of CM2's recorded reference "
    "conversations). Only the warm-up sees them; the GRPO steps of rehearsing variants make no real call."
)


FRACTION_TABLES = ("fidelity", "testtime", "benchmarks")  # scores 0-1 (the others: success %)
EVALUATIONS = "evaluate_"  # metrics stems each table is built from (its stale mark)
TABLE_INPUTS = {
    "main": [EVALUATIONS],
    "gain": [EVALUATIONS],
    "benchmarks": [EVALUATIONS],
    "domains": [EVALUATIONS],
    "fidelity": [EVALUATIONS],
    "ablation": [EVALUATIONS, "train"],
    "scale": [EVALUATIONS, "train"],
    "testtime": ["rehearsal_sweep"],
    "efficiency": [EVALUATIONS, "train"],
    "training": ["train"],
    "data": ["prepare_data"],
}
