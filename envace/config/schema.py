"""The typed schema of ``conf/``: one dataclass per config group, ``Config`` holding them all.

``envace.config.load`` registers ``Config`` in Hydra's ConfigStore as ``envace_schema`` (the first entry of
``conf/config.yaml``'s defaults list), so every group file merges into a typed, struct-mode node. This module
holds the types; the values live in ``conf/`` only: a key that a conf file sets is ``MISSING`` here (a
composition that leaves it unset fails naming it), and the few defaults left mean "not set" (``None``: the
per-benchmark ``eval.suites.*`` overrides and the verl-only engine options, whose values are in
conf/engine/verl.yaml; an empty ``engine.overrides``). tests/unit/config/test_schema_defaults.py checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Dict, List, Optional, Union, get_type_hints

from omegaconf import MISSING

from envace.config.enums import (
    AlgoName,
    Baseline,
    Benchmark,
    DataSourceName,
    EngineName,
    EvalBaseline,
    JudgeName,
    ModelKind,
    ProfileName,
    Rehearser,
    ResponseSourceName,
    SFTBatching,
    SFTSchedule,
    TrackingBackend,
)
from envace.core.rehearsal import RehearsalMode, RehearsalScope, Summarizer
from envace.core.rollout_budget import RolloutBudget


@dataclass
class PathsConfig:
    """Every file/dir the stages read or write, relative to the working directory; the values are
    declared once, in conf/config.yaml (dvc.yaml interpolates them from params.yaml)."""

    raw_cm2: str = MISSING
    prepared: str = MISSING
    prompts: str = MISSING
    checkpoints: str = MISSING
    evaluation: str = MISSING
    rehearsal: str = MISSING
    metrics: str = MISSING
    plots: str = MISSING
    reports: str = MISSING


@dataclass
class ModelConfig:
    name: str = MISSING  # label used in tables and MLflow
    kind: ModelKind = MISSING
    path: Optional[str] = MISSING  # required when kind=path (local HF checkpoint dir)
    dtype: str = MISSING
    max_context_tokens: int = MISSING


@dataclass
class DataConfig:
    source: DataSourceName = MISSING
    n_train: int = MISSING  # tool world: tasks per split; CM2: cap on accepted rows (0 = all)
    n_val: int = MISSING
    n_test: int = MISSING
    held_out_domain: Optional[str] = MISSING  # tool world: a domain never trained on (null = none)
    val_fraction: float = MISSING  # CM2: share of uuids held out for validation
    checklist_variant: int = MISSING  # CM2: which checklist variant scores a row
    # seed of the data itself (tool-world generation, the CM2 val split, which test tasks an evaluation or a
    # probe samples); null = the run's `seed`. The science matrix fixes it so that every training seed is
    # scored on the same tasks (paired comparisons).
    seed: Optional[int] = MISSING


@dataclass
class AlgoConfig:
    name: AlgoName = MISSING
    baseline: Baseline = MISSING
    norm_by_std: bool = MISSING
    lr: float = MISSING
    clip_ratio: float = MISSING
    kl_coef: float = MISSING  # > 0 adds low_var_kl to a frozen reference
    grad_clip: float = MISSING
    ppo_epochs: int = MISSING
    mini_batches: int = MISSING  # optimiser steps per PPO epoch: each step's batch in this many mini-batches
    grpo_responses: ResponseSourceName = MISSING
    # LoRA (envace.engines.lora): values declared once, in conf/config.yaml; lora_rank 0 = full fine-tuning
    lora_rank: int = MISSING
    lora_alpha: int = MISSING  # absolute; the adapter scale is lora_alpha / lora_rank
    lora_target_modules: List[str] = MISSING
    lora_dropout: float = MISSING


@dataclass
class EndpointConfig:
    """An OpenAI-compatible endpoint (null fields: not used)."""

    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key_env: Optional[str] = None


@dataclass
class EngineConfig:
    name: EngineName = MISSING
    device: str = MISSING
    num_threads: Union[int, str] = MISSING  # an int >= 1, or auto (envace.runtime.precision.resolve_threads)
    # local engine speed/memory (envace.engines.local): auto | fp32 | bf16; shared-prompt packing; a token
    # budget per forward; gradient checkpointing auto | on | off; an opt-in log-prob health-check forward
    precision: str = MISSING
    fp32_linear: str = MISSING  # auto | torch | onednn: the GEMM library of float32 linear layers on a CPU
    share_prefix: bool = MISSING
    micro_batch_tokens: int = MISSING
    grad_checkpointing: str = MISSING
    logprob_check: bool = MISSING
    n_gpus_per_node: int = MISSING
    nnodes: int = MISSING
    # verl only (null = the value in conf/engine/verl.yaml; envace.engines.verl.config_builder.engine_option)
    rollout_name: Optional[str] = None
    tensor_parallel: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    max_token_len_per_gpu: Optional[int] = None
    agent_workers: Optional[int] = None
    chat_template: Optional[str] = None
    val_every: Optional[int] = None
    gpu_memory_gib: Optional[float] = None
    max_tool_response_length: Optional[int] = None
    tool_response_truncate_side: Optional[str] = None
    simulator: EndpointConfig = field(default_factory=EndpointConfig)  # grpo_responses=simulator served remotely
    overrides: List[str] = field(default_factory=list)  # raw verl overrides, appended last


_ROLLOUT_DOC = """The ``rollout`` section: the fields only the pipeline reads (K trajectories per instruction,
instructions per step, ``max_prompt_tokens``: template_prompts drops longer prompts and their rows from
training, and verl takes it as its prompt length), then the rollout budget's fields, their types taken from
``envace.core.rollout_budget`` (their values: conf/rollout/default.yaml). The local engine builds its
``RolloutConfig`` from it and verl its ``LoopSettings``; ``validate_config`` checks the budget's ranges by
building a ``RolloutBudget``."""
_BUDGET_TYPES = get_type_hints(RolloutBudget)
RolloutSection = make_dataclass(
    "RolloutSection",
    [
        ("samples_per_prompt", int, MISSING),
        ("prompts_per_step", int, MISSING),
        ("max_prompt_tokens", int, MISSING),
        *((f.name, _BUDGET_TYPES[f.name], MISSING) for f in fields(RolloutBudget)),
    ],
    namespace={"__module__": __name__, "__doc__": _ROLLOUT_DOC},
)


@dataclass
class TrainConfig:
    sft_epochs: int = MISSING  # supervised warm-up epochs on gold ACT/REHEARSE targets before GRPO
    sft_lr: float = MISSING
    sft_batch_streams: int = MISSING  # gold streams per SFT optimiser step
    sft_schedule: SFTSchedule = MISSING  # constant | cosine (warm-up then decay over the whole warm-up)
    sft_batching: SFTBatching = MISSING  # shuffled | prefix (streams with the same opening share a step)
    # a planted demonstrator flaw (engine=local): in `sft_flaw_rate` of the `sft_flaw_domains` tasks every
    # gold final reply becomes `sft_flaw_answer` (the SFT targets only; tasks and rewards are unchanged)
    sft_flaw_domains: list[str] = MISSING
    sft_flaw_rate: float = MISSING
    sft_flaw_answer: str = MISSING
    steps: int = MISSING  # GRPO steps; 0 = no RL (the exported model is the warm-started/base one)
    checkpoint_every: int = MISSING  # GRPO steps between checkpoints; 0 = only the final checkpoint
    keep_checkpoints: int = MISSING
    resume: bool = MISSING  # continue an interrupted run of the same config
    # world-model fidelity probe during training (engine=local, tool-world data): REHEARSE predicts the
    # real responses of the oracle's calls on `fidelity_tasks` val tasks, greedily; once before the first
    # GRPO update (reported as step 0), every `fidelity_every` steps and at the last step. 0 = off.
    fidelity_every: int = MISSING
    fidelity_tasks: int = MISSING
    # task-success probe during training (engine=local, tool-world data): the ACT model plays `val_tasks`
    # validation tasks (0 = the whole split) on the real environment with the evaluation's budgets (greedy);
    # at step 0, every `val_every` steps and at the last step (val/* metrics). 0 = off.
    val_every: int = MISSING
    val_tasks: int = MISSING


@dataclass
class JudgeConfig:
    """The training reward's judge (envace.judges); the values live in conf/judge/*.yaml."""

    name: JudgeName = MISSING
    base_url: Optional[str] = MISSING  # OpenAI-compatible endpoint for llm/composite (ends in /v1)
    model: Optional[str] = MISSING
    api_key_env: Optional[str] = MISSING  # the env var holding the key; null = an endpoint without authentication
    max_retries: int = MISSING  # retries per request (transport faults) and per verdict (malformed answers)
    timeout_s: float = MISSING  # per HTTP attempt
    backoff_s: float = MISSING  # retry n waits backoff_s * 2^n + jitter, at most max_backoff_s
    max_backoff_s: float = MISSING
    max_failure_rate: float = MISSING  # the run stops when more judge calls than this share of the window fail
    failure_window: int = MISSING  # judge calls (one checklist item at one step) in that sliding window
    # verifiable only: a made call that paired with no gold call earns this weight times the share of
    # arguments it got right against one gold call left unpaired, matched one to one, best first
    # (envace.envs.toolworld.reward); 0 = paired calls only, in [0, 1)
    argument_credit: float = MISSING


@dataclass
class SuiteConfig:
    """Per-benchmark overrides of ``eval.*`` (``eval.suites.<benchmark>``); null = the ``eval.*`` value.

    ``split`` uses the benchmark's own subset syntax: tool world ``test``/``val``; BFCL categories or
    groups (``simple_python,multi_turn_base``, ``non_live``, ``offline``); τ² ``telecom``, ``airline:test``,
    ``all``; FinMCP ``test``; VitaBench ``test`` or domains (``delivery,instore``). Quote comma lists on the
    command line: ``eval.suites.bfcl.split='simple_python,multiple'``. ``n_tasks`` counts per BFCL
    category / τ² domain. ``trials``: runs per task (τ² reports pass^k up to it). The other fields are
    options of single benchmarks, listed in ``envace.stages.suites``.
    """

    split: Optional[str] = None
    n_tasks: Optional[int] = None
    max_steps_per_turn: Optional[int] = None
    act_max_new_tokens: Optional[int] = None
    max_steps: Optional[int] = None
    trials: Optional[int] = None  # runs per task (pass^k over trials); null = 1
    gold_fidelity_tasks: Optional[int] = None  # null = eval.gold_fidelity_tasks
    mode: Optional[str] = None
    data_path: Optional[str] = None
    tools_path: Optional[str] = None
    unrecorded: Optional[str] = None
    user_base_url: Optional[str] = None
    user_model: Optional[str] = None
    user_api_key_env: Optional[str] = None
    judge_base_url: Optional[str] = None
    judge_model: Optional[str] = None
    judge_api_key_env: Optional[str] = None


@dataclass
class SuitesConfig:
    """One ``SuiteConfig`` per benchmark (a field per ``Benchmark`` member; a unit test checks)."""

    toolworld: SuiteConfig = field(default_factory=SuiteConfig)
    bfcl: SuiteConfig = field(default_factory=SuiteConfig)
    tau2: SuiteConfig = field(default_factory=SuiteConfig)
    finmcp: SuiteConfig = field(default_factory=SuiteConfig)
    vitabench: SuiteConfig = field(default_factory=SuiteConfig)


@dataclass
class EvalConfig:
    benchmarks: List[Benchmark] = MISSING
    benchmark: Benchmark = MISSING  # the one an `evaluate@<name>` stage runs
    split: str = MISSING
    n_tasks: int = MISSING  # 0 = the whole split
    suites: SuitesConfig = field(default_factory=SuitesConfig)  # per-benchmark overrides
    concurrency: int = MISSING  # episodes in flight (their generations are batched)
    compare_base: bool = MISSING
    baseline: EvalBaseline = MISSING  # the compared model: sft (RL's starting point) | base | auto
    fidelity: bool = MISSING  # REHEARSE on the real calls each evaluated model made
    gold_fidelity_tasks: int = (
        MISSING  # REHEARSE on the oracle's calls of this many tasks (0 = off; independent of fidelity)
    )
    temperature: float = MISSING
    max_steps_per_turn: int = MISSING
    act_max_new_tokens: int = MISSING
    rehearse_max_new_tokens: int = MISSING
    precision: str = MISSING  # auto | fp32 | bf16 for the local model backends (as engine.precision)
    prefix_cache_tokens: int = MISSING  # local backends: KV prefix cache across turns and rows (0 = off)


@dataclass
class RehearsalSweepConfig:
    benchmarks: List[Benchmark] = MISSING
    split: str = MISSING  # default split; eval.suites.<benchmark>.split overrides it per benchmark
    n_attempts_grid: List[int] = MISSING
    modes: List[RehearsalMode] = MISSING
    max_n_by_mode: Dict[str, int] = MISSING  # per-mode cap on N, e.g. {sequential: 2}
    rehearsers: List[Rehearser] = MISSING
    scope: RehearsalScope = MISSING  # task: rehearses future user turns (report: "sees future turns")
    summarizer: Summarizer = MISSING
    n_tasks: int = MISSING  # 0 = the whole split
    concurrency: int = MISSING
    max_steps_per_turn: int = MISSING
    act_max_new_tokens: int = MISSING
    rehearse_max_new_tokens: int = MISSING
    critique_max_new_tokens: int = MISSING
    summary_max_new_tokens: int = MISSING
    act_temperature: float = (
        MISSING  # > 0: parallel attempts are independent samples (0 with parallel N > 1 is refused)
    )
    rehearse_temperature: float = MISSING


@dataclass
class PrimaryFamilyConfig:
    """The science report's primary comparisons and their test (envace.reporting.science_family)."""

    comparisons: List[str] = MISSING  # difference names, checked against the matrix's (check_family)
    alpha: float = MISSING  # family-wise error rate of Holm's correction
    permutations: int = MISSING  # Monte Carlo sign patterns beyond exact enumeration
    permutation_seed: int = MISSING


@dataclass
class PositiveControlConfig:
    """The gate the science report checks on the matrix's own cells (envace.reporting.science.positive_control)."""

    variant: str = MISSING  # the cells that must learn (grpo: the real environment)
    min_gain_points: float = MISSING  # validation success gain, last probe minus step 0, in points
    min_seeds: int = MISSING  # seeds that must reach it


@dataclass
class ScienceConfig:
    """The science matrix (``make science``, envace.stages.science): one SFT warm-up shared by every cell,
    then variant x seed cells (GRPO steps from that checkpoint + evaluation on the same test tasks), a
    test-time sweep and the aggregation. The values live in conf/config.yaml (``science:``)."""

    dir: str = MISSING  # data of the matrix (prepared rows, the SFT checkpoint, cells' checkpoints)
    metrics: str = MISSING  # git-tracked per-part metrics and per-task outcomes
    json: str = MISSING  # the aggregate (git-tracked)
    reports: str = MISSING  # science.md, CSVs, plots
    # conf/algo option names (checked by envace.config.load.validate_config): a cell switches the whole algo
    # group to that file, so grpo_simulator (algo.name=grpo, frozen-simulator responses) is a variant too
    variants: List[str] = MISSING
    seeds: List[int] = MISSING
    data_seed: int = MISSING
    n_train: int = MISSING
    n_val: int = MISSING
    n_test: int = MISSING
    sft_epochs: int = MISSING
    steps: int = MISSING
    fidelity_every: int = MISSING
    val_every: int = MISSING  # each cell's train.val_every on all science.n_val validation tasks (0 = off)
    gold_fidelity_tasks: int = MISSING
    sft_threads: int = MISSING
    testtime_variant: str = MISSING  # one of variants
    # copy the testtime_variant cells' trained weights into their git-tracked metrics directory (a small model:
    # the test-time stages then run on a fresh clone without re-training the cell); off: they read the cell's
    # export under ``dir``, which only the machine that trained it has
    publish_policy: bool = MISSING
    # the files of the model the SFT part starts from, hashed as its dependency (model.path is only a string)
    model_files: str = MISSING
    testtime_n_attempts_grid: List[int] = MISSING
    testtime_modes: List[RehearsalMode] = MISSING
    testtime_max_n_by_mode: Dict[str, int] = MISSING
    testtime_n_tasks: int = MISSING
    testtime_other_seeds_n_attempts_grid: List[int] = MISSING
    bootstrap_resamples: int = MISSING
    primary: PrimaryFamilyConfig = field(default_factory=PrimaryFamilyConfig)
    positive_control: PositiveControlConfig = field(default_factory=PositiveControlConfig)


@dataclass
class TrackingConfig:
    backend: TrackingBackend = MISSING
    experiment: str = MISSING
    log_artifacts: bool = MISSING
    # envace.tracking.mlflow_logging: the final checkpoint as an MLflow transformers model when its weights total at
    # most model_max_bytes (else the manifest only, tagged model.skipped); rollout rows per RL step
    # (mlflow.log_table); episode traces per stage run; MLflow's system metrics (system/*) on the train run
    log_model: bool = MISSING
    model_max_bytes: int = MISSING
    rollout_rows_per_step: int = MISSING
    max_traces: int = MISSING
    system_metrics: bool = MISSING


@dataclass
class Config:
    profile: ProfileName = MISSING
    experiment_name: str = MISSING  # the paper-table row this run fills (conf/experiment/ files set it)
    seed: int = MISSING
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    train: TrainConfig = field(default_factory=TrainConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rehearsal: RehearsalSweepConfig = field(default_factory=RehearsalSweepConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    science: ScienceConfig = field(default_factory=ScienceConfig)


# config groups a user selects with `group=option` (the rest are plain keys)
GROUPS = (
    "profile",
    "model",
    "algo",
    "engine",
    "rollout",
    "judge",
    "eval",
    "rehearsal",
    "tracking",
    "data",
    "experiment",
)
