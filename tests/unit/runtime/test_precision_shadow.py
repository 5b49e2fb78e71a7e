"""The bf16 inference copy (``precision.inference_model``): cast once, kept in sync with the trained model."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envace.engines.local import OptimConfig
from envace.engines.local.trainer import make_optimizer
from envace.runtime.attention import use_gqa_attention
from envace.runtime.kv import BatchedStreams
from envace.runtime.precision import inference_model, release_inference_copy


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    use_gqa_attention(model)
    return model.eval()


def _last_logits(model, precision: str) -> torch.Tensor:
    streams = BatchedStreams(model, ["a"], precision=precision)
    return streams.append({"a": list(range(3, 40))})["a"]


def test_fp32_is_the_model_itself_and_bf16_a_synced_copy():
    model = _model()
    assert inference_model(model, "fp32") is model
    shadow = inference_model(model, "bf16")
    assert shadow is not model and inference_model(model, "bf16") is shadow  # cached while weights unchanged
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in shadow.parameters())
    # buffers (RoPE inverse frequencies) keep float32: bf16 frequencies would shift long positions
    assert all(b.dtype == torch.float32 for b in shadow.buffers() if b.is_floating_point())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights are untouched

    before = _last_logits(model, "bf16")
    fp32 = _last_logits(model, "fp32")
    assert 0 < float((before - fp32).abs().max()) < 0.1  # it ran in bf16, close to fp32
    opt = make_optimizer(model, OptimConfig(lr=1e-2))  # fused: moves no version counter, the step hook tells
    assert opt.defaults.get("fused")
    model(input_ids=torch.arange(3, 20).unsqueeze(0), labels=torch.arange(3, 20).unsqueeze(0)).loss.backward()
    opt.step()
    assert inference_model(model, "bf16") is shadow  # refreshed in place, not rebuilt
    after = _last_logits(model, "bf16")
    assert float((after - before).abs().max()) > 1e-3  # decoding follows the optimiser step
    for src, dst in zip(model.parameters(), shadow.parameters()):
        assert torch.equal(dst, src.detach().to(torch.bfloat16))


def _tied_model() -> LlamaForCausalLM:
    """One layer, input and output embeddings tied."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def test_tied_weights_stay_tied_in_the_copy():
    model = _tied_model()
    shadow = inference_model(model, "bf16")
    assert shadow.get_output_embeddings().weight is shadow.get_input_embeddings().weight
    assert len(list(shadow.parameters())) == len(list(model.parameters()))


def test_released_copy_frees_its_weights_and_recasts_on_next_use():
    model = _tied_model()
    shadow = inference_model(model, "bf16")
    release_inference_copy(model)
    assert all(p.numel() == 0 for p in shadow.parameters())  # the update runs without the copy's memory
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)  # the weights move while the copy is released
    assert inference_model(model, "bf16") is shadow  # same module, weights cast again
    for src, dst in zip(model.parameters(), shadow.parameters()):
        assert torch.equal(dst, src.detach().to(torch.bfloat16))
    assert shadow.get_output_embeddings().weight is shadow.get_input_embeddings().weight
    release_inference_copy(LlamaForCausalLM(model.config))  # a model without a copy: nothing to do
