"""Finishing steps shared by the loaders: pad token, end-of-turn ids, tool-capable chat template."""

from __future__ import annotations

import logging

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from envace.core.prompts import CHATML_TOOL_TEMPLATE, ChatFormatter, template_renders_tools

logger = logging.getLogger(__name__)


def ensure_tool_template(tokenizer: PreTrainedTokenizerBase, source: str) -> None:
    """Install ``CHATML_TOOL_TEMPLATE`` when the tokenizer's template does not render ``tools=``."""
    if not template_renders_tools(tokenizer):
        logger.info("%s: chat template ignores tools; installing the ChatML tool template", source)
        tokenizer.chat_template = CHATML_TOOL_TEMPLATE


def finish_model_and_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Give the tokenizer a pad token and make generation stop on every end-of-turn id."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    stop_ids = list(ChatFormatter(tokenizer, verify=False).end_of_turn_token_ids)
    for config in (model.config, model.generation_config):
        config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = stop_ids
