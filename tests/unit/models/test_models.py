"""Model registry, the tiny model/tokenizer, the local-path loader and (slow) the SmolLM2 conversion."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.prompts import CHATML_TOOL_TEMPLATE, ChatFormatter, template_renders_tools
from envace.models import (
    MODEL_LOADERS,
    ModelSpec,
    build_tiny_tokenizer,
    load_model_and_tokenizer,
    model_spec_from_string,
)
from envace.models.smollm2 import CACHE_MARKER, SMOLLM2_CACHE_NAME, model_cache_root

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer(ModelSpec("tiny"))


def test_registry_lists_valid_kinds_on_unknown_kind():
    assert {"tiny", "smollm2", "path"} <= set(MODEL_LOADERS)
    with pytest.raises(ValueError, match=r"valid kinds: \['path', 'smollm2', 'tiny'\]"):
        load_model_and_tokenizer(ModelSpec("gpt5"))
    with pytest.raises(ValueError, match="dtype='float8' is unknown"):
        load_model_and_tokenizer(ModelSpec("tiny", dtype="float8"))


def test_tiny_tokenizer_builds_fast_and_deterministically():
    started = time.perf_counter()
    first = build_tiny_tokenizer()
    assert time.perf_counter() - started < 1.0
    second = build_tiny_tokenizer()
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert 300 < len(first) <= 1024


def test_tiny_tokenizer_special_tokens_and_template():
    tok = build_tiny_tokenizer()
    ids = [tok.convert_tokens_to_ids(t) for t in ("<|pad|>", "<|im_start|>", "<|im_end|>")]
    assert ids == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)["input_ids"][0] == 1
    assert tok.chat_template == CHATML_TOOL_TEMPLATE and template_renders_tools(tok)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert len(tok(call, add_special_tokens=False)["input_ids"]) < len(call) / 2  # BPE merges shorten prompts


@pytest.mark.parametrize(
    "text",
    [
        "",
        " leading space",
        '{"a": [1, 2.5e-3, null], "b": "x\\ny"}',
        "tab\tand\r\nCRLF",
        "naïve 日本語 emoji 🙂",
        "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>",
    ],
)
def test_tiny_tokenizer_round_trips(text):
    tok = build_tiny_tokenizer()
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"], skip_special_tokens=False) == text


_TOKENIZER = build_tiny_tokenizer()


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_tiny_tokenizer_round_trips_any_text(text):
    ids = _TOKENIZER(text, add_special_tokens=False)["input_ids"]
    assert _TOKENIZER.decode(ids, skip_special_tokens=False) == text


def test_tiny_model_shape_eval_mode_and_stop_ids(tiny):
    model, tok = tiny
    assert not model.training
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (2, 64, 4)
    assert cfg.vocab_size == len(tok)
    assert list(model.generation_config.eos_token_id) == [tok.convert_tokens_to_ids("<|im_end|>")]
    assert model.generation_config.pad_token_id == tok.pad_token_id
    ids = torch.tensor([ChatFormatter(tok).encode("hello world")])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))


def test_tiny_model_init_depends_only_on_seed():
    threads = torch.get_num_threads()
    a, _ = load_model_and_tokenizer(ModelSpec("tiny", seed=3))
    torch.manual_seed(12345)  # global RNG state must not matter
    b, _ = load_model_and_tokenizer(ModelSpec("tiny", seed=3))
    c, _ = load_model_and_tokenizer(ModelSpec("tiny", seed=4))
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert torch.get_num_threads() == threads


def test_tiny_model_shape_and_dtype_options():
    spec = ModelSpec("tiny", dtype="bfloat16", tiny_layers=1, tiny_hidden=32, tiny_heads=2)
    model, _ = load_model_and_tokenizer(spec)
    assert model.dtype == torch.bfloat16 and model.config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="divisible"):
        load_model_and_tokenizer(ModelSpec("tiny", tiny_hidden=30, tiny_heads=4))


def test_path_loader_round_trips_a_saved_model(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.chat_template = "{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}"  # ignores tools
    tok.save_pretrained(tmp_path)
    tok.chat_template = CHATML_TOOL_TEMPLATE
    loaded, loaded_tok = load_model_and_tokenizer(ModelSpec("path", path=str(tmp_path)))
    assert loaded_tok.chat_template == CHATML_TOOL_TEMPLATE  # replaced because the saved one ignores tools
    ids = torch.tensor([tok("some text", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)


def test_path_loader_errors_are_actionable(tmp_path):
    with pytest.raises(ValueError, match="needs path="):
        load_model_and_tokenizer(ModelSpec("path"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model_and_tokenizer(ModelSpec("path", path=str(tmp_path)))


def test_model_spec_from_string():
    assert model_spec_from_string("tiny") == ModelSpec("tiny")
    assert model_spec_from_string("smollm2", dtype="bfloat16") == ModelSpec("smollm2", dtype="bfloat16")
    assert model_spec_from_string("/models/x") == ModelSpec("path", path="/models/x")


def test_model_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVACE_MODEL_CACHE", str(tmp_path / "env"))
    assert model_cache_root(ModelSpec("smollm2")) == tmp_path / "env"
    assert model_cache_root(ModelSpec("smollm2", cache_dir=str(tmp_path / "spec"))) == tmp_path / "spec"
    monkeypatch.delenv("ENVACE_MODEL_CACHE")
    assert str(model_cache_root(ModelSpec("smollm2"))).endswith(".cache/envace/models")


def test_smollm2_refuses_a_half_written_cache(tmp_path):
    (tmp_path / SMOLLM2_CACHE_NAME).mkdir()
    with pytest.raises(RuntimeError, match="incomplete or foreign cache"):
        load_model_and_tokenizer(ModelSpec("smollm2", cache_dir=str(tmp_path)))


@pytest.mark.slow
def test_smollm2_converts_once_then_loads_from_cache(tmp_path):
    spec = ModelSpec("smollm2", cache_dir=str(tmp_path))
    started = time.perf_counter()
    model, tok = load_model_and_tokenizer(spec)
    converted = time.perf_counter() - started
    assert (tmp_path / SMOLLM2_CACHE_NAME / CACHE_MARKER).is_file()
    assert [p.name for p in tmp_path.iterdir()] == [SMOLLM2_CACHE_NAME]  # no staging directory left behind
    started = time.perf_counter()
    model, tok = load_model_and_tokenizer(spec)
    cached = time.perf_counter() - started
    assert cached < converted and cached < 15, (converted, cached)
    assert tok.eos_token == "<|im_end|>" and template_renders_tools(tok)
    formatter = ChatFormatter(tok)
    prompt = formatter.render([{"role": "user", "content": "What is the capital of France?"}])
    ids = torch.tensor([formatter.encode(prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
