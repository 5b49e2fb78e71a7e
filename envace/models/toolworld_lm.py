"""``toolworld_lm``: the model organism — a small random-init Llama whose tokenizer is trained on the tool world.

The organism is the tool world's own language model: a ``LlamaForCausalLM`` of ~1-4M parameters with
a byte-level BPE tokenizer trained (HF ``tokenizers``) on the text the engine actually feeds it — the
rendered ACT prompts (role system prompt, task system prompt, tool schemas, user turn), the gold ACT
stream (tool calls, tool responses, answers, later user turns), the REHEARSE prompts and REHEARSE
targets — of generated TRAINING tasks only. Training tasks never contain the held-out domain, and the
corpus is checked for its tool names, so the tokenizer learns nothing about it.

Everything is a function of ``OrganismConfig``: the same config gives byte-identical tokenizer JSON
and weights (the corpus comes from the seeded task generator, BPE training is deterministic, the
weights from ``init_seed``). The corpus is built where the tool world and the prompt templating are
visible, in the stage ``envace.stages.organism`` (this package sits below both); ``build_organism``
turns config + corpus into (model, tokenizer); ``save_organism`` writes
them with ``save_pretrained`` plus ``organism.json`` (config, parameter count, vocabulary, SHA-256 of
the weights and of the tokenizer JSON). Every stage then loads the directory as ``model.kind=path``,
like any HF model: the engine, rollout, reward, loss, evaluation and rehearsal code are the ones
SmolLM2 goes through. Its chat template is ``CHATML_TOOL_TEMPLATE`` (tools and tool calls rendered).

``python -m envace.stages.organism`` (science/organism/dvc.yaml) builds it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from envace.core.prompts import (
    CHATML_TOOL_TEMPLATE,
)
from envace.models.common import finish_model_and_tokenizer

logger = logging.getLogger(__name__)

PAD, IM_START, IM_END = "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
MANIFEST = "organism.json"


@dataclass(frozen=True)
class OrganismConfig:
    """What determines the organism: the tokenizer corpus (data seed, training tasks) and the shape.

    ``n_val``/``n_test`` only shape generation (training draws never repeat a val/test instruction);
    their tasks are not in the corpus.
    """

    data_seed: int = 0
    n_corpus_tasks: int = 400
    n_val: int = 50
    n_test: int = 400
    held_out_domain: str | None = "todo"
    vocab_size: int = 2048
    min_frequency: int = 2
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 512
    max_positions: int = 4096
    tie_embeddings: bool = False
    init_seed: int = 0
    # every digit its own token (no merges across digits): ids, amounts and balances are then spelled from
    # ten shared tokens, so copying one is one learned skill instead of one per number seen in the corpus
    split_digits: bool = False

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"OrganismConfig: hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.n_corpus_tasks < 1 or self.vocab_size < 300:
            raise ValueError("OrganismConfig: n_corpus_tasks must be >= 1 and vocab_size >= 300 (bytes + merges)")

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> OrganismConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"OrganismConfig: unknown keys {unknown}; valid: {sorted(known)}")
        return cls(**values)


def train_tokenizer(corpus: list[str], config: OrganismConfig) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any UTF-8 text round-trips) with ChatML special tokens and the tool template."""
    backend = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if config.split_digits:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=IM_END, pad_token=PAD, clean_up_tokenization_spaces=False
    )
    tokenizer.chat_template = CHATML_TOOL_TEMPLATE
    tokenizer.name_or_path = "envace-toolworld-lm"
    return tokenizer


def llama_config(config: OrganismConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_organism(config: OrganismConfig, corpus: list[str]) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """(model, tokenizer), deterministic in ``config`` and ``corpus`` (the tokenizer's training text, built
    by ``envace.stages.organism.tokenizer_corpus``); the model in eval mode, float32."""
    tokenizer = train_tokenizer(corpus, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.init_seed)
        model = LlamaForCausalLM(llama_config(config, tokenizer))
    finish_model_and_tokenizer(model, tokenizer)
    model.eval()
    return model, tokenizer


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter's name, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def tokenizer_sha256(tokenizer: PreTrainedTokenizerFast) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


def describe(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, config: OrganismConfig) -> dict[str, Any]:
    return {
        "config": dataclasses.asdict(config),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "vocab_size": len(tokenizer),
        "weights_sha256": weights_sha256(model),
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
    }


def save_organism(config: OrganismConfig, corpus: list[str], directory: str | Path) -> dict[str, Any]:
    """Build and ``save_pretrained`` model + tokenizer into ``directory``; returns (and writes) the manifest."""
    directory = Path(directory)
    model, tokenizer = build_organism(config, corpus)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    manifest = describe(model, tokenizer, config)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    logger.info(
        "toolworld_lm: %d parameters, vocabulary %d, saved to %s",
        manifest["parameters"],
        manifest["vocab_size"],
        directory,
    )
    return manifest
