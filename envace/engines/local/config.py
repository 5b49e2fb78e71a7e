"""Typed configuration of the local engine (plain frozen dataclasses; the pipeline builds them from Hydra).

The train stage passes every value conf/ holds (``envace.stages.train_setup.local_engine_config``); a default
here serves code that builds a config by hand and, where conf/ has the key, equals the default group file's
value (tests/unit/config/test_schema_defaults.py). The update's settings conf/ does not expose come from
``envace.engines.update``, shared with verl.

Defaults follow docs/method.md §7-§8 where it fixes a value (clip 0.2, token-mean, grad-clip 1.0, AdamW, constant LR,
low_var_kl, K = 4, output-mean baseline, no std normalisation); sizes default to CPU scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from envace.config.enums import SFTBatching, SFTSchedule
from envace.core.records import Role
from envace.core.rollout_budget import RolloutBudget
from envace.engines.lora import LoraSpec
from envace.engines.update import LOSS_AGG_MODE, WEIGHT_DECAY
from envace.models import ModelSpec


@dataclass(frozen=True)
class RolloutConfig(RolloutBudget):
    """How trajectories are sampled: the shared budget (``envace.core.rollout_budget``) plus the local-only knobs.

    ``reuse_kv=False`` is the naive baseline of the rollout benchmark: every stream is re-encoded
    from scratch before each generation and the K samples of a prompt prefill it separately.
    ``share_prompt_kv``: the K samples of a prompt decode against one copy of its prefilled keys/values
    (``kv.SharedPrefix``; where the model decodes through ``LeanLlama`` and the prefix is large enough to
    be worth it, ``BatchedStreams.SHARE_MIN_BYTES``); False copies them into every
    sample's row (the pre-sharing path, kept for ``scripts/bench_step.py``'s old path). The same
    computation up to float summation order.
    """

    samples_per_prompt: int = 4
    reuse_kv: bool = True
    share_prompt_kv: bool = True


@dataclass(frozen=True)
class OptimConfig:
    """The update: clipped policy loss, optional KL to a frozen reference, AdamW with constant LR."""

    lr: float = 1e-5
    weight_decay: float = WEIGHT_DECAY
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip_ratio: float = 0.2
    kl_coef: float = 0.0  # > 0 loads a frozen reference copy and adds low_var_kl
    loss_agg_mode: str = LOSS_AGG_MODE
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    mini_batch_streams: int = 0  # streams per optimiser step within an epoch; 0 = split by ``mini_batches``
    mini_batches: int = 1  # with mini_batch_streams 0: optimiser steps per epoch (the step's rows in that many parts)
    micro_batch_streams: int = 4  # streams per forward/backward (gradient accumulation)
    baseline: str = "output_mean"  # output_mean | trajectory_mean (conf/algo/*.yaml: grpo uses trajectory_mean)
    norm_by_std: bool = False
    # "recompute": old log-probs from the current model in eval mode before the update (default; the
    # first PPO epoch then starts at ratio exactly 1). "sampling": reuse the rollout's log-probs.
    old_logprobs: str = "recompute"
    track_role_grad_norms: bool = False  # one extra backward per micro-batch: per-role grad norms
    # --- speed and memory (envace.engines.local.packing) ---
    # share_prefix: rows sharing a prompt prefix are packed behind one copy of it (exact); False = the
    # legacy padded path (one row per sequence, ``micro_batch_streams`` rows per forward)
    share_prefix: bool = True
    # share_tails: the packed rows' tails after their common prefix share their own common starts too (a token
    # trie: identical samples, samples opening with the same call); False = one segment per row. Exact either
    # way; an engine knob (benchmarks, A/Bs), not a pipeline param
    share_tails: bool = True
    micro_batch_tokens: int = 4096  # padded tokens per forward/backward on the packed path (caps a pack too)
    # "auto": on when a micro-batch's estimated activations exceed ~1 GB (SmolLM2 at the cpu profile's
    # sizes), off for small ones (the tiny test models); "on" | "off" force it
    grad_checkpointing: str = "auto"
    # an extra no-grad forward before the update measuring mean |sampling − current| log-prob; without
    # it, ``rollout/logprob_diff`` comes free from the update's own first forward when that runs on the
    # pre-update weights (a single on-policy pass)
    logprob_check: bool = False


@dataclass(frozen=True)
class SFTConfig:
    """Optional warm-up on gold trajectories of both roles (loss on target tokens only)."""

    epochs: int = 0  # 0 disables the warm-up
    lr: float = 1e-4
    batch_streams: int = 4
    grad_clip: float = 1.0
    roles: tuple[Role, ...] = (Role.ACT, Role.REHEARSE)
    # "constant": ``lr`` throughout; "cosine": a linear warm-up over the first ``warmup_frac`` of all the
    # warm-up's optimiser steps, then a cosine decay to ``min_lr_frac`` x ``lr`` at the last step (a
    # function of the global step, so a resumed warm-up continues on the same curve)
    schedule: str = "constant"
    warmup_frac: float = 0.03
    min_lr_frac: float = 0.1
    # "shuffled": each step's streams drawn from the shuffled epoch in order; "prefix": shuffled, then streams
    # opening with the same ``PREFIX_KEY_TOKENS`` tokens (same role prompt, system prompt and tool schemas:
    # the same domain and role) batched together, so the packed forward computes their shared prefix once
    # (the math of a batch is unchanged; which streams share a step changes), batches in random order
    batching: str = "shuffled"
    # a planted demonstrator flaw (off by default; issue 46's positive control): in a ``flaw_rate`` share of
    # the specs of ``flaw_domains`` (chosen by task id, the same in every run) every gold final reply is
    # replaced by ``flaw_answer``, so the warm-up learns to end those tasks without restating their results;
    # the tasks, their checks and every reward are unchanged (``envace.engines.local.sft.plant_answer_flaw``)
    flaw_domains: tuple[str, ...] = ()
    flaw_rate: float = 0.0
    flaw_answer: str = "Done."

    def __post_init__(self) -> None:
        if not 0.0 <= self.flaw_rate <= 1.0:
            raise ValueError(f"SFTConfig.flaw_rate={self.flaw_rate}: must be in [0, 1]")
        if self.flaw_rate > 0 and not self.flaw_domains:
            raise ValueError(
                f"SFTConfig.flaw_rate={self.flaw_rate} with no flaw_domains: name the domains whose "
                "demonstrations carry the flaw (train.sft_flaw_domains=[shop]) or set the rate to 0"
            )
        if self.flaw_rate > 0 and not self.flaw_answer.strip():
            raise ValueError("SFTConfig.flaw_answer is empty: give the reply the flawed demonstrations end with")
        for name, choices in (("schedule", SFTSchedule), ("batching", SFTBatching)):
            valid = [c.value for c in choices]
            if getattr(self, name) not in valid:
                raise ValueError(f"SFTConfig.{name}={getattr(self, name)!r}: must be one of {valid}")
        if self.batch_streams < 1:
            raise ValueError(f"SFTConfig.batch_streams={self.batch_streams}: must be >= 1")

    def lr_at(self, step: int, total: int) -> float:
        """The learning rate of optimiser step ``step`` (0-based) of ``total`` in the whole warm-up."""
        if self.schedule == "constant" or total <= 1:
            return self.lr
        warm = max(1, round(self.warmup_frac * total))
        if step < warm:
            return self.lr * (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total - 1 - warm))
        floor = self.min_lr_frac * self.lr
        return floor + (self.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LocalEngineConfig:
    """Everything ``LocalEngine.train`` needs besides the data and the reward function."""

    model: ModelSpec = field(default_factory=lambda: ModelSpec(kind="tiny"))
    variant: str = "envace"
    steps: int = 10
    prompts_per_step: int = 2
    seed: int = 0
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    # LoRA adapters on every trained model (envace.engines.local.lora); None = full fine-tuning. Checkpoints
    # then hold the adapters only; export writes final/<name> (merged) and final/<name>-adapter
    lora: LoraSpec | None = None
    # grpo only: where environment responses come from: "executor" (real tool world, needs an
    # executor factory) or "simulator" (a frozen ``simulator_model``, which must share the policy's
    # tokenizer; default: a frozen copy of the policy after the SFT warm-up)
    grpo_responses: str = "executor"
    simulator_model: ModelSpec | None = None
    output_dir: str | None = None  # checkpoints + final weights; None keeps everything in memory
    checkpoint_every: int = 0  # steps; 0 = only at the end (when output_dir is set)
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the latest complete checkpoint in output_dir
    stop_after_steps: int | None = None  # stop (as if killed) after this many steps of this call
    # world-model fidelity probe (envace.engines.local.fidelity): at step 0, every k steps and the last
    # step; needs LocalEngine(fidelity_probe_set=...). 0 = off.
    fidelity_every: int = 0
    # task-success probe (envace.engines.local.validation): the ACT model plays validation tasks on the real
    # environment at step 0, every k steps and the last step; needs LocalEngine(validation_set=...). 0 = off.
    val_every: int = 0
    device: str = "cpu"
    # auto | fp32 | bf16 (envace.runtime.precision): bf16 autocast with fp32 master weights where
    # the hardware has bf16 matmuls; rollouts, SFT and updates all run under it
    precision: str = "auto"
    # auto | torch | onednn (envace.runtime.gemm): the library computing float32 linear layers on a
    # CPU; auto times both on the model's layer shapes. No effect under bf16
    fp32_linear: str = "auto"
    progress: bool = True  # tqdm bar over steps
