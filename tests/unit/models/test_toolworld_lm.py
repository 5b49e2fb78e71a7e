"""The model organism (envace.models.toolworld_lm): deterministic build, tokenizer, template, size, loading."""

from __future__ import annotations

import dataclasses
import json

import pytest

from envace.core.prompts import ChatFormatter
from envace.envs.toolworld import generate_tasks
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.models.toolworld_lm import (
    MANIFEST,
    OrganismConfig,
    build_organism,
    save_organism,
    tokenizer_sha256,
    weights_sha256,
)
from envace.stages import organism as organism_stage
from envace.stages.organism import corpus_tasks, held_out_markers, task_texts, tokenizer_corpus

# a small corpus keeps the tests fast; the shape is the default organism's
SMALL = OrganismConfig(n_corpus_tasks=40, n_val=10, n_test=20, vocab_size=1024)


@pytest.fixture(scope="module")
def corpus():
    return tokenizer_corpus(SMALL)


@pytest.fixture(scope="module")
def built(corpus):
    return build_organism(SMALL, corpus)


def test_same_config_gives_identical_tokenizer_and_weights(built):
    model, tokenizer = built
    again_model, again_tokenizer = build_organism(SMALL, tokenizer_corpus(SMALL))
    assert tokenizer.backend_tokenizer.to_str() == again_tokenizer.backend_tokenizer.to_str()
    assert weights_sha256(model) == weights_sha256(again_model)
    other, _ = build_organism(dataclasses.replace(SMALL, init_seed=1), tokenizer_corpus(SMALL))
    assert weights_sha256(other) != weights_sha256(model)


def test_tool_world_trajectory_round_trips(built):
    _, tokenizer = built
    val_task = generate_tasks(seed=SMALL.data_seed, n_train=0, n_val=3, n_test=0)["val"][0]
    for text in task_texts(val_task, tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    # the trained vocabulary compresses the tool world's text well beyond bytes
    stream = next(task_texts(val_task, tokenizer))
    assert len(tokenizer(stream, add_special_tokens=False)["input_ids"]) < len(stream) / 2.5


def test_chat_template_renders_tools_and_tool_calls(built):
    _, tokenizer = built
    tool = {"name": "get_balance", "description": "d", "parameters": {"type": "object", "properties": {}}}
    messages = [
        {"role": "user", "content": "balance?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "get_balance", "arguments": {}}}],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "get_balance", "content": '{"balance": 3}'},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True)
    assert '"name": "get_balance"' in text and "<tool_call>" in text and "<tool_response>" in text
    ChatFormatter(tokenizer)  # append-only for tool responses and user turns (raises otherwise)


def test_default_organism_size():
    model, tokenizer = build_organism(OrganismConfig(), tokenizer_corpus(OrganismConfig()))
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n <= 4_000_000
    assert 1500 <= len(tokenizer) <= OrganismConfig().vocab_size


def test_held_out_domain_never_in_the_corpus():
    assert all(t.split == "train" and t.domain != SMALL.held_out_domain for t in corpus_tasks(SMALL))
    corpus = "\n".join(tokenizer_corpus(SMALL))
    markers = held_out_markers(SMALL)
    assert markers and not any(m in corpus for m in markers)
    # the val/test splits do contain text the corpus lacks (the held-out domain in test)
    test = generate_tasks(seed=SMALL.data_seed, n_train=SMALL.n_corpus_tasks, n_val=SMALL.n_val, n_test=SMALL.n_test)
    assert any(t.domain == SMALL.held_out_domain for t in test["test"])


def test_saved_organism_loads_through_the_model_loader(tmp_path, built, corpus):
    manifest = save_organism(SMALL, corpus, tmp_path / "org")
    assert json.loads((tmp_path / "org" / MANIFEST).read_text()) == manifest
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="path", path=str(tmp_path / "org")))
    assert weights_sha256(model) == manifest["weights_sha256"] == weights_sha256(built[0])
    assert tokenizer_sha256(tokenizer) == manifest["tokenizer_sha256"]
    assert model.generation_config.eos_token_id == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_stage_settings_read_the_params_file_and_overrides(tmp_path):
    params = tmp_path / "organism.yaml"
    params.write_text("organism:\n  hidden: 64\n  heads: 4\nout: somewhere\n")
    fields, out = organism_stage.settings(params, ["layers=2", "organism.vocab_size=512"])
    assert fields == {"hidden": 64, "heads": 4, "layers": 2, "vocab_size": 512} and out == "somewhere"
    with pytest.raises(ValueError, match="unknown keys"):
        OrganismConfig.from_mapping({"hiden": 3})


def test_split_digits_spells_every_number_from_digit_tokens(corpus):
    _, tokenizer = build_organism(dataclasses.replace(SMALL, split_digits=True), corpus)
    text = '{"balance":1150,"account_id":"acc_12"} moved 1150 to acc_12'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    pieces = [tokenizer.decode([i]) for i in ids]
    assert all(len(p.strip()) == 1 for p in pieces if any(c.isdigit() for c in p))  # no multi-digit token
    # the same number is the same digit tokens whether it follows ":" (JSON) or a space (prose)
    digits = [p for p in pieces if p.strip().isdigit()]
    assert digits[:4] == digits[6:10] == ["1", "1", "5", "0"]
