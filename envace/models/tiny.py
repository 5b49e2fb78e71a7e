"""The ``tiny`` model: a random-init 2-layer Llama with a small byte-level BPE tokenizer built locally.

The tokenizer is trained (deterministically, in milliseconds) on a small built-in corpus of chat
scaffolding, tool calls, tool responses and JSON, so prompts stay short while any UTF-8 text still
round-trips (byte-level alphabet). Special tokens: ``<|pad|>``, ``<|im_start|>``, ``<|im_end|>``
(end of turn = eos). The chat template is ``CHATML_TOOL_TEMPLATE``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import astuple

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from envace.core.prompts import CHATML_TOOL_TEMPLATE, DEFAULT_ROLE_PROMPTS
from envace.models.common import finish_model_and_tokenizer
from envace.models.spec import ModelAndTokenizer, ModelSpec, register_model_loader, resolve_dtype

logger = logging.getLogger(__name__)

PAD, IM_START, IM_END = "<|pad|>", "<|im_start|>", "<|im_end|>"
TINY_SPECIAL_TOKENS = (PAD, IM_START, IM_END)
TINY_VOCAB_SIZE = 1024  # upper bound; the corpus yields fewer merges
_TOOL_NAMES = (
    "get_weather",
    "search_flights",
    "book_hotel",
    "send_email",
    "list_files",
    "create_order",
    "cancel_order",
    "get_user",
    "update_record",
    "read_file",
)
_KEYS = (
    "id",
    "name",
    "city",
    "date",
    "status",
    "result",
    "error",
    "message",
    "items",
    "count",
    "price",
    "user_id",
    "order_id",
    "query",
    "path",
    "content",
    "success",
    "type",
    "description",
    "required",
)
_SENTENCES = (
    "You are a helpful assistant. Please help the user with the request.",
    "The user wants to know the weather in Paris tomorrow and then book a hotel.",
    "I will call the tool to look this up. Here is the result of the search.",
    "The order was cancelled successfully. Is there anything else I can do for you?",
    "Sorry, the file was not found. Please check the path and try again.",
)


def _tiny_corpus() -> list[str]:
    """Deterministic training text: scaffolding, role prompts, tool calls, responses and prose."""
    corpus = [CHATML_TOOL_TEMPLATE, *astuple(DEFAULT_ROLE_PROMPTS), *_SENTENCES]
    for i, name in enumerate(_TOOL_NAMES):
        keys = [_KEYS[(i + j) % len(_KEYS)] for j in range(3)]
        args = {k: (f"value {i}" if j % 2 == 0 else i * 7 + j) for j, k in enumerate(keys)}
        schema = {
            "name": name,
            "description": f"{name.replace('_', ' ')} for the user",
            "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": keys[:1]},
        }
        result = {"status": "ok" if i % 3 else "error", "result": args, "message": _SENTENCES[i % 5]}
        corpus += [
            f"<|im_start|>system\n{json.dumps(schema)}<|im_end|>\n",
            "<|im_start|>assistant\n<tool_call>\n" + json.dumps({"name": name, "arguments": args}),
            "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n",
            json.dumps(result, separators=(",", ":")) + "\n</tool_response><|im_end|>\n",
            f"<think>\nThe call {name} looks valid.\n</think>\n\n<execution_result>\n{json.dumps(result)}",
            "\n</execution_result>",
        ]
    return corpus * 2


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A deterministic byte-level BPE tokenizer (special tokens, ChatML tool template), built in ms."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_tiny_corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TOOL_TEMPLATE
    tokenizer.name_or_path = "envace-tiny"
    return tokenizer


def tiny_config(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    """Llama config of the given shape over the tokenizer's full vocabulary (incl. special tokens)."""
    if spec.tiny_hidden % spec.tiny_heads:
        raise ValueError(f"ModelSpec: tiny_hidden={spec.tiny_hidden} must be divisible by tiny_heads={spec.tiny_heads}")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.tiny_hidden,
        intermediate_size=2 * spec.tiny_hidden,
        num_hidden_layers=spec.tiny_layers,
        num_attention_heads=spec.tiny_heads,
        num_key_value_heads=spec.tiny_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


@register_model_loader("tiny")
def load_tiny(spec: ModelSpec) -> ModelAndTokenizer:
    """Random-init tiny Llama (weights depend only on ``spec.seed`` and shape) plus the tiny tokenizer."""
    tokenizer = build_tiny_tokenizer()
    config = tiny_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.to(resolve_dtype(spec.dtype))
    finish_model_and_tokenizer(model, tokenizer)
    return model, tokenizer
