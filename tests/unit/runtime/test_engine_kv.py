"""BatchedStreams: batched appends with padding holes give the logits of encoding each stream alone."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envace.core.records import Role
from envace.runtime.decode import (
    DecodeGuide,
    DecodeRequest,
    OutputKey,
    decode,
    derive_seed,
    pick_token,
)
from envace.runtime.kv import BatchedStreams

torch.set_num_threads(1)


SIZES = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).eval()


def _alone(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "hf"])
def test_holes_and_positions_match_unbatched(model, lean):
    streams = {"a": list(range(1, 30)), "b": list(range(40, 47)), "c": list(range(50, 90))}
    kv = BatchedStreams(model, list(streams), lean=lean)
    assert (kv.lean is not None) == lean
    last = kv.append({k: v[:5] for k, v in streams.items()})
    for piece in (
        {"a": streams["a"][5:9], "b": streams["b"][5:6]},
        {"c": streams["c"][5:40]},
        {"a": streams["a"][9:], "b": streams["b"][6:]},
    ):
        last.update(kv.append(piece))
    for key, tokens in streams.items():
        assert kv.fed_count(key) == len(tokens)
        torch.testing.assert_close(last[key], _alone(model, tokens), atol=1e-5, rtol=1e-5)
    assert kv.cache_len > max(len(t) for t in streams.values())  # holes were inserted


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "hf"])
def test_repeat_and_retain(model, lean):
    kv = BatchedStreams(model, ["p0", "p1"], lean=lean)
    kv.append({"p0": [1, 2, 3], "p1": [4, 5]})
    kv.repeat([["x0", "x1"], ["y0", "y1"]])
    out = kv.append({"x1": [7], "y0": [8, 9]})
    torch.testing.assert_close(out["x1"], _alone(model, [1, 2, 3, 7]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["y0"], _alone(model, [4, 5, 8, 9]), atol=1e-5, rtol=1e-5)
    kv.retain(["y0", "x1"])
    out = kv.append({"y0": [10], "x1": [11]})
    torch.testing.assert_close(out["y0"], _alone(model, [4, 5, 8, 9, 10]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["x1"], _alone(model, [1, 2, 3, 7, 11]), atol=1e-5, rtol=1e-5)
    assert kv.keys == ["y0", "x1"]


@pytest.mark.parametrize("share", [True, False], ids=["shared", "copied"])
def test_shared_prefix_rows_match_unbatched(model, share):
    """Rows of a repeat attend to their group's prefix without copies of it; every logit is the row alone's."""
    prompts = {"p0": [1, 2, 3, 4, 5, 6, 7], "p1": [20, 21, 22]}
    kv = BatchedStreams(model, list(prompts), share_prefixes=share)
    kv.append(prompts)  # p1 is shorter: the prefix has padding holes
    kv.repeat([["a0", "a1", "a2"], ["b0", "b1", "b2"]])
    assert (kv.shared is not None) == share and kv.cache_len == (0 if share else 7)
    assert share is False or kv.shared.uniform == 3  # one batched matmul over the groups
    streams = {k: list(prompts["p0" if k[0] == "a" else "p1"]) for k in kv.keys}

    def feed(pieces):
        out = kv.append(pieces)
        for key, piece in pieces.items():
            streams[key] += piece
            torch.testing.assert_close(out[key], _alone(model, streams[key]), atol=1e-5, rtol=1e-5)

    feed({"a0": [30], "a2": [31], "b1": [32]})  # decode step (one token), rows left out get a hole
    feed({k: [40 + i, 41] for i, k in enumerate(kv.keys)})  # two tokens per row: causal inside the step
    feed({"a1": list(range(50, 58)), "b0": [60]})  # a long piece: prefix copied out for that append
    kv.retain(["a0", "b2", "a2"])  # group a's rows no longer contiguous
    assert share is False or (len(kv.shared.groups) == 2 and kv.shared.uniform is None)  # a loop over groups
    feed({"a0": [70], "b2": [71], "a2": [72]})
    kv.retain(["b2"])  # group a is gone: its prefix is dropped
    assert share is False or kv.shared.mask.shape[0] == 1
    feed({"b2": [80]})
    kv.repeat([["c0", "c1"]])  # a second repeat copies the shared prefix out, then shares the whole row
    streams.update({"c0": list(streams["b2"]), "c1": list(streams["b2"])})
    feed({"c0": [90], "c1": [91, 92]})


def test_small_prefixes_are_copied_by_default(model, monkeypatch):
    """``share_prefixes=None`` shares a prefilled prefix only from ``SHARE_MIN_BYTES`` of keys and values per row
    and layer (below that, sharing's extra calls cost more than re-reading the copies); the logits are the
    same either way."""
    cfg = model.config
    per_token = 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4  # fp32 k and v
    prompt = list(range(1, 9))
    got = {}
    cached = (len(prompt) - 1) * per_token  # the prefill: all but the last prompt token
    for limit, shared in ((cached + 1, False), (cached, True)):
        monkeypatch.setattr(BatchedStreams, "SHARE_MIN_BYTES", limit)
        kv = BatchedStreams(model, ["p"])
        kv.append({"p": prompt[:-1]})
        kv.repeat([["a", "b"]])
        assert (kv.shared is not None) == shared
        got[shared] = kv.append({"a": prompt[-1:], "b": prompt[-1:]})
        assert BatchedStreams(model, ["p"], share_prefixes=not shared).share_prefixes is (not shared)
    for key in ("a", "b"):
        torch.testing.assert_close(got[True][key], got[False][key], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[True][key], _alone(model, prompt), atol=1e-5, rtol=1e-5)


def test_shared_prefix_bf16_matches_copied_rows(model):
    """In bf16 (the cache in bf16, scores read key-first), shared-prefix decoding gives the copied rows' logits."""
    runs = {}
    for share in (True, False):
        kv = BatchedStreams(model, ["p0", "p1"], precision="bf16", share_prefixes=share)
        kv.append({"p0": list(range(1, 40)), "p1": list(range(50, 60))})
        kv.repeat([["a0", "a1"], ["b0", "b1"]])
        runs[share] = [kv.append({k: [i + 3 + j] for j, k in enumerate(kv.keys) if (i + j) % 3}) for i in range(5)]
    for got, want in zip(runs[True], runs[False]):
        assert got.keys() == want.keys()
        for key in got:
            torch.testing.assert_close(got[key], want[key], atol=1e-2, rtol=1e-2)


def test_first_append_must_feed_every_row(model):
    kv = BatchedStreams(model, ["a", "b"])
    with pytest.raises(ValueError, match="first append"):
        kv.append({"a": [1]})


def _request(row, stream, temp=1.0, seed=0, n=6):
    return DecodeRequest(
        row=row,
        stream=list(stream),
        max_new_tokens=n,
        temperature=temp,
        generator=torch.Generator().manual_seed(seed),
        output_key=OutputKey(row, 0, Role.ACT, 0),
    )


def test_decode_is_seeded_per_row_and_records_policy_logprobs(model):
    def run(rows):
        kv = BatchedStreams(model, [r for r, _ in rows])
        reqs = [_request(r, s, seed=derive_seed(0, r)) for r, s in rows]
        decode(kv, reqs, frozenset())
        return {r.row: r for r in reqs}

    alone = run([("a", [1, 2, 3])])["a"]
    together = run([("a", [1, 2, 3]), ("b", [5, 6, 7, 8, 9])])["a"]
    assert alone.tokens == together.tokens  # a row's samples do not depend on its batch mates
    tokens = [1, 2, 3]
    for tok, lp in zip(alone.tokens, alone.logprobs):
        expected = torch.log_softmax(_alone(model, tokens), -1)[tok]
        assert lp == pytest.approx(float(expected), abs=1e-5)
        tokens.append(tok)


def test_decode_reads_its_rows_logits_in_any_order_and_subset(model):
    """Requests for some of the streams' rows, listed out of order: each row samples what it samples alone."""
    streams = {"a": [1, 2, 3], "b": [5, 6, 7, 8, 9], "c": [4, 4]}

    def run(rows, asked):
        kv = BatchedStreams(model, rows)
        kv.append({r: streams[r][:-1] for r in rows})  # rows not asked for stay in the batch, fed nothing
        reqs = [_request(r, streams[r], seed=derive_seed(0, r)) for r in asked]
        decode(kv, reqs, frozenset())
        return {r.row: (r.tokens, r.logprobs) for r in reqs}

    together = run(["a", "b", "c"], ["c", "a"])
    for row in ("a", "c"):
        alone = run([row], [row])[row]
        assert together[row][0] == alone[0]
        assert together[row][1] == pytest.approx(alone[1], abs=1e-5)


def test_decode_stops_at_stop_id_and_forcing(model):
    guide = DecodeGuide(lambda key: [11, 12, 13], strength=None)
    req = _request("a", [1, 2], n=10)
    decode(BatchedStreams(model, ["a"]), [req], frozenset({13}), guide)
    assert req.tokens == [11, 12, 13] and req.finished
    req = _request("b", [1, 2], n=2)
    decode(BatchedStreams(model, ["b"]), [req], frozenset({13}), guide)
    assert req.tokens == [11, 12] and not req.finished


def test_pick_token_bias_and_greedy(model):
    logits = torch.zeros(97)
    logits[5] = 1.0
    req = _request("a", [1], temp=0.0)
    assert pick_token(logits, req, None)[0] == 5  # T == 0 is greedy
    strong = DecodeGuide(lambda key: [42], strength=50.0)
    tok, lp = pick_token(logits, _request("a", [1]), strong)
    assert tok == 42
    assert lp == pytest.approx(float(torch.log_softmax(logits, -1)[42]))  # policy log-prob, not the guided one


def test_gqa_attention_matches_sdpa_and_growing_cache(model):
    from envace.runtime.attention import GQA_SDPA, use_gqa_attention
    from envace.runtime.kv import GrowingLayer

    gqa = copy.deepcopy(model)
    assert use_gqa_attention(gqa) and gqa.config._attn_implementation == GQA_SDPA
    ids = torch.randint(1, 97, (2, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, 20:] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = gqa(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :20], want[1, :20], atol=1e-5, rtol=1e-5)
    kv = BatchedStreams(gqa, ["a"])
    assert all(isinstance(layer, GrowingLayer) for layer in kv.cache.layers)
    out = {}
    for start in range(0, 200, 7):  # many appends: the buffer grows several times
        out = kv.append({"a": list(range(1 + start % 90, 8 + start % 90))})
    stream = [t for start in range(0, 200, 7) for t in range(1 + start % 90, 8 + start % 90)]
    torch.testing.assert_close(out["a"], _alone(model, stream), atol=1e-4, rtol=1e-4)


def test_lean_forward_is_the_default_for_llama_only(model):
    """Llama models decode through LeanLlama by default; other architectures keep HF's forward."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from envace.runtime.lean import LeanLlama

    assert BatchedStreams(model, ["a"]).lean is not None
    qwen = Qwen2ForCausalLM(Qwen2Config(**SIZES)).eval()
    assert not LeanLlama.supports(qwen) and BatchedStreams(qwen, ["a"]).lean is None
    with pytest.raises(ValueError, match="not a plain Llama"):
        LeanLlama(qwen)
    # a forward hook, or a projection wrapped by another module (LoRA), must see HF's forward run
    hooked = copy.deepcopy(model)
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert not LeanLlama.supports(hooked) and BatchedStreams(hooked, ["a"]).lean is None
    wrapped = copy.deepcopy(model)
    wrapped.model.layers[1].self_attn.v_proj = torch.nn.Sequential(wrapped.model.layers[1].self_attn.v_proj)
    assert not LeanLlama.supports(wrapped)


def test_lean_bf16_decoding_matches_hf_bf16(model):
    """On the bf16 decoding copy, the lean forward's logits equal HF's up to bf16 rounding, step after step.

    The random fixture's attention is nearly uniform and its logits tiny (|logit| < 0.4), so in bf16 an
    error in the rotary or attention path would vanish below rounding; q/k and head weights scaled 10x make
    attention sharp and logits larger (|logit| up to 3.3): there lean and HF differ by one bf16 step
    (0.016), and a 10% error in the rotary's sine term moves logits by 0.13, which this test rejects.
    """
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        for layer in sharp.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
        sharp.lm_head.weight.mul_(10)
    runs = {}
    for lean in (True, False):
        kv = BatchedStreams(sharp, ["a", "b"], precision="bf16", lean=lean)
        outs = [kv.append({"a": list(range(1, 40)), "b": list(range(50, 60))})]
        for i in range(6):
            outs.append(kv.append({"a": [i + 3], "b": [i + 60]} if i % 3 else {"a": [i + 3]}))
        runs[lean] = outs
    for got, want in zip(runs[True], runs[False]):
        assert got.keys() == want.keys()
        for key in got:
            torch.testing.assert_close(got[key], want[key], atol=3e-2, rtol=3e-2)


def test_lean_fuses_projections_only_on_an_inference_copy_or_a_small_model(model, monkeypatch):
    """A model being trained decodes with separate q/k/v and gate/up matmuls where the fused copies would be
    large (SmolLM2: ~430 MB beside the optimiser state), fused ones where they are small; a frozen copy
    always fuses them. Both give HF's logits."""
    from envace.runtime.lean import LeanLlama

    assert all(p.requires_grad for p in model.parameters())
    assert LeanLlama(model).fused  # the tiny model's copies are a few KB
    monkeypatch.setattr(LeanLlama, "FUSED_COPY_LIMIT_BYTES", 1024)
    assert not LeanLlama(model).fused and LeanLlama(model, fuse=True).fused
    frozen = copy.deepcopy(model).requires_grad_(False)
    assert LeanLlama(frozen).fused
    assert BatchedStreams(model, ["a"], precision="bf16").lean.fused  # the bf16 decoding copy is frozen
    streams = {"a": list(range(1, 30)), "b": list(range(40, 47))}
    for fuse in (False, True):
        kv = BatchedStreams(model, list(streams), lean=LeanLlama(model, fuse=fuse))
        last = kv.append({k: v[:20] for k, v in streams.items()})
        last.update(kv.append({"a": streams["a"][20:]}))
        for key, tokens in streams.items():
            torch.testing.assert_close(last[key], _alone(model, tokens), atol=1e-5, rtol=1e-5)


def test_lean_projects_only_the_real_tokens_of_an_uneven_append(model):
    """Padding columns (shorter pieces, rows that feed nothing) go through no projection or MLP: every
    linear of an uneven append sees exactly the fed tokens, and each row's logits are still its own alone."""
    kv = BatchedStreams(model, ["a", "b", "c"], lean=True)
    streams = {"a": list(range(1, 12)), "b": [40, 41, 42], "c": list(range(50, 57))}
    kv.append(streams)  # 11 + 3 + 7 real tokens in an 11-wide step
    rows = []
    real_linear = kv.lean.linear
    kv.lean.linear = lambda x, w: (rows.append(x.reshape(-1, x.shape[-1]).shape[0]), real_linear(x, w))[1]
    for pieces in ({"a": [60, 61, 62, 63], "c": [64]}, {"b": [70]}, {k: [80] for k in streams}):
        rows.clear()
        out = kv.append(pieces)
        fed = sum(len(p) for p in pieces.values())
        assert rows and set(rows) == {fed}  # q/k/v, o, gate/up and down: over the fed tokens only
        for key, piece in pieces.items():
            streams[key] += piece
            torch.testing.assert_close(out[key], _alone(model, streams[key]), atol=1e-5, rtol=1e-5)
