"""How the train stage builds its inputs from the config: episode specs per data source, the reward per judge,
the typed engine config per engine (``ENGINE_CONFIGS``), and the config hash its checkpoints are keyed by."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace.config.load import flatten, to_plain
from envace.config.schema import Config
from envace.core.rollout_budget import budget_values
from envace.engines.lora import lora_spec
from envace.engines.verl.engine import VerlEngineConfig
from envace.envs.toolworld.reward import verifiable_reward
from envace.judges import checklist_reward_fn, get_judge
from envace.stages.common import model_spec
from envace.stages.runner import Tracker
from envace.stages.suites import PROBE_SETS, VALIDATION_SETS
from envace.tracking.store import default_tracking_uri

CONFIG_KEYS = ("seed", "model", "data", "algo", "engine", "rollout", "train", "judge")
# keys added after runs existed, left out of the hash at these defaults so that a run begun before the key
# existed still finds its checkpoints when resumed with newer code
HASH_NEUTRAL_DEFAULTS = {"judge": {"argument_credit": 0.0}}


def config_hash(cfg: Config) -> str:
    """The hash a run's checkpoints are keyed by: every value of ``CONFIG_KEYS`` (``HASH_NEUTRAL_DEFAULTS``
    left out while they hold their default)."""
    plain = {key: flatten(getattr(cfg, key)) if key != "seed" else cfg.seed for key in CONFIG_KEYS}
    for key, defaults in HASH_NEUTRAL_DEFAULTS.items():
        for name, default in defaults.items():
            if plain[key].get(name) == default:
                del plain[key][name]
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _judge_reward(cfg: Config) -> Any:
    # every judge.* key but argument_credit (the verifiable reward's, checked to be 0 for the other judges)
    # is a judge setting (envace.judges.base.LLM_SETTING_NAMES)
    settings = to_plain(cfg.judge)
    settings.pop("argument_credit")
    return checklist_reward_fn(get_judge(settings.pop("name"), **settings))


# judge.name -> reward function (the built-in verifiable tool-world reward or a checklist judge)
REWARDS: dict[str, Callable[[Config], Any]] = {
    "verifiable": lambda cfg: verifiable_reward(float(cfg.judge.argument_credit)),
    "rule": _judge_reward,
    "llm": _judge_reward,
    "composite": _judge_reward,
}


def probe_every(cfg: Config) -> int:
    """``train.fidelity_every`` where the probe can run (engine local, data with a real executor), else 0."""
    every = int(cfg.train.fidelity_every)
    return every if to_plain(cfg.engine.name) == "local" and PROBE_SETS[to_plain(cfg.data.source)] else 0


def validation_every(cfg: Config) -> int:
    """``train.val_every`` where the task-success probe can run (engine local, data with a real executor),
    else 0."""
    every = int(cfg.train.val_every)
    return every if to_plain(cfg.engine.name) == "local" and VALIDATION_SETS[to_plain(cfg.data.source)] else 0


def local_engine_config(cfg: Config, output_dir: Path, tracker: Tracker) -> Any:
    # lazy: envace.engines.local loads torch, transformers and peft (seconds); a dead judge or simulator endpoint
    # fails the stage (preflight) before that
    from envace.engines.local.config import LocalEngineConfig, OptimConfig, RolloutConfig, SFTConfig

    r, a, t, e = cfg.rollout, cfg.algo, cfg.train, cfg.engine
    speed = {k: getattr(e, k) for k in ("share_prefix", "micro_batch_tokens", "grad_checkpointing", "logprob_check")}
    return LocalEngineConfig(
        model=model_spec(cfg),
        variant=to_plain(a.name),
        steps=int(t.steps),
        prompts_per_step=int(r.prompts_per_step),
        seed=int(cfg.seed),
        device=e.device,
        precision=str(e.precision),
        fp32_linear=str(e.fp32_linear),
        output_dir=str(output_dir),
        checkpoint_every=int(t.checkpoint_every),
        keep_checkpoints=int(t.keep_checkpoints),
        resume=bool(t.resume),
        grpo_responses=to_plain(a.grpo_responses),
        fidelity_every=probe_every(cfg),
        val_every=validation_every(cfg),
        lora=lora_spec(a),
        rollout=RolloutConfig(samples_per_prompt=r.samples_per_prompt, **budget_values(r)),
        optim=OptimConfig(
            lr=a.lr,
            clip_ratio=a.clip_ratio,
            kl_coef=a.kl_coef,
            grad_clip=a.grad_clip,
            ppo_epochs=a.ppo_epochs,
            mini_batches=int(a.mini_batches),
            baseline=to_plain(a.baseline),
            norm_by_std=a.norm_by_std,
            **speed,
        ),
        sft=SFTConfig(
            epochs=int(t.sft_epochs),
            lr=float(t.sft_lr),
            batch_streams=int(t.sft_batch_streams),
            schedule=to_plain(t.sft_schedule),
            batching=to_plain(t.sft_batching),
            flaw_domains=tuple(str(d) for d in t.sft_flaw_domains),
            flaw_rate=float(t.sft_flaw_rate),
            flaw_answer=str(t.sft_flaw_answer),
        ),
    )


def verl_engine_config(cfg: Config, output_dir: Path, tracker: Tracker) -> Any:
    """verl rebuilds everything from the whole config; its MLflow logging nests under this stage's run."""
    uri = default_tracking_uri() if tracker.run_id else None
    return VerlEngineConfig(cfg=cfg, output_dir=str(output_dir), tracking_uri=uri, parent_run_id=tracker.run_id)


# engine.name -> its engine's config, built from the typed Config (envace.config.load.typed_config, converted once
# by the train stage)
ENGINE_CONFIGS: dict[str, Callable[[Config, Path, Tracker], Any]] = {
    "local": local_engine_config,
    "verl": verl_engine_config,
}
