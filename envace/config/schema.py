"""The typed schema of ``conf/``: one dataclass per config group, ``Config`` holding them all.

``envace.config.load`` registers ``Config`` in Hydra's ConfigStore as ``envace_schema`` (the first entry of
``conf/config.yaml``'s defaults list), so every group file merges into a typed, struct-mode node. The
values themselves live in ``conf/``: a default here is the one the group's file sets (``MISSING`` where
conf/config.yaml declares the value), so reading a schema default never disagrees with a composed config.
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
    name: str = "tiny"  # label used in tables and MLflow
    kind: ModelKind = ModelKind.tiny
    path: Optional[str] = None  # required when kind=path (local HF checkpoint dir)
    dtype: str = "float32"
    max_context_tokens: int = 1024


@dataclass
class DataConfig:
    source: DataSourceName = DataSourceName.toolworld
    n_train: int = 8  # tool world: tasks per split; CM2: cap on accepted rows (0 = all)
    n_val: int = 4
    n_test: int = 4
    held_out_domain: Optional[str] = "todo"  # tool world: a domain never trained on (null = none)
    val_fraction: float = 0.05  # CM2: share of uuids held out for validation
    checklist_variant: int = 0  # CM2: which checklist variant scores a row
    # seed of the data itself (tool-world generation, the CM2 val split, which test tasks an evaluation or a
    # probe samples); null = the run's `seed`. The science matrix fixes it so that every training seed is
    # scored on the same tasks (paired comparisons).
    seed: Optional[int] = None


@dataclass
class AlgoConfig:
    name: AlgoName = AlgoName.envace
    baseline: Baseline = Baseline.output_mean
    norm_by_std: bool = False
    lr: float = 1e-5
    clip_ratio: float = 0.2
    kl_coef: float = 0.0  # > 0 adds low_var_kl to a frozen reference
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    grpo_responses: ResponseSourceName = ResponseSourceName.executor
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
    name: EngineName = EngineName.local
    device: str = "cpu"
    num_threads: Union[int, str] = "auto"  # an int >= 1, or auto (envace.runtime.precision.resolve_threads)
    # local engine speed/memory (envace.engines.local): auto | fp32 | bf16; shared-prompt packing; a token
    # budget per forward; gradient checkpointing auto | on | off; an opt-in log-prob health-check forward
    precision: str = "auto"
    fp32_linear: str = "auto"  # auto | torch | onednn: the GEMM library of float32 linear layers on a CPU
    share_prefix: bool = True
    micro_batch_tokens: int = 4096
    grad_checkpointing: str = "auto"
    logprob_check: bool = False
    n_gpus_per_node: int = 0
    nnodes: int = 1
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
training, and verl takes it as its prompt length), then the rollout budget's fields, declared once with their
defaults in ``envace.core.rollout_budget``. The local engine builds its ``RolloutConfig`` from it and verl its
``LoopSettings``; ``validate_config`` checks the budget's ranges by building a ``RolloutBudget``."""
_BUDGET_TYPES = get_type_hints(RolloutBudget)
RolloutSection = make_dataclass(
    "RolloutSection",
    [
        ("samples_per_prompt", int, 4),
        ("prompts_per_step", int, 2),
        ("max_prompt_tokens", int, 768),
        *((f.name, _BUDGET_TYPES[f.name], f.default) for f in fields(RolloutBudget)),
    ],
    namespace={"__module__": __name__, "__doc__": _ROLLOUT_DOC},
)


@dataclass
class TrainConfig:
    sft_epochs: int = 0  # supervised warm-up epochs on gold ACT/REHEARSE targets before GRPO
    sft_lr: float = 1e-4
    steps: int = 2  # GRPO steps; 0 = no RL (the exported model is the warm-started/base one)
    checkpoint_every: int = 1  # GRPO steps between checkpoints; 0 = only the final checkpoint
    keep_checkpoints: int = 2
    resume: bool = True  # continue an interrupted run of the same config
    # world-model fidelity probe during training (engine=local, tool-world data): REHEARSE predicts the
    # real responses of the oracle's calls on `fidelity_tasks` val tasks, greedily; once before the first
    # GRPO update (reported as step 0), every `fidelity_every` steps and at the last step. 0 = off.
    fidelity_every: int = 0
    fidelity_tasks: int = 2


@dataclass
class JudgeConfig:
    """The training reward's judge (envace.judges); the values live in conf/judge/*.yaml."""

    name: JudgeName = JudgeName.verifiable
    base_url: Optional[str] = None  # OpenAI-compatible endpoint for llm/composite (ends in /v1)
    model: Optional[str] = None
    api_key_env: Optional[str] = None  # the env var holding the key; null = an endpoint without authentication
    max_retries: int = 3  # retries per request (transport faults) and per verdict (malformed answers)
    timeout_s: float = 60.0  # per HTTP attempt
    backoff_s: float = 0.5  # retry n waits backoff_s * 2^n + jitter, at most max_backoff_s
    max_backoff_s: float = 8.0
    max_failure_rate: float = 0.2  # the run stops when more judge calls than this share of the window fail
    failure_window: int = 20  # judge calls (one checklist item at one step) in that sliding window


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
    benchmarks: List[Benchmark] = field(default_factory=lambda: [Benchmark.toolworld])
    benchmark: Benchmark = Benchmark.toolworld  # the one an `evaluate@<name>` stage runs
    split: str = "test"
    n_tasks: int = 0  # 0 = the whole split
    suites: SuitesConfig = field(default_factory=SuitesConfig)  # per-benchmark overrides
    concurrency: int = 8  # episodes in flight (their generations are batched)
    compare_base: bool = True
    baseline: EvalBaseline = EvalBaseline.auto  # the compared model: sft (RL's starting point) | base | auto
    fidelity: bool = True  # REHEARSE on the real calls each evaluated model made
    gold_fidelity_tasks: int = 0  # REHEARSE on the oracle's calls of this many tasks (0 = off; independent of fidelity)
    temperature: float = 0.0
    max_steps_per_turn: int = 4
    act_max_new_tokens: int = 64
    rehearse_max_new_tokens: int = 64
    precision: str = "auto"  # auto | fp32 | bf16 for the local model backends (as engine.precision)
    prefix_cache_tokens: int = 65536  # local backends: KV prefix cache across turns and rows (0 = off)


@dataclass
class RehearsalSweepConfig:
    benchmarks: List[Benchmark] = field(default_factory=lambda: [Benchmark.toolworld])
    split: str = "test"  # default split; eval.suites.<benchmark>.split overrides it per benchmark
    n_attempts_grid: List[int] = field(default_factory=lambda: [0, 1, 2, 3])
    modes: List[RehearsalMode] = field(default_factory=lambda: [RehearsalMode.parallel, RehearsalMode.sequential])
    max_n_by_mode: Dict[str, int] = field(default_factory=dict)  # per-mode cap on N, e.g. {sequential: 2}
    rehearsers: List[Rehearser] = field(default_factory=lambda: [Rehearser.trained, Rehearser.base, Rehearser.oracle])
    scope: RehearsalScope = RehearsalScope.turn  # task: rehearses future user turns (report: "sees future turns")
    summarizer: Summarizer = Summarizer.policy
    n_tasks: int = 2  # 0 = the whole split
    concurrency: int = 8
    max_steps_per_turn: int = 4
    act_max_new_tokens: int = 64
    rehearse_max_new_tokens: int = 64
    critique_max_new_tokens: int = 64
    summary_max_new_tokens: int = 64
    act_temperature: float = 0.7  # > 0: parallel attempts are independent samples (0 with parallel N > 1 is refused)
    rehearse_temperature: float = 0.0


@dataclass
class PrimaryFamilyConfig:
    """The science report's primary comparisons and their test (envace.reporting.science_family)."""

    comparisons: List[str] = MISSING  # difference names, checked against the matrix's (check_family)
    alpha: float = MISSING  # family-wise error rate of Holm's correction
    permutations: int = MISSING  # Monte Carlo sign patterns beyond exact enumeration
    permutation_seed: int = MISSING


@dataclass
class ScienceConfig:
    """The science matrix (``make science``, envace.stages.science): one SFT warm-up shared by every cell,
    then variant x seed cells (GRPO steps from that checkpoint + evaluation on the same test tasks), a
    test-time sweep and the aggregation. The values live in conf/config.yaml (``science:``)."""

    dir: str = MISSING  # data of the matrix (prepared rows, the SFT checkpoint, cells' checkpoints)
    metrics: str = MISSING  # git-tracked per-part metrics and per-task outcomes
    json: str = MISSING  # the aggregate (git-tracked)
    reports: str = MISSING  # science.md, CSVs, plots
    variants: List[AlgoName] = MISSING
    seeds: List[int] = MISSING
    data_seed: int = MISSING
    n_train: int = MISSING
    n_val: int = MISSING
    n_test: int = MISSING
    sft_epochs: int = MISSING
    steps: int = MISSING
    fidelity_every: int = MISSING
    gold_fidelity_tasks: int = MISSING
    sft_threads: int = MISSING
    testtime_variant: AlgoName = MISSING
    testtime_n_attempts_grid: List[int] = MISSING
    testtime_modes: List[RehearsalMode] = MISSING
    testtime_max_n_by_mode: Dict[str, int] = field(default_factory=dict)
    testtime_n_tasks: int = MISSING
    testtime_other_seeds_n_attempts_grid: List[int] = MISSING
    bootstrap_resamples: int = MISSING
    primary: PrimaryFamilyConfig = field(default_factory=PrimaryFamilyConfig)


@dataclass
class TrackingConfig:
    backend: TrackingBackend = TrackingBackend.mlflow
    experiment: str = "envace"
    log_artifacts: bool = True
    # envace.tracking.mlflow_logging: the final checkpoint as an MLflow transformers model when its weights total at
    # most model_max_bytes (else the manifest only, tagged model.skipped); rollout rows per RL step
    # (mlflow.log_table); episode traces per stage run; MLflow's system metrics (system/*) on the train run
    log_model: bool = True
    model_max_bytes: int = 1_000_000_000
    rollout_rows_per_step: int = 8
    max_traces: int = 20
    system_metrics: bool = True


@dataclass
class Config:
    profile: ProfileName = MISSING
    experiment_name: str = "default"  # set by experiment/ files: the paper-table row this run fills
    seed: int = 0
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
