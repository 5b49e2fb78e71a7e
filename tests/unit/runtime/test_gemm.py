"""engine.fp32_linear: float32 linear layers through oneDNN (envace.runtime.gemm)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime import gemm
from envace.runtime.gemm import (
    OneDnnLinear,
    fp32_linear_of,
    linear_fn,
    onednn_linear,
    resolve_fp32_linear,
    set_fp32_linear,
)
from envace.runtime.kv import BatchedStreams

pytestmark = pytest.mark.skipif(not gemm.onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    return model


@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_linear_matches_f_linear_in_value_and_gradients(with_bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 48, generator=gen, requires_grad=True)
    w = torch.randn(80, 48, generator=gen, requires_grad=True)
    b = torch.randn(80, generator=gen, requires_grad=True) if with_bias else None
    grad = torch.randn(2, 37, 80, generator=gen)
    inputs = [x, w] + ([b] if with_bias else [])
    ours = OneDnnLinear.apply(x, w, b)
    ref = F.linear(x, w, b)
    assert ours.shape == ref.shape and ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(ours, inputs, grad), torch.autograd.grad(ref, inputs, grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_onednn_linear_defers_to_f_linear_outside_float32_cpu():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    for args in [(x.double(), w.double()), (x.bfloat16(), w.bfloat16()), (x[0], w)]:
        assert torch.equal(onednn_linear(*args), F.linear(*args))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = onednn_linear(x, w), F.linear(x, w)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)  # bf16 runs compute exactly what they did


def test_set_fp32_linear_patches_every_linear_reversibly_and_survives_a_deep_copy(tiny):
    ids = torch.arange(12).view(1, 12)
    with torch.no_grad():
        before = tiny(input_ids=ids).logits
    try:
        set_fp32_linear(tiny, "onednn")
        assert fp32_linear_of(tiny) == "onednn" and linear_fn(tiny) is onednn_linear
        linears = [m for m in tiny.modules() if type(m) is torch.nn.Linear]
        assert linears and all("forward" in m.__dict__ for m in linears)
        twin = copy.deepcopy(tiny)
        assert fp32_linear_of(twin) == "onednn"
        assert twin.lm_head.forward.__self__ is twin.lm_head  # re-bound to the copy's own layer
        with torch.no_grad():
            during = tiny(input_ids=ids).logits
        torch.testing.assert_close(during, before, rtol=1e-4, atol=1e-4)
        assert tiny.state_dict().keys() == twin.state_dict().keys()
    finally:
        set_fp32_linear(tiny, "torch")
    assert fp32_linear_of(tiny) == "torch" and linear_fn(tiny) is F.linear
    assert not any("forward" in m.__dict__ for m in tiny.modules())
    with torch.no_grad():
        assert torch.equal(tiny(input_ids=ids).logits, before)


def test_lean_decoding_uses_the_models_setting_and_matches_torchs_logits(tiny):
    ids = torch.arange(3, 19).view(2, 8)
    logits = {}
    try:
        for backend in ("torch", "onednn"):
            set_fp32_linear(tiny, backend)
            streams = BatchedStreams(tiny, [0, 1], pad_id=0)
            assert streams.lean is not None and streams.lean.linear is linear_fn(tiny)
            out = streams.append({0: ids[0].tolist(), 1: ids[1].tolist()})
            logits[backend] = torch.stack([out[0], out[1]])
    finally:
        set_fp32_linear(tiny, "torch")
    torch.testing.assert_close(logits["onednn"], logits["torch"], rtol=1e-4, atol=1e-4)


def test_resolve_fp32_linear_choices(tiny, caplog, monkeypatch):
    with pytest.raises(ValueError, match="engine.fp32_linear='mkl'; valid: auto, torch, onednn"):
        resolve_fp32_linear("mkl", "fp32", "cpu", tiny)
    assert resolve_fp32_linear("torch", "fp32", "cpu", tiny) == "torch"
    assert resolve_fp32_linear("onednn", "fp32", "cpu", tiny) == "onednn"
    assert resolve_fp32_linear("auto", "bf16", "cpu", tiny) == "torch"  # bf16 never needs it
    assert tiny.config.hidden_size < gemm.MIN_WIDTH
    with caplog.at_level(logging.INFO, logger="envace.runtime.gemm"):
        assert resolve_fp32_linear("auto", "fp32", "cpu", tiny) == "torch"  # too narrow to time: no coin toss
    assert f"fp32_linear auto -> torch (not timed: the model is narrower than {gemm.MIN_WIDTH}" in caplog.text
    # a model wide enough is timed on its own layer shapes, and auto follows the measurement
    wide = torch.nn.Module()
    wide.config = type("Config", (), {"hidden_size": 256, "intermediate_size": 512})()
    measured = gemm.onednn_speedup(wide, torch.get_num_threads())
    assert measured is not None and 0.2 < measured < 5
    for speedup, chosen in ((gemm.MIN_SPEEDUP + 0.1, "onednn"), (gemm.MIN_SPEEDUP - 0.1, "torch")):
        monkeypatch.setattr(gemm, "onednn_speedup", lambda model, threads, s=speedup: s)
        assert resolve_fp32_linear("auto", "fp32", "cpu", wide) == chosen


def test_decode_head_follows_its_own_measurement(monkeypatch, caplog):
    """The decoding LM head picks oneDNN or torch by timing its own shape; narrow or non-float32 heads stay
    on ``F.linear`` untimed; either choice gives ``F.linear``'s logits."""
    assert gemm.decode_head_fn(torch.randn(97, 32)) is F.linear  # narrower than MIN_WIDTH
    assert gemm.decode_head_fn(torch.randn(300, 256, dtype=torch.bfloat16)) is F.linear
    head = torch.randn(1000, 256, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.INFO, logger="envace.runtime.gemm"):
        fn = gemm.decode_head_fn(head)
    assert "decode LM head" in caplog.text and fn in (F.linear, onednn_linear)
    h = torch.randn(3, 1, 256)
    torch.testing.assert_close(fn(h, head), F.linear(h, head), rtol=1e-4, atol=1e-4)
    for speedup, chosen in ((gemm.MIN_SPEEDUP + 0.1, onednn_linear), (gemm.MIN_SPEEDUP - 0.1, F.linear)):
        monkeypatch.setitem(gemm._SPEEDUPS, ("head", tuple(head.shape), torch.get_num_threads()), speedup)
        assert gemm.decode_head_fn(head) is chosen
