"""LoRA adapters on the local engine's models (peft), for ``LocalEngineConfig.lora``.

``add_lora(model, spec)`` wraps a HF causal LM with ``peft.get_peft_model``: peft swaps the targeted
linear layers for LoRA layers *in place* and freezes every other parameter, so the engine keeps
training ``unwrap(peft_model)`` — the same HF model object, now with adapters — and rollouts, the
trainer, SFT and the KV cache see an ordinary ``PreTrainedModel``; the optimiser takes the adapter
tensors only (it keeps parameters that require grad). The ``PeftModel`` wrapper is kept for export.

- Checkpoints store ``adapter_state(model)`` — the adapter tensors only; the base weights never train
  and are rebuilt from the model spec — and ``load_adapter_state`` checks the key set exactly.
- Export: ``merged_copy`` merges a *copy* (``merge_and_unload``) so the training state is untouched.
- The KL reference and grpo's frozen simulator stay frozen deep copies of the adapted model (the
  engine's ``_frozen``); peft's ``disable_adapter()`` would avoid the copy for the reference, but the
  trainer would then have to know about peft.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import peft
import torch
from peft.tuners.lora import LoraLayer

from envace.engines.lora import LoraSpec

logger = logging.getLogger(__name__)


def add_lora(model: torch.nn.Module, spec: LoraSpec) -> peft.PeftModel:
    """Inject ``spec``'s adapters into ``model`` (in place) and return peft's wrapper around it."""
    config = peft.LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=spec.dropout,
        bias="none",
        task_type=peft.TaskType.CAUSAL_LM,
    )
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(
            f"algo.lora_target_modules={list(spec.target_modules)}: {exc}; this model's linear layers are named {names}"
        ) from exc
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info(
        "LoRA r=%d alpha=%d on %s: %d trainable of %d parameters (%.2f%%)",
        spec.rank,
        spec.alpha,
        list(spec.target_modules),
        trainable,
        total,
        100 * trainable / max(total, 1),
    )
    return wrapped


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside a ``PeftModel`` (it carries the adapters); any other module unchanged."""
    return model.get_base_model() if isinstance(model, peft.PeftModel) else model


def adapter_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys of the LoRA adapter tensors in ``model`` (empty when it has none)."""
    keys: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, LoraLayer):
            for attr in module.adapter_layer_names:
                keys.update(f"{prefix}.{attr}.{k}" for k in getattr(module, attr).state_dict())
    return keys


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``model`` (detached CPU copies), keyed as in ``model.state_dict()``."""
    keys = adapter_keys(model)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in keys}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load ``adapter_state`` output into ``model``; the key sets must match exactly."""
    keys = adapter_keys(model)
    if set(state) != keys:
        raise ValueError(
            f"{source} holds {len(state)} tensors but the model has {len(keys)} LoRA adapter tensors "
            f"(e.g. missing {sorted(keys - set(state))[:2]}, unexpected {sorted(set(state) - keys)[:2]}): "
            "it was written with other algo.lora_* settings or without LoRA; use another output_dir "
            "or set train.resume=false"
        )
    model.load_state_dict(state, strict=False)


def merged_copy(model: peft.PeftModel) -> torch.nn.Module:
    """A plain HF model with the adapters merged into its weights; ``model`` itself is not modified."""
    return copy.deepcopy(model).merge_and_unload()


def lora_record(spec: LoraSpec | None) -> dict[str, Any] | None:
    """``spec`` as JSON-able values (checkpoints store it; resuming compares it); None for full fine-tuning."""
    if spec is None:
        return None
    return {
        "rank": spec.rank,
        "alpha": spec.alpha,
        "target_modules": list(spec.target_modules),
        "dropout": spec.dropout,
    }
