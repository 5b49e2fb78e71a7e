"""The ``path`` model: any local Hugging Face model directory (never downloads)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from envace.models.common import ensure_tool_template, finish_model_and_tokenizer
from envace.models.spec import ModelAndTokenizer, ModelSpec, register_model_loader, resolve_dtype


@register_model_loader("path")
def load_local_path(spec: ModelSpec) -> ModelAndTokenizer:
    """Model and tokenizer from ``spec.path``; installs the ChatML tool template if its own ignores tools."""
    if not spec.path:
        raise ValueError(
            "ModelSpec(kind='path') needs path= a local HF model directory (config.json, weights, tokenizer)"
        )
    directory = Path(spec.path).expanduser()
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"ModelSpec.path={spec.path!r}: no config.json in {directory}; point it at a saved HF model directory"
        )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=resolve_dtype(spec.dtype), local_files_only=True)
    ensure_tool_template(tokenizer, str(directory))
    finish_model_and_tokenizer(model, tokenizer)
    return model, tokenizer
