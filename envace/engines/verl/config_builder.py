"""Our config (plain dict, as ``OmegaConf.to_container(cfg, resolve=True)`` gives it) → ``main_ppo`` overrides.

``build_overrides`` returns Hydra overrides for ``python -m verl.trainer.main_ppo`` (verl's
``ppo_trainer.yaml``); ``compose_verl_config`` composes that config with them exactly as ``main_ppo``
does (used by tests and ``launch_verl_training(dry_run=True)`` to catch struct errors before a GPU
job starts). The mapping, section by section:

- algorithm: ``adv_estimator`` = ``envace_rolewise`` (role-wise variants) or ``envace_grpo`` (``grpo``),
  ``norm_adv_by_std_in_grpo`` = ``algo.norm_by_std`` (False: the SPEC default; verl's default is True),
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

Optional ``engine`` keys for verl, read when present (defaults in ``VERL_ENGINE_DEFAULTS``):
``rollout_name``, ``tensor_parallel``, ``gpu_memory_utilization``, ``max_token_len_per_gpu``,
``agent_workers``, ``chat_template``, ``val_every``, ``simulator`` ({base_url, model, api_key_env}; else
the env vars ``ENVACE_SIMULATOR_URL`` / ``ENVACE_SIMULATOR_MODEL``), ``overrides`` (raw overrides
appended last). Extra overrides given later win (Hydra applies them in order).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from envace.core.records import Role
from envace.engines.base import get_variant
from envace.engines.lora import lora_spec
from envace.engines.verl.advantages import VERL_GRPO_NAME, VERL_ROLEWISE_NAME
from envace.engines.verl.settings import AGENT_LOOP_NAME, SETTINGS_NODE, TRAINER_MODE, EndpointSettings, LoopSettings

logger = logging.getLogger(__name__)

VERL_ENGINE_DEFAULTS: dict[str, Any] = {
    "rollout_name": "vllm",
    "tensor_parallel": 1,
    "gpu_memory_utilization": 0.6,
    "max_token_len_per_gpu": None,  # None: 2 × rollout.max_stream_tokens
    "agent_workers": 8,
    "chat_template": "auto",
    "val_every": -1,
    "simulator": None,
    "overrides": [],
}
_SAFE_STRING = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_RESERVED = {"null", "true", "false", "none", "nan", "inf"}


class VerlConfigError(ValueError):
    """Our config cannot run on verl; the message names the key and the fix."""


def plain(value: Any) -> Any:
    """Our config as plain Python: DictConfig / dataclass → dict, enums (``to_container`` keeps them) → values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if type(value).__module__.startswith("omegaconf"):
        return plain(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def hydra_value(value: Any) -> str:
    """A Python value written in Hydra's override grammar (strings quoted unless plainly safe)."""
    value = plain(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise VerlConfigError(f"cannot pass the non-finite number {value} to verl")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _SAFE_STRING.match(text) and text.lower() not in _RESERVED:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"


def _overrides(values: Mapping[str, Any], prefix: str = "", add: bool = False) -> list[str]:
    sign = "+" if add else ""
    return [f"{sign}{prefix}{key}={hydra_value(value)}" for key, value in values.items()]


def engine_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The verl-specific ``engine`` options with their defaults."""
    given = plain(cfg.get("engine") or {})
    return {key: default if given.get(key) is None else given[key] for key, default in VERL_ENGINE_DEFAULTS.items()}


def rows_per_trajectory(variant_name: str) -> int:
    """Batch rows one trajectory produces: the ACT row, plus the REHEARSE row when REHEARSE trains."""
    variant = get_variant(variant_name)
    return 1 + int(Role.REHEARSE in variant.trainable_roles and variant.rehearse_by_policy)


def check_supported(cfg: Mapping[str, Any]) -> None:
    """Refuse configurations the verl engine cannot run or would train wrongly, saying what to change."""
    variant = get_variant(plain(cfg["algo"]["name"]))
    if variant.separate_models:
        raise VerlConfigError(
            f"algo.name={variant.name}: one model per role needs two actors; the verl engine "
            "trains one (shared weights). Run per_role with engine=local"
        )
    rollout = cfg["rollout"]
    if int(rollout["max_stream_tokens"]) <= int(rollout["max_prompt_tokens"]):
        raise VerlConfigError(
            f"rollout.max_stream_tokens={rollout['max_stream_tokens']} must exceed "
            f"rollout.max_prompt_tokens={rollout['max_prompt_tokens']} (room for responses)"
        )
    if int(cfg["train"]["steps"]) < 1:
        raise VerlConfigError("train.steps must be >= 1 for engine=verl (0 = no RL: use engine=local)")
    act_t, rehearse_t = float(rollout["act_temperature"]), float(rollout["rehearse_temperature"])
    if rows_per_trajectory(variant.name) == 2 and rehearse_t != act_t:
        raise VerlConfigError(
            f"rollout.rehearse_temperature={rehearse_t} differs from rollout.act_temperature={act_t}, but verl "
            f"scores every row at one temperature (the ACT one), so algo.name={variant.name}'s REHEARSE rows "
            f"would be trained on log-probs of a temperature they were not sampled at. Set "
            f"rollout.rehearse_temperature={act_t} (equal to rollout.act_temperature), or run engine=local, "
            "which scores each role at its own temperature"
        )


def loop_settings(cfg: Mapping[str, Any]) -> LoopSettings:
    """The agent-loop settings (``+envace.*``) implied by our config."""
    algo, rollout, judge = plain(cfg["algo"]), plain(cfg["rollout"]), plain(cfg.get("judge") or {})
    variant = get_variant(algo["name"])
    sim = engine_options(cfg)["simulator"] or {
        "base_url": os.environ.get("ENVACE_SIMULATOR_URL"),
        "model": os.environ.get("ENVACE_SIMULATOR_MODEL"),
    }
    return LoopSettings(
        variant=variant.name,
        responses="policy" if variant.rehearse_by_policy else str(algo.get("grpo_responses", "executor")),
        data_source=str(plain(cfg["data"]["source"])),
        reward=str(judge.get("name", "verifiable")),
        baseline=str(algo.get("baseline", "output_mean")),
        act_temperature=float(rollout["act_temperature"]),
        rehearse_temperature=float(rollout["rehearse_temperature"]),
        max_steps_per_turn=int(rollout["max_steps_per_turn"]),
        max_act_tokens=int(rollout["max_act_tokens"]),
        max_rehearse_tokens=int(rollout["max_rehearse_tokens"]),
        max_stream_tokens=int(rollout["max_stream_tokens"]),
        rehearse_context_tokens=int(rollout.get("rehearse_context_tokens", 512)),
        enforce_required_items=bool(rollout.get("enforce_required_items", True)),
        chat_template=str(engine_options(cfg)["chat_template"]),
        seed=int(cfg.get("seed", 0)),
        judge=EndpointSettings(
            base_url=judge.get("base_url"),
            model=judge.get("model"),
            api_key_env=judge.get("api_key_env"),
            max_retries=int(judge.get("max_retries", 3)),
            timeout_s=float(judge.get("timeout_s", 60.0)),
        ),
        simulator=EndpointSettings(
            base_url=sim.get("base_url"), model=sim.get("model"), api_key_env=sim.get("api_key_env")
        ),
    )


def _algorithm(cfg: Mapping[str, Any]) -> dict[str, Any]:
    algo = plain(cfg["algo"])
    rolewise = get_variant(algo["name"]).rolewise_baseline
    return {
        "algorithm.adv_estimator": VERL_ROLEWISE_NAME if rolewise else VERL_GRPO_NAME,
        "algorithm.norm_adv_by_std_in_grpo": bool(algo.get("norm_by_std", False)),
        "algorithm.use_kl_in_reward": False,
    }


def _actor(cfg: Mapping[str, Any], model_path: str) -> dict[str, Any]:
    algo, rollout = plain(cfg["algo"]), plain(cfg["rollout"])
    max_tokens = engine_options(cfg)["max_token_len_per_gpu"] or 2 * int(rollout["max_stream_tokens"])
    kl = float(algo.get("kl_coef", 0.0))
    prefix = "actor_rollout_ref.actor."
    values = {
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.use_remove_padding": True,
        prefix + "optim.lr": float(algo["lr"]),
        prefix + "optim.weight_decay": 0.0,
        prefix + "optim.clip_grad": float(algo["grad_clip"]),
        prefix + "grad_clip": float(algo["grad_clip"]),
        prefix + "optim.lr_scheduler_type": "constant",
        prefix + "optim.lr_warmup_steps": 0,
        prefix + "clip_ratio": float(algo["clip_ratio"]),
        prefix + "ppo_epochs": int(algo["ppo_epochs"]),
        prefix + "loss_agg_mode": "token-mean",
        prefix + "entropy_coeff": 0.0,
        prefix + "policy_loss.loss_mode": "vanilla",
        prefix + "use_kl_loss": kl > 0,
        prefix + "kl_loss_coef": kl,
        prefix + "kl_loss_type": "low_var_kl",
        prefix + "use_dynamic_bsz": True,
        prefix + "ppo_max_token_len_per_gpu": int(max_tokens),
        prefix + "ppo_mini_batch_size": int(rollout["prompts_per_step"]) * rows_per_trajectory(algo["name"]),
        prefix + "data_loader_seed": int(cfg.get("seed", 0)),
        prefix + "checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"],
        prefix + "checkpoint.load_contents": ["model", "optimizer", "extra"],  # resume from the sharded state
    }
    return values


def _lora(cfg: Mapping[str, Any]) -> dict[str, Any]:
    try:
        spec = lora_spec(plain(cfg["algo"]))
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


def _rollout(cfg: Mapping[str, Any]) -> dict[str, Any]:
    rollout, options = plain(cfg["rollout"]), engine_options(cfg)
    stream, prompt = int(rollout["max_stream_tokens"]), int(rollout["max_prompt_tokens"])
    prefix = "actor_rollout_ref.rollout."
    return {
        prefix + "name": options["rollout_name"],
        prefix + "n": int(rollout["samples_per_prompt"]),
        prefix + "temperature": float(rollout["act_temperature"]),
        prefix + "top_p": 1.0,
        prefix + "top_k": -1,
        prefix + "prompt_length": prompt,
        prefix + "response_length": stream - prompt,
        prefix + "max_model_len": stream,
        prefix + "calculate_log_probs": True,
        prefix + "tensor_model_parallel_size": int(options["tensor_parallel"]),
        prefix + "gpu_memory_utilization": float(options["gpu_memory_utilization"]),
        prefix + "seed": int(cfg.get("seed", 0)),
        prefix + "log_prob_use_dynamic_bsz": True,
        prefix + "agent.default_agent_loop": AGENT_LOOP_NAME,
        prefix + "agent.num_workers": int(options["agent_workers"]),
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
        "reward.num_workers": 1,  # rewards are computed inside the agent loop; verl's reward workers stay idle
    }


def _data(cfg: Mapping[str, Any], train_files: Sequence[str], val_files: Sequence[str]) -> dict[str, Any]:
    rollout = plain(cfg["rollout"])
    return {
        "data.train_files": [str(f) for f in train_files],
        "data.val_files": [str(f) for f in val_files],
        "data.prompt_key": "prompt",
        "data.train_batch_size": int(rollout["prompts_per_step"]),
        "data.max_prompt_length": int(rollout["max_prompt_tokens"]),
        "data.max_response_length": int(rollout["max_stream_tokens"]) - int(rollout["max_prompt_tokens"]),
        "data.filter_overlong_prompts": False,
        "data.return_raw_chat": True,
        "data.shuffle": True,
        "data.seed": int(cfg.get("seed", 0)),
        "data.dataloader_num_workers": 0,
    }


def checkpoint_dir(output_dir: Path | str) -> Path:
    """Where verl writes ``global_step_N/`` checkpoints for a stage output directory."""
    return Path(output_dir).resolve() / "checkpoints"


def _trainer(cfg: Mapping[str, Any], output_dir: Path | str, extra_loggers: Sequence[str]) -> dict[str, Any]:
    train, engine, tracking = plain(cfg["train"]), plain(cfg["engine"]), plain(cfg.get("tracking") or {})
    steps, every = int(train["steps"]), int(train.get("checkpoint_every", 0))
    loggers = ["console", "mlflow"] if tracking.get("backend", "mlflow") == "mlflow" else ["console"]
    loggers += [name for name in extra_loggers if name not in loggers]
    return {
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_MODE,
        "trainer.logger": loggers,
        "trainer.project_name": str(tracking.get("experiment", "envace")),
        "trainer.experiment_name": f"{plain(cfg.get('experiment_name', 'default'))}-{plain(cfg['algo']['name'])}",
        "trainer.nnodes": int(engine.get("nnodes", 1)),
        "trainer.n_gpus_per_node": int(engine.get("n_gpus_per_node", 1)),
        "trainer.device": "cuda",
        "trainer.total_training_steps": steps,
        "trainer.total_epochs": steps,
        "trainer.save_freq": every if every > 0 else steps,
        "trainer.resume_mode": "auto" if train.get("resume", True) else "disable",
        "trainer.default_local_dir": str(checkpoint_dir(output_dir)),
        "trainer.max_actor_ckpt_to_keep": int(train.get("keep_checkpoints", 2)) or None,
        "trainer.val_before_train": False,
        "trainer.test_freq": int(engine_options(cfg)["val_every"]),
    }


def build_overrides(
    cfg: Mapping[str, Any],
    *,
    train_files: Sequence[str],
    val_files: Sequence[str],
    output_dir: Path | str,
    model_path: str,
    env_vars: Mapping[str, str] | None = None,
    extra_loggers: Sequence[str] = (),
) -> list[str]:
    """``main_ppo`` overrides for our config (module docstring). ``cfg``: a plain dict (enums allowed), a
    ``DictConfig`` or the ``Config`` dataclass; ``extra_loggers`` adds verl backends (the launcher adds ``file``)."""
    cfg = plain(cfg)
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
    return overrides + [str(o) for o in engine_options(cfg)["overrides"]]


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
