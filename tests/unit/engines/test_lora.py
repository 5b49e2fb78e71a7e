"""LoRA: ``algo.lora_*`` → ``LoraSpec`` (off by default, checked where it becomes typed); peft adapters on
the tiny model train alone, checkpoint as adapter tensors only, and merge into a plain HF model that
``AutoModelForCausalLM`` loads with the adapted model's logits. The engine runs are in
tests/integration/test_local_engine_lora.py, the verl keys in test_verl_config.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envace.config.load import compose, typed_config
from envace.engines.local.checkpoint import load_latest, save_checkpoint
from envace.engines.local.lora import adapter_keys, add_lora, merged_copy
from envace.engines.lora import LoraSpec, lora_spec
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.stages.runner import NULL_TRACKER
from envace.stages.train_setup import local_engine_config

torch.set_num_threads(1)

TINY = ModelSpec(kind="tiny", seed=2)
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def spec(rank: int = 4, alpha: int = 8) -> LoraSpec:
    return LoraSpec(rank=rank, alpha=alpha, target_modules=PROJ, dropout=0.0)


def test_lora_is_off_by_default_and_algo_lora_rank_turns_it_on(tmp_path):
    assert lora_spec(compose().algo) is None
    assert local_engine_config(typed_config(compose(["profile=smoke"])), tmp_path, NULL_TRACKER).lora is None
    cfg = typed_config(compose(["profile=smoke", "algo=per_role", "algo.lora_rank=8"]))
    assert local_engine_config(cfg, tmp_path, NULL_TRACKER).lora == LoraSpec(8, 16, PROJ, 0.0)
    assert LoraSpec(8, 16, PROJ, 0.0).scale == 2.0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lora_rank", -1),
        ("lora_alpha", 0),
        ("lora_dropout", 1.0),
        ("lora_target_modules", []),
    ],
)
def test_bad_lora_values_name_the_key(key, value):
    algo = {"lora_rank": 4, "lora_alpha": 16, "lora_target_modules": list(PROJ), "lora_dropout": 0.0, key: value}
    with pytest.raises(ValueError, match=f"algo.{key}"):
        lora_spec(algo)


def test_unknown_target_module_lists_the_model_layers():
    model, _ = load_model_and_tokenizer(TINY)
    with pytest.raises(ValueError, match=r"lora_target_modules.*q_proj"):
        add_lora(model, LoraSpec(4, 8, ("qkv",), 0.0))


def test_only_adapters_train_and_checkpoints_hold_them_exactly(tmp_path: Path):
    model, _ = load_model_and_tokenizer(TINY)
    add_lora(model, spec())
    keys = adapter_keys(model)
    assert len(keys) == 2 * len(PROJ) * 2  # 2 layers x 7 projections x (A, B)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == keys
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
    opt.step()
    save_checkpoint(tmp_path, 1, {"policy": model}, {"policy": opt}, {})
    ckpt = load_latest(tmp_path)
    assert set(ckpt.model_state("policy")) == keys
    other, _ = load_model_and_tokenizer(TINY)
    add_lora(other, spec())
    ckpt.restore_model("policy", other)
    a, b = model.state_dict(), other.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other_targets, _ = load_model_and_tokenizer(TINY)
    add_lora(other_targets, LoraSpec(4, 8, ("q_proj",), 0.0))
    with pytest.raises(ValueError, match="other algo.lora_"):
        ckpt.restore_model("policy", other_targets)


def test_merged_export_loads_as_plain_hf_with_the_adapted_logits(tmp_path: Path):
    model, _ = load_model_and_tokenizer(TINY)
    base_logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits
    wrapped = add_lora(model, spec())
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)  # B = 0 at init would make the merge trivial
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        merged_copy(wrapped).save_pretrained(tmp_path / "merged")
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
        assert not adapter_keys(loaded)
        merged = loaded(input_ids=ids).logits
        assert adapter_keys(model) and torch.equal(model(input_ids=ids).logits, adapted)  # original untouched
    assert (adapted - base_logits).abs().max() > 1e-2
    assert torch.allclose(merged, adapted, atol=1e-5, rtol=0)
