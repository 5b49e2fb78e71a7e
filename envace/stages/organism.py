"""Stage ``organism``: build the model organism (``envace.models.toolworld_lm``) and ``save_pretrained`` it.

Reads the build settings from ``science/organism/organism.yaml`` (``organism:`` = ``OrganismConfig``
fields, ``out:`` = the model directory); trailing ``key=value`` arguments override single fields
(``hidden=96``), ``--out`` the directory. Writes the HF model + tokenizer and ``organism.json`` (config,
parameter count, vocabulary, weights and tokenizer SHA-256). Deterministic: the same settings rebuild
byte-identical weights and tokenizer.

    python -m envace.stages.organism [--params science/organism/organism.yaml] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerFast

from envace.core.prompts import (
    CHATML_TOOL_TEMPLATE,
    DEFAULT_ROLE_PROMPTS,
    act_messages,
    act_observation_messages,
    sft_act_target,
    sft_rehearse_target,
)
from envace.core.wire import as_result_object
from envace.envs.toolworld import DOMAINS, generate_tasks, get_domain, to_cm2_row
from envace.models.tiny import build_tiny_tokenizer
from envace.models.toolworld_lm import OrganismConfig, save_organism
from envace.stages.template_prompts import row_prompts

PARAMS = "science/organism/organism.yaml"


# The tokenizer's corpus: the text the engine shows the model for generated TRAINING tasks. It lives in the
# stage, not in envace.models, because it needs the tool world and the prompt templating (higher floors).
def _renderer() -> PreTrainedTokenizerFast:
    """A tokenizer used only to render chat text (the template is text-level: its vocabulary is irrelevant)."""

    return build_tiny_tokenizer()


def corpus_tasks(config: OrganismConfig) -> list[Any]:
    """The generated TRAINING tasks the tokenizer learns from (never val/test, never the held-out domain)."""

    splits = generate_tasks(
        seed=config.data_seed,
        n_train=config.n_corpus_tasks,
        n_val=config.n_val,
        n_test=config.n_test,
        held_out_domain=config.held_out_domain,
    )
    return list(splits["train"])


def task_texts(task: Any, renderer: Any) -> Iterator[str]:
    """The texts the engine shows the model for one task: the full gold ACT stream and every REHEARSE prompt
    with its target."""

    tools = [dict(t) for t in task.tools]
    row = to_cm2_row(task, include_state=True)
    rehearse_targets = []
    messages = act_messages(DEFAULT_ROLE_PROMPTS, task.system_prompt, task.user_turns[0])
    responses = iter(m["content"] for m in row["messages"] if m["role"] == "tool")
    for turn, user in enumerate(task.user_turns):
        if turn:
            messages.append({"role": "user", "content": user})
        for step in task.gold_calls[turn]:
            results = [json.loads(next(responses)) for _ in step]
            messages.append({"role": "assistant", "content": sft_act_target(step)})
            messages.extend(act_observation_messages(step, results))
            rehearse_targets.extend(sft_rehearse_target(as_result_object(r)) for r in results)
        messages.append({"role": "assistant", "content": sft_act_target((), task.gold_answers[turn])})
    yield renderer.apply_chat_template(messages, tools=tools, tokenize=False)
    for prompt in row_prompts(row, 0):
        if prompt["role"] == "REHEARSE":
            messages = prompt["messages"]
            yield renderer.apply_chat_template(messages, tools=None, tokenize=False, add_generation_prompt=True)
    yield from rehearse_targets


def held_out_markers(config: OrganismConfig) -> list[str]:
    """Strings that only the held-out domain's text contains (its tool names)."""
    if config.held_out_domain is None:
        return []
    held = set(get_domain(config.held_out_domain).tool_names)
    others = {t for d in DOMAINS if d != config.held_out_domain for t in get_domain(d).tool_names}
    return sorted(held - others)


def tokenizer_corpus(config: OrganismConfig) -> list[str]:
    """The tokenizer's training text, in a fixed order; raises if any held-out-domain marker appears."""
    renderer = _renderer()
    corpus = [CHATML_TOOL_TEMPLATE]
    for task in corpus_tasks(config):
        corpus.extend(task_texts(task, renderer))
    markers = held_out_markers(config)
    leaked = sorted({m for m in markers for text in corpus if m in text})
    if leaked:
        raise RuntimeError(f"toolworld_lm corpus contains held-out domain text: {leaked}")
    return corpus


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def settings(params: str | Path, overrides: list[str]) -> tuple[dict[str, Any], str]:
    """(OrganismConfig fields, output directory) from the params file plus ``key=value`` overrides."""
    data = yaml.safe_load(Path(params).read_text())
    fields = dict(data.get("organism") or {})
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"organism: override {item!r} is not key=value")
        fields[key.removeprefix("organism.")] = _value(value)
    return fields, str(data.get("out", "data/organism/toolworld_lm"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envace.stages.organism", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=PARAMS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    fields, out = settings(args.params, list(args.overrides))
    config = OrganismConfig.from_mapping(fields)
    manifest = save_organism(config, tokenizer_corpus(config), args.out or out)
    print(json.dumps({k: manifest[k] for k in ("parameters", "vocab_size", "weights_sha256", "tokenizer_sha256")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
