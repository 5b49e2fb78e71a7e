"""Our config (the typed ``envace.config.schema.Config``) → ``main_ppo`` overrides.

``build_overrides`` returns Hydra overrides for ``python -m verl.trainer.main_ppo`` (verl's
``ppo_trainer.yaml``); ``compose_verl_config`` composes that config with them exactly as ``main_ppo``
does (used by tests and ``launch_verl_training(dry_run=True)`` to catch struct errors before a GPU
job starts). The mapping, section by section:

- algorithm: ``adv_estimator`` = ``envace_rolewise`` (role-wise variants) or ``envace_grpo`` (``grpo``),
  ``norm_adv_by_std_in_grpo`` = ``algo.norm_by_std`` (False: docs/method.md §7; verl's default is True),
  no KL in the reward.
- actor: lr, clip ratio, grad clip, PPO epochs, token-mean, no entropy bonus, KL as a loss term
  (``low_var_kl``) only when ``algo.kl_coef > 0``, AdamW without weight decay, constant LR. Dynamic
  (token-budget) micro-batches, and one optimizer update per PPO epoch: the mini-batch holds all rows
  of a step (``prompts_per_step × rows per trajectory``; two rows when REHEARSE trains).
- LoRA (``envace.engines.lora``): ``actor_rollout_ref.model.lora_rank`` = ``algo.lora_rank`` (0 = full
  fine-tuning, verl's default), and when it is > 0 ``lora_alpha`` and ``target_modules`` (verl's FSDP
  peft keys; verl then gives vLLM the adapter and uses the adapter-disabled actor as KL reference).
  verl's FSDP LoRA has no dropout: ``algo.lora_dropout`` > 0 is refused.
- rollout: K = ``rollout.n``, temperature = ACT temperature, per-stream length budget = ``max_model_len``,
  log-probs returned, our agent loop. verl recomputes the log-probs of every row at this one temperature,
  so a variant that trains REHEARSE rows must sample them at it too: ``rollout.rehearse_temperature`` ≠
  ``rollout.act_temperature`` is refused for such variants (``check_supported``; the local engine scores
  each role at its own temperature). Where REHEARSE rows are not trained (``grpo``, ``frozen_rehearse``)
  the REHEARSE temperature only sets how responses are sampled (the policy's or a frozen simulator's),
  and it may differ.
- data: the verl parquet written by ``launcher.prepare_verl_data``, ``prompt`` column, batch =
  ``prompts_per_step`` instructions.
- trainer: the ``envace`` trainer mode (v1), loggers console + mlflow, steps, nodes × GPUs,
  checkpoints under ``<output_dir>/checkpoints`` every ``train.checkpoint_every`` steps (and at the
  last step) with HF weights included, ``resume_mode=auto`` when ``train.resume``.
- ``+envace.*``: the agent-loop settings (``LoopSettings``); ``+ray_kwargs.ray_init.runtime_env.env_vars.*``:
  environment for every Ray worker (MLflow run, plugin module) — never secrets (verl logs its config).

The verl-only ``engine`` options (``rollout_name``, ``tensor_parallel``, ``gpu_memory_utilization``,
``max_token_len_per_gpu``, ``agent_workers``, ``chat_template``, ``val_every``, ``gpu_memory_gib`` (read by
``preflight``), ``max_tool_response_length``, ``tool_response_truncate_side``) are set by
``conf/engine/verl.yaml`` and null in the other engine files; null means the value in that file
(``engine_option``, its one reader), where
``max_token_len_per_gpu: null`` means 2 × ``rollout.max_stream_tokens``. ``engine.simulator``'s null
``base_url`` / ``model`` fall back to the env vars ``ENVACE_SIMULATOR_URL`` / ``ENVACE_SIMULATOR_MODEL``
(``check_supported`` refuses ``grpo`` before launch when its tool responses have no source: executor
responses on a data source without an executable environment, or a simulator without base_url and model);
``engine.overrides`` (raw overrides) are appended last. Extra overrides given later win (Hydra applies them
in order). Every public function takes the ``Config`` (a ``DictConfig`` or plain mapping of it is converted
once by ``envace.config.load.typed_config``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from envace.config.load import CONF_DIR, hydra_value, typed_config
from envace.config.schema import Config, EngineConfig
from envace.core.records import Role
from envace.core.rollout_budget import budget_values
from envace.engines.base import get_variant
from envace.engines.lora import lora_spec
from envace.engines.update import KL_TYPE, LOSS_AGG_MODE, WEIGHT_DECAY
from envace.engines.verl.advantages import VERL_GRPO_NAME, VERL_ROLEWISE_NAME
from envace.engines.verl.settings import AGENT_LOOP_NAME, SETTINGS_NODE, TRAINER_MODE, EndpointSettings, LoopSettings
from envace.envs.data_sources import DATA_SOURCES, data_source

logger = logging.getLogger(__name__)

VERL_ENGINE_FILE = CONF_DIR / "engine" / "verl.yaml"
ConfigLike = Config | DictConfig | Mapping[str, Any]


class VerlConfigError(ValueError):
    """Our config cannot run on verl; the message names the key and the fix."""


def _overrides(values: Mapping[str, Any], prefix: str = "", add: bool = False) -> list[str]:
    sign = "+" if add else ""
    return [f"{sign}{prefix}{key}={hydra_value(value)}" for key, value in values.items()]


@functools.lru_cache(maxsize=1)
def _verl_engine_file() -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(VERL_ENGINE_FILE), resolve=True)


def engine_option(engine: EngineConfig, name: str) -> Any:
    """``engine.<name>``; when it is null, its value in ``conf/engine/verl.yaml`` (the one place it is set)."""
    value = getattr(engine, name)
    return _verl_engine_file()[name] if value is None else value


def rows_per_trajectory(variant_name: str) -> int:
    """Batch rows one trajectory produces: the ACT row, plus the REHEARSE row when REHEARSE trains."""
    variant = get_variant(variant_name)
    return 1 + int(Role.REHEARSE in variant.trainable_roles and variant.rehearse_by_policy)


def check_supported(cfg: ConfigLike) -> None:
    """Refuse configurations the verl engine cannot run or would train wrongly, saying what to change."""
    cfg = typed_config(cfg)
    variant, rollout = get_variant(cfg.algo.name.value), cfg.rollout
    if variant.separate_models:
        raise VerlConfigError(
            f"algo.name={variant.name}: one model per role needs two actors; the verl engine "
            "trains one (shared weights). Run per_role with engine=local"
        )
    if rollout.max_stream_tokens <= rollout.max_prompt_tokens:
        raise VerlConfigError(
            f"rollout.max_stream_tokens={rollout.max_stream_tokens} must exceed "
            f"rollout.max_prompt_tokens={rollout.max_prompt_tokens} (room for responses)"
        )
    if cfg.train.steps < 1:
        raise VerlConfigError("train.steps must be >= 1 for engine=verl (0 = no RL: use engine=local)")
    if rollout.prompts_per_step % cfg.algo.mini_batches:
        raise VerlConfigError(
            f"algo.mini_batches={cfg.algo.mini_batches} does not divide rollout.prompts_per_step="
            f"{rollout.prompts_per_step}: verl splits a step's prompts into equal mini-batches; pick a divisor"
        )
    act_t, rehearse_t = rollout.act_temperature, rollout.rehearse_temperature
    if rows_per_trajectory(variant.name) == 2 and rehearse_t != act_t:
        raise VerlConfigError(
            f"rollout.rehearse_temperature={rehearse_t} differs from rollout.act_temperature={act_t}, but verl "
            f"scores every row at one temperature (the ACT one), so algo.name={variant.name}'s REHEARSE rows "
            f"would be trained on log-probs of a temperature they were not sampled at. Set "
            f"rollout.rehearse_temperature={act_t} (equal to rollout.act_temperature), or run engine=local, "
            "which scores each role at its own temperature"
        )
    _check_response_source(cfg)


_SIMULATOR_KEYS = (
    "engine.simulator.base_url (an OpenAI-compatible endpoint ending in /v1; or the env var ENVACE_SIMULATOR_URL), "
    "engine.simulator.model (or ENVACE_SIMULATOR_MODEL) and engine.simulator.api_key_env (the env var holding "
    "its key; null = no authentication)"
)


def _check_response_source(cfg: Config) -> None:
    """grpo's tool responses must have a source inside the Ray workers: a real executor rebuilt from the
    data source's rows, or a simulator endpoint. Refused here, before launch, instead of in every worker."""
    settings = loop_settings(cfg)
    if settings.responses == "executor" and data_source(settings.data_source).executor_from_row is None:
        executable = sorted(DATA_SOURCES.items(lambda s: s.executor_from_row is not None))
        raise VerlConfigError(
            f"algo.name=grpo with algo.grpo_responses=executor needs real tool executions, but data.source="
            f"{settings.data_source} has no executable environment (executable: {executable}). Set "
            f"algo.grpo_responses=simulator and the frozen simulator's endpoint: {_SIMULATOR_KEYS}"
        )
    if settings.responses == "simulator" and not (settings.simulator.base_url and settings.simulator.model):
        raise VerlConfigError(
            "algo.name=grpo with algo.grpo_responses=simulator takes its tool responses from a frozen simulator "
            f"endpoint, and none is set (base_url={settings.simulator.base_url!r}, model="
            f"{settings.simulator.model!r}). Set {_SIMULATOR_KEYS}"
        )


def loop_settings(cfg: ConfigLike) -> LoopSettings:
    """The agent-loop settings (``+envace.*``) implied by our config."""
    cfg = typed_config(cfg)
    algo, judge, sim = cfg.algo, cfg.judge, cfg.engine.simulator
    variant = get_variant(algo.name.value)
    return LoopSettings(
        **budget_values(cfg.rollout),
        variant=variant.name,
        responses="policy" if variant.rehearse_by_policy else algo.grpo_responses.value,
        data_source=cfg.data.source.value,
        reward=judge.name.value,
        argument_credit=judge.argument_credit,
        baseline=algo.baseline.value,
        chat_template=str(engine_option(cfg.engine, "chat_template")),
        max_tool_response_length=engine_option(cfg.engine, "max_tool_response_length"),
        tool_response_truncate_side=str(engine_option(cfg.engine, "tool_response_truncate_side")),
        seed=cfg.seed,
        judge=EndpointSettings(
            base_url=judge.base_url,
            model=judge.model,
            api_key_env=judge.api_key_env,
            max_retries=judge.max_retries,
            timeout_s=judge.timeout_s,
        ),
        simulator=EndpointSettings(
            base_url=sim.base_url or os.environ.get("ENVACE_SIMULATOR_URL"),
            model=sim.model or os.environ.get("ENVACE_SIMULATOR_MODEL"),
            api_key_env=sim.api_key_env,
        ),
    )


def _algorithm(cfg: Config) -> dict[str, Any]:
    rolewise = get_variant(cfg.algo.name.value).rolewise_baseline
    return {
        "algorithm.adv_estimator": VERL_ROLEWISE_NAME if rolewise else VERL_GRPO_NAME,
        "algorithm.norm_adv_by_std_in_grpo": cfg.algo.norm_by_std,
        "algorithm.use_kl_in_reward": False,
    }


def _actor(cfg: Config, model_path: str) -> dict[str, Any]:
    algo, rollout = cfg.algo, cfg.rollout
    max_tokens = engine_option(cfg.engine, "max_token_len_per_gpu") or 2 * rollout.max_stream_tokens
    prefix = "actor_rollout_ref.actor."
    return {
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.use_remove_padding": True,
        prefix + "optim.lr": algo.lr,
        prefix + "optim.weight_decay": WEIGHT_DECAY,
        prefix + "optim.clip_grad": algo.grad_clip,
        prefix + "grad_clip": algo.grad_clip,
        prefix + "optim.lr_scheduler_type": "constant",
        prefix + "optim.lr_warmup_steps": 0,
        prefix + "clip_ratio": algo.clip_ratio,
        prefix + "ppo_epochs": algo.ppo_epochs,
        prefix + "loss_agg_mode": LOSS_AGG_MODE,
        prefix + "entropy_coeff": 0.0,
        prefix + "policy_loss.loss_mode": "vanilla",
        prefix + "use_kl_loss": algo.kl_coef > 0,
        prefix + "kl_loss_coef": algo.kl_coef,
        prefix + "kl_loss_type": KL_TYPE,
        prefix + "use_dynamic_bsz": True,
        prefix + "ppo_max_token_len_per_gpu": int(max_tokens),
        prefix + "ppo_mini_batch_size": rollout.prompts_per_step
        // algo.mini_batches
        * rows_per_trajectory(algo.name.value),
        prefix + "data_loader_seed": cfg.seed,
        prefix + "checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        prefix + "checkpoint.load_contents": ["model", "optimizer", "extra"],  # resume from the sharded state
    }


def _lora(cfg: Config) -> dict[str, Any]:
    try:
        spec = lora_spec(cfg.algo)
    except ValueError as exc:
        raise VerlConfigError(str(exc)) from exc
    prefix = "actor_rollout_ref.model."
    if spec is None:
        return {prefix + "lora_rank": 0}
    if spec.dropout:
        raise VerlConfigError(
            f"algo.lora_dropout={spec.dropout}: verl's FSDP LoRA has no adapter dropout; set "
            "algo.lora_dropout=0.0 or use engine=local"
        )
    return {
        prefix + "lora_rank": spec.rank,
        prefix + "lora_alpha": spec.alpha,
        prefix + "target_modules": list(spec.target_modules),
    }


def _rollout(cfg: Config) -> dict[str, Any]:
    rollout, engine = cfg.rollout, cfg.engine
    stream, prompt = rollout.max_stream_tokens, rollout.max_prompt_tokens
    prefix = "actor_rollout_ref.rollout."
    return {
        prefix + "name": engine_option(engine, "rollout_name"),
        prefix + "n": rollout.samples_per_prompt,
        prefix + "temperature": rollout.act_temperature,
        prefix + "top_p": 1.0,
        prefix + "top_k": -1,
        prefix + "prompt_length": prompt,
        prefix + "response_length": stream - prompt,
        prefix + "max_model_len": stream,
        prefix + "calculate_log_probs": True,
        prefix + "tensor_model_parallel_size": int(engine_option(engine, "tensor_parallel")),
        prefix + "gpu_memory_utilization": float(engine_option(engine, "gpu_memory_utilization")),
        prefix + "seed": cfg.seed,
        prefix + "log_prob_use_dynamic_bsz": True,
        prefix + "agent.default_agent_loop": AGENT_LOOP_NAME,
        prefix + "agent.num_workers": int(engine_option(engine, "agent_workers")),
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
        "reward.num_workers": 1,  # rewards are computed inside the agent loop; verl's reward workers stay idle
    }


def _data(cfg: Config, train_files: Sequence[str], val_files: Sequence[str]) -> dict[str, Any]:
    rollout = cfg.rollout
    return {
        "data.train_files": [str(f) for f in train_files],
        "data.val_files": [str(f) for f in val_files],
        "data.prompt_key": "prompt",
        "data.train_batch_size": rollout.prompts_per_step,
        "data.max_prompt_length": rollout.max_prompt_tokens,
        "data.max_response_length": rollout.max_stream_tokens - rollout.max_prompt_tokens,
        "data.filter_overlong_prompts": False,
        "data.return_raw_chat": True,
        "data.shuffle": True,
        "data.seed": cfg.seed,
        "data.dataloader_num_workers": 0,
    }


def checkpoint_dir(output_dir: Path | str) -> Path:
    """Where verl writes ``global_step_N/`` checkpoints for a stage output directory."""
    return Path(output_dir).resolve() / "checkpoints"


def _trainer(cfg: Config, output_dir: Path | str, extra_loggers: Sequence[str]) -> dict[str, Any]:
    train, engine, tracking = cfg.train, cfg.engine, cfg.tracking
    steps, every = train.steps, train.checkpoint_every
    loggers = ["console", "mlflow"] if tracking.backend.value == "mlflow" else ["console"]
    loggers += [name for name in extra_loggers if name not in loggers]
    return {
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_MODE,
        "trainer.logger": loggers,
        "trainer.project_name": tracking.experiment,
        "trainer.experiment_name": f"{cfg.experiment_name}-{cfg.algo.name.value}",
        "trainer.nnodes": engine.nnodes,
        "trainer.n_gpus_per_node": engine.n_gpus_per_node,
        "trainer.device": "cuda",
        "trainer.total_training_steps": steps,
        "trainer.total_epochs": steps,
        "trainer.save_freq": every if every > 0 else steps,
        "trainer.resume_mode": "auto" if train.resume else "disable",
        "trainer.default_local_dir": str(checkpoint_dir(output_dir)),
        "trainer.max_actor_ckpt_to_keep": train.keep_checkpoints or None,
        "trainer.val_before_train": False,
        "trainer.test_freq": int(engine_option(engine, "val_every")),
    }


def build_overrides(
    cfg: ConfigLike,
    *,
    train_files: Sequence[str],
    val_files: Sequence[str],
    output_dir: Path | str,
    model_path: str,
    env_vars: Mapping[str, str] | None = None,
    extra_loggers: Sequence[str] = (),
) -> list[str]:
    """``main_ppo`` overrides for our config (module docstring). ``cfg``: the typed ``Config`` (a ``DictConfig``
    or plain mapping of it is converted once); ``extra_loggers`` adds verl backends (the launcher adds ``file``)."""
    cfg = typed_config(cfg)
    check_supported(cfg)
    values: dict[str, Any] = {}
    for section in (
        _algorithm(cfg),
        _actor(cfg, model_path),
        _lora(cfg),
        _rollout(cfg),
        _data(cfg, train_files, val_files),
        _trainer(cfg, output_dir, extra_loggers),
    ):
        values.update(section)
    overrides = _overrides(values)
    overrides += _overrides(loop_settings(cfg).to_flat(), prefix=f"{SETTINGS_NODE}.", add=True)
    overrides += _overrides(dict(env_vars or {}), prefix="ray_kwargs.ray_init.runtime_env.env_vars.", add=True)
    return overrides + [str(o) for o in cfg.engine.overrides]


def verl_config_dir() -> Path:
    """verl's packaged Hydra config directory (found without importing verl)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise VerlConfigError("verl is not installed; pip install -e '.[verl]' (CPU) or '.[gpu]' (GPU machines)")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str], config_name: str = "ppo_trainer") -> Any:
    """verl's config composed with ``overrides`` as ``main_ppo`` composes it (raises on struct errors)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(verl_config_dir()), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))
