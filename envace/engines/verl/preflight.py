"""Checks before a verl launch, on verl's composed config (``main_ppo``'s view, user overrides included).

What verl's workers would assert on, or run out of memory on, once Ray, the model and vLLM are up is refused
(``VerlConfigError``) or flagged (a logged warning) on the launching machine instead, with the numbers and the
key to change. ``check_supported`` (config_builder) refuses what our own config cannot express on verl, such as
grpo without a source for its tool responses; this module checks verl's side.

Errors:
- data parallelism: verl's actor worker asserts that an optimizer update's rows, ``ppo_mini_batch_size ×
  rollout.n``, split evenly over the data-parallel ranks, ``nnodes × n_gpus_per_node /
  ulysses_sequence_parallel_size``.
- micro-batch room: dynamic batching packs rows into micro-batches of at most ``ppo_max_token_len_per_gpu``
  tokens and asserts that each row fits one; a row may be ``max_model_len`` tokens long.

Warning: the actor's estimated peak memory during an update above ``WARN_FRACTION`` of one GPU's memory (the
visible GPU's, else ``engine.gpu_memory_gib``). ``estimate_actor_memory`` counts, for one micro-batch of
T = ``ppo_max_token_len_per_gpu`` tokens on one GPU, in bytes (V vocabulary, H hidden size, I MLP width,
L layers, P parameters, G = nnodes × n_gpus_per_node):

- logits: T·V·4: the bf16 logits and their gradient (verl's log-prob path with flash-attn's fused
  cross-entropy); without flash-attn verl's fallback also keeps a log-softmax copy: T·V·6.
- activations, with gradient checkpointing (our default): each layer's input, L·T·H·2, plus one layer
  recomputed in the backward pass with its gradients, 2·T·(6H + 4I)·2; without it, every layer's
  intermediates, L·T·(6H + 4I)·2.
- model states, sharded by FSDP over the G GPUs: fp32 weights, gradients and Adam's two moments, 16·P/G; with
  LoRA the frozen fp32 weights, 4·P/G (the adapter is negligible).

Left out, and what the margin is for: the CUDA context, NCCL buffers, allocator fragmentation, and vLLM's
memory if it does not sleep during the update. A rough early warning, not a guarantee either way.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envace.config.load import typed_config
from envace.engines.verl.config_builder import ConfigLike, VerlConfigError, compose_verl_config, engine_option

logger = logging.getLogger(__name__)

GIB = 2**30
WARN_FRACTION = 0.9


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that the memory estimate needs (from its ``config.json``)."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool = False

    @classmethod
    def from_model_dir(cls, path: Path | str) -> ModelShape | None:
        """The shape in ``<path>/config.json`` (a multimodal config's ``text_config``); None without the file."""
        file = Path(path) / "config.json"
        if not file.is_file():
            return None
        config = json.loads(file.read_text(encoding="utf-8"))
        config = config.get("text_config", config)
        heads = int(config["num_attention_heads"])
        return cls(
            vocab=int(config["vocab_size"]),
            hidden=int(config["hidden_size"]),
            layers=int(config["num_hidden_layers"]),
            intermediate=int(config["intermediate_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @property
    def parameters(self) -> int:
        """Embedding (and output head unless tied) + per layer: q, k, v, o projections and the gated MLP."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * h * q + 2 * h * kv + 3 * h * self.intermediate
        return self.vocab * h * (1 if self.tied_embeddings else 2) + self.layers * per_layer


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate's three parts, in bytes (module docstring)."""

    logits: int
    activations: int
    model_states: int

    @property
    def total(self) -> int:
        return self.logits + self.activations + self.model_states

    def describe(self) -> str:
        parts = (("logits", self.logits), ("activations", self.activations), ("model states", self.model_states))
        return " + ".join(f"{name} {value / GIB:.1f}" for name, value in parts) + f" = {self.total / GIB:.1f} GiB"


def estimate_actor_memory(
    tokens: int, shape: ModelShape, *, gpus: int, lora: bool, checkpointing: bool, fused_cross_entropy: bool
) -> MemoryEstimate:
    """The actor's peak memory on one GPU while it updates on a micro-batch of ``tokens`` (module docstring)."""
    logits = tokens * shape.vocab * (4 if fused_cross_entropy else 6)
    layer = tokens * (6 * shape.hidden + 4 * shape.intermediate) * 2
    if checkpointing:
        activations = shape.layers * tokens * shape.hidden * 2 + 2 * layer
    else:
        activations = shape.layers * layer
    model_states = shape.parameters * (4 if lora else 16) // max(gpus, 1)
    return MemoryEstimate(logits, activations, model_states)


def data_parallel_size(vc: Any) -> int:
    """verl's actor data-parallel size: all GPUs over the Ulysses sequence-parallel group size."""
    actor = vc.actor_rollout_ref.actor
    sp = int(
        actor.fsdp_config.get("ulysses_sequence_parallel_size") or actor.get("ulysses_sequence_parallel_size") or 1
    )
    return int(vc.trainer.nnodes) * int(vc.trainer.n_gpus_per_node) // sp


def check_data_parallel(vc: Any) -> None:
    """Refuse an update batch that verl's actor cannot split evenly over its data-parallel ranks."""
    dp = data_parallel_size(vc)
    mini, n = int(vc.actor_rollout_ref.actor.ppo_mini_batch_size), int(vc.actor_rollout_ref.rollout.n)
    if dp > 0 and (mini * n) % dp:
        raise VerlConfigError(
            f"an update's rows, ppo_mini_batch_size {mini} × rollout.n {n} = {mini * n}, do not split over the "
            f"{dp} data-parallel ranks (trainer.nnodes {vc.trainer.nnodes} × n_gpus_per_node "
            f"{vc.trainer.n_gpus_per_node}); verl's actor worker would assert. ppo_mini_batch_size is "
            "rollout.prompts_per_step × rows per trajectory (2 when REHEARSE trains): change "
            "rollout.prompts_per_step or rollout.samples_per_prompt, or engine.nnodes / engine.n_gpus_per_node, "
            f"so that {dp} divides the product"
        )


def check_micro_batch_room(vc: Any) -> None:
    """Refuse a micro-batch token budget smaller than the longest row verl may have to pack."""
    tokens = int(vc.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
    longest = int(vc.actor_rollout_ref.rollout.max_model_len or 0)
    if tokens < longest:
        raise VerlConfigError(
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens} (engine.max_token_len_per_gpu) is below "
            f"the longest row, max_model_len={longest} (rollout.max_stream_tokens): "
            "verl's dynamic batching asserts that every row fits one micro-batch. Set engine.max_token_len_per_gpu "
            f">= {longest} (null = 2 × rollout.max_stream_tokens)"
        )


def gpu_memory(cfg: ConfigLike) -> tuple[int, str]:
    """One GPU's memory in bytes and where the figure comes from: the visible GPU, else ``engine.gpu_memory_gib``."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return int(props.total_memory), f"the visible {props.name}"
    gib = float(engine_option(typed_config(cfg).engine, "gpu_memory_gib"))
    return int(gib * GIB), f"engine.gpu_memory_gib={gib:g}; no GPU visible here"


def memory_warning(vc: Any, gpu_bytes: int, gpu_source: str, *, fused_cross_entropy: bool) -> str | None:
    """The warning when the estimated peak exceeds ``WARN_FRACTION`` of ``gpu_bytes``; None when it fits or the
    model directory has no ``config.json`` to estimate from."""
    model = vc.actor_rollout_ref.model
    shape = ModelShape.from_model_dir(model.path)
    if shape is None:
        logger.info("actor memory not estimated: no config.json in %s", model.path)
        return None
    tokens = int(vc.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
    estimate = estimate_actor_memory(
        tokens,
        shape,
        gpus=int(vc.trainer.nnodes) * int(vc.trainer.n_gpus_per_node),
        lora=int(model.get("lora_rank") or 0) > 0,
        checkpointing=bool(model.enable_gradient_checkpointing),
        fused_cross_entropy=fused_cross_entropy,
    )
    if estimate.total <= WARN_FRACTION * gpu_bytes:
        return None
    return (
        f"the actor's update may run out of GPU memory: for {tokens} tokens per micro-batch "
        f"(engine.max_token_len_per_gpu) of a model with vocabulary {shape.vocab} and hidden size {shape.hidden}, "
        f"the estimate (envace/engines/verl/preflight.py) is {estimate.describe()}, over {WARN_FRACTION:.0%} of one "
        f"GPU's {gpu_bytes / GIB:.1f} GiB ({gpu_source}). Lower engine.max_token_len_per_gpu (at least "
        "rollout.max_stream_tokens), spread the model states over more GPUs (engine.nnodes, engine.n_gpus_per_node) "
        "or train LoRA (algo.lora_rank)"
    )


def preflight(cfg: ConfigLike, overrides: Sequence[str]) -> list[str]:
    """Compose verl's config from ``overrides``, raise on what verl would refuse, return (and log) the warnings."""
    try:
        vc = compose_verl_config(overrides)
    except VerlConfigError as exc:  # verl is not installed on this machine: nothing to check against
        logger.warning("pre-launch checks skipped: %s", exc)
        return []
    check_data_parallel(vc)
    check_micro_batch_room(vc)
    gpu_bytes, source = gpu_memory(cfg)
    fused = importlib.util.find_spec("flash_attn") is not None
    warnings = [w for w in (memory_warning(vc, gpu_bytes, source, fused_cross_entropy=fused),) if w]
    for warning in warnings:
        logger.warning("verl pre-launch check: %s", warning)
    return warnings
