"""Shared-prefix packing (exact vs the unshared computation), bf16 vs fp32 log-probs, checkpointing."""

from __future__ import annotations

import copy
import logging
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envace.core.records import Role
from envace.engines.local import OptimConfig, packing
from envace.engines.local.batching import TrainRow, collate, token_logprobs
from envace.engines.local.packing import (
    Pack,
    attention_cost_ratio,
    collate_packs,
    head_logprobs,
    micro_batches,
    pack_mask,
    packed_logprobs,
    plan_packs,
)
from envace.engines.local.trainer import PolicyUpdater, Slot, make_optimizer, needs_checkpointing, set_checkpointing
from envace.runtime import attention, precision
from envace.runtime.attention import PackLayout, segment_attention, use_gqa_attention
from envace.runtime.kv import BatchedStreams
from envace.runtime.lean import LeanLlama
from envace.runtime.precision import (
    BF16_MIN_SPEEDUP,
    PRECISIONS,
    autocast,
    cpu_has_bf16,
    decoder_of,
    model_bf16_speedup,
    resolve_precision,
    resolve_threads,
)

torch.set_num_threads(1)
VOCAB = 96


def _model(layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    use_gqa_attention(model)
    return model.eval()


def _row(ids: torch.Tensor, start: int, role: Role, adv: float, g: torch.Generator) -> TrainRow:
    pos = torch.arange(start, ids.numel() - 1)
    return TrainRow(
        input_ids=ids,
        positions=pos,
        targets=ids[pos + 1],
        roles=torch.full_like(pos, int(role)),
        temperatures=torch.full((pos.numel(),), 0.7 if role is Role.REHEARSE else 1.0),
        advantages=torch.full((pos.numel(),), adv),
        sampling_logprobs=-torch.rand(pos.numel(), generator=g),
    )


def _rows() -> list[TrainRow]:
    """Two prompts × K=3 samples (ACT rows) + a REHEARSE row per sample of prompt 0 + one lone row."""
    g = torch.Generator().manual_seed(3)
    rand = lambda n: torch.randint(3, VOCAB, (n,), generator=g)
    rows = []
    for _p, plen in enumerate((40, 25)):
        prompt = rand(plen)
        for k in range(3):
            rows.append(_row(torch.cat([prompt, rand(6 + 2 * k)]), plen - 1, Role.ACT, 0.5 - 0.4 * k, g))
    sys = rand(30)
    for k in range(3):
        call = rand(4 + k)
        rows.append(_row(torch.cat([sys, call, rand(5)]), 30 + call.numel() - 1, Role.REHEARSE, 0.3 * k - 0.2, g))
    rows.append(_row(rand(12), 3, Role.ACT, 1.0, g))
    return rows


def _tree_rows() -> list[TrainRow]:
    """K=5 samples of one prompt that share more than it: two identical samples, two that start with the same
    8 tokens (and one of them continues the other), one of their own; then two identical REHEARSE rows."""
    g = torch.Generator().manual_seed(11)
    rand = lambda n: torch.randint(3, VOCAB, (n,), generator=g)
    prompt, call, alike = rand(30), rand(9), rand(8)
    tails = [call, call, torch.cat([alike, rand(5)]), torch.cat([alike, rand(5)]), rand(7)]
    tails[3] = torch.cat([tails[2], rand(4)])  # row 3 continues row 2
    rows = [_row(torch.cat([prompt, t]), 29, Role.ACT, 0.6 - 0.3 * k, g) for k, t in enumerate(tails)]
    sys, answer = rand(20), rand(6)
    rows += [_row(torch.cat([sys, answer]), 19, Role.REHEARSE, adv, g) for adv in (0.4, -0.1)]
    return rows


def test_tail_trie_encodes_each_shared_token_once():
    a, b, c = torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 9]), torch.tensor([4])
    segments, paths = packing.tail_trie([a, b, a, torch.tensor([5, 6]), c, torch.tensor([], dtype=torch.long)])
    # breadth first: [5, 6] and [4] under the root, then [7, 8] and [9] under [5, 6]
    assert [(s.offset, s.length, s.parent) for s in segments] == [(0, 2, -1), (0, 1, -1), (2, 2, 0), (2, 1, 0)]
    assert paths == ((0, 2), (0, 3), (0, 2), (0,), (1,), ())
    rows = _tree_rows()
    packs = plan_packs(rows, min_shared=8)
    assert sorted(len(p.rows) for p in packs) == [2, 5]
    act = next(p for p in packs if len(p.rows) == 5)
    # the ACT tails cost 9 (the call, twice) + 8 + 5 + 4 (alike, row 2, row 3's extra) + 7, not 9 + 9 + 13 + 17 + 7
    assert act.length == 30 + 9 + 17 + 7
    assert next(p for p in packs if len(p.rows) == 2).length == 26  # identical rows: one row's tokens
    for pack in packs:  # each member's path spells its tail
        for r, path in zip(pack.rows, pack.paths):
            tail = rows[r].input_ids[pack.prefix_len :]
            spelled = [tail[pack.segments[k].offset : pack.segments[k].offset + pack.segments[k].length] for k in path]
            assert torch.equal(torch.cat([tail[:0], *spelled]), tail)
    with pytest.raises(ValueError, match="plan_packs"):  # a hand-made pack without its segments
        collate_packs(rows, [Pack(act.rows, act.prefix_len, act.length)])
    flat = plan_packs(rows, min_shared=8, tree=False)
    assert act.length < next(p for p in flat if len(p.rows) == 5).length == 30 + 9 + 9 + 13 + 17 + 7


def test_plan_groups_shared_prefixes():
    rows = _rows()
    packs = plan_packs(rows, min_shared=8)
    assert sorted(len(p.rows) for p in packs) == [1, 3, 3, 3]
    assert sorted(p.prefix_len for p in packs if len(p.rows) > 1) == [25, 30, 40]
    assert sorted(i for p in packs for i in p.rows) == list(range(len(rows)))  # every row exactly once
    unshared = sum(int(r.input_ids.numel()) for r in rows)
    assert sum(p.length for p in packs) == unshared - 2 * (40 + 25) - 2 * 30  # each prefix encoded once
    assert [len(p.rows) for p in plan_packs(rows, share=False)] == [1] * len(rows)
    tight = plan_packs(rows, min_shared=8, max_tokens=60)  # a pack over budget starts a new one
    assert all(p.length <= 60 or len(p.rows) == 1 for p in tight)
    assert 0 < attention_cost_ratio(_model()) < 0.05


def test_long_suffixes_behind_a_short_prefix_are_not_packed_when_attention_dominates():
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, VOCAB, (16,), generator=g)
    rows = [
        _row(torch.cat([prefix, torch.randint(3, VOCAB, (60,), generator=g)]), 15, Role.ACT, 0.1, g) for _ in range(3)
    ]
    assert [len(p.rows) for p in plan_packs(rows, pair_cost=0.0)] == [3]  # projections only: pack
    assert [len(p.rows) for p in plan_packs(rows, pair_cost=1.0)] == [1, 1, 1]  # pairs dominate: don't


def test_micro_batches_bound_tokens_and_padding():
    packs = [Pack((i,), 0, n) for i, n in enumerate((100, 105, 110, 400, 1900, 2000))]
    batches = micro_batches(packs, max_tokens=4096)
    assert [[p.length for p in b] for b in batches] == [[100, 105, 110], [400], [1900, 2000]]
    assert [[p.length for p in b] for b in micro_batches(packs, max_tokens=3000)][-2:] == [[1900], [2000]]


def test_head_logprobs_chunks_by_vocabulary_and_checkpointed_chunks_change_nothing(monkeypatch):
    """Several checkpointed chunks give the one-chunk values and gradients; the default chunk follows the vocab."""
    g = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(16, VOCAB, bias=False)
    hidden = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, VOCAB, (50,), generator=g)
    temps = torch.rand(50, generator=g) + 0.5
    grads = []
    for chunk in (None, 7):
        head.zero_grad()
        out = head_logprobs(head, hidden, targets, temps, chunk=chunk)
        (hidden_grad,) = torch.autograd.grad((out * torch.arange(50.0)).sum(), hidden)
        grads.append((out.detach(), hidden_grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-6, rtol=1e-6)
    # default chunk: HEAD_CHUNK_LOGITS // vocab rows, at least 256 (SmolLM2's vocabulary: exactly 256)
    seen = []
    monkeypatch.setattr(packing, "checkpoint", lambda f, *a, **k: seen.append(a[1].shape[0]) or f(*a))
    head_logprobs(torch.nn.Linear(16, 49_152, bias=False), hidden.repeat(6, 1), targets.repeat(6), temps.repeat(6))
    assert seen == [256, 44]
    seen.clear()
    monkeypatch.setattr(packing, "HEAD_CHUNK_LOGITS", 10 * VOCAB)
    head_logprobs(head, hidden.repeat(6, 1), targets.repeat(6), temps.repeat(6))
    assert seen == [256, 44]
    seen.clear()
    monkeypatch.setattr(packing, "HEAD_CHUNK_LOGITS", 1000 * VOCAB)
    head_logprobs(head, hidden.repeat(6, 1), targets.repeat(6), temps.repeat(6))
    assert seen == []  # 300 rows fit one chunk: no checkpointing at all


def test_pack_mask_is_block_causal():
    seg = torch.tensor([0, 0, 1, 1, 2, -1, -1])
    m = pack_mask(seg)
    assert m[3].tolist() == [True, True, True, True, False, False, False]  # suffix 1 sees prefix + itself
    assert m[4].tolist() == [True, True, False, False, True, False, False]  # suffix 2 never sees suffix 1
    assert m[1].tolist() == [True, True, False, False, False, False, False]
    assert bool(m[6, 6]) and not bool(m[6, :6].any())  # padding sees only itself


def test_pack_mask_is_tree_causal():
    # prefix | segment 1 | segment 2 (child of 1) | segment 3 (child of the prefix) | segment 4 (child of 2)
    seg = torch.tensor([0, 0, 1, 1, 2, 3, 3, 4])
    m = pack_mask(seg, [-1, 0, -1, 1])
    assert m[4].tolist() == [True, True, True, True, True, False, False, False]  # its parent and the prefix
    assert m[6].tolist() == [True, True, False, False, False, True, True, False]  # not the sibling branch
    assert m[7].tolist() == [True, True, True, True, True, False, False, True]  # every ancestor


@pytest.mark.parametrize("make_rows", [_rows, _tree_rows], ids=["prefixes", "tree"])
def test_packed_logprobs_equal_unshared_forward(make_rows):
    model, rows = _model(), make_rows()
    batches = micro_batches(plan_packs(rows, min_shared=8), max_tokens=256)
    with torch.no_grad():
        for mb in batches:
            batch = collate_packs(rows, mb)
            got = packed_logprobs(model, batch)
            for k, r in enumerate(batch.rows):
                want = token_logprobs(model, collate([rows[r]]))[0]
                torch.testing.assert_close(got[k, : rows[r].n_tokens], want, atol=1e-5, rtol=1e-5)


def _loss_and_grads(share: bool, make_rows=_rows, **kw):
    model, rows = _model(), make_rows()
    cfg = OptimConfig(share_prefix=share, micro_batch_streams=2, micro_batch_tokens=128, **kw)
    updater = PolicyUpdater(Slot("policy", model, frozenset(Role), make_optimizer(model, cfg)), cfg, 0, pad_id=0)
    updater.prepare(rows)
    model.train()
    n_tokens = sum(r.n_tokens for r in rows)
    total = 0.0
    for batch in updater.batches(rows):
        losses = updater._losses(batch, n_tokens, len(rows))
        loss = sum(lo.loss for lo in losses.values())
        loss.backward()
        total += float(loss)
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("make_rows", [_rows, _tree_rows], ids=["prefixes", "tree"])
@pytest.mark.parametrize("old", ["recompute", "sampling"])
def test_shared_prefix_loss_and_gradients_equal_unshared(old, make_rows):
    shared_loss, shared_grads = _loss_and_grads(True, make_rows, old_logprobs=old, grad_checkpointing="off")
    plain_loss, plain_grads = _loss_and_grads(False, make_rows, old_logprobs=old, grad_checkpointing="off")
    assert shared_loss == pytest.approx(plain_loss, abs=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    assert any(float(g.abs().sum()) > 0 for g in plain_grads.values())


def test_gradient_checkpointing_changes_nothing():
    on_loss, on_grads = _loss_and_grads(True, grad_checkpointing="on")
    off_loss, off_grads = _loss_and_grads(True, grad_checkpointing="off")
    assert on_loss == pytest.approx(off_loss, abs=1e-7)
    for name, grad in off_grads.items():
        torch.testing.assert_close(on_grads[name], grad, atol=1e-7, rtol=1e-6, msg=name)


def test_checkpointing_leaves_the_model_decodable_by_lean_llama():
    """HF's checkpointing hooks the input embeddings (and leaves the hook when switched off); a hooked
    model fails ``LeanLlama.supports``, which sent every float32 rollout after the first update through
    HF's slower forward."""
    model = _model()
    assert LeanLlama.supports(model)
    for on in (True, False, True):
        set_checkpointing(model, on)
        assert model.is_gradient_checkpointing == on
        assert LeanLlama.supports(model), f"checkpointing {'on' if on else 'off'}"
    assert BatchedStreams(model, [0], pad_id=0).lean is not None


def test_checkpointing_auto_by_activation_size():
    big = type("M", (), {"config": LlamaConfig(num_hidden_layers=30, hidden_size=576)})()
    assert needs_checkpointing(big, 4096, "fp32", "auto") and not needs_checkpointing(_model(), 4096, "fp32", "auto")
    assert needs_checkpointing(_model(), 8, "fp32", "on") and not needs_checkpointing(big, 1 << 20, "bf16", "off")
    with pytest.raises(ValueError, match="grad_checkpointing"):
        needs_checkpointing(big, 1, "fp32", "sometimes")


# bf16 autocast vs fp32 on the tiny model: a bf16 matmul rounds to 8 mantissa bits, so per-token
# log-probs move by a few hundredths (measured max ~0.03 at this size); the mean gap stays far smaller
BF16_MEAN_TOL, BF16_MAX_TOL = 0.02, 0.1


def test_bf16_logprobs_agree_with_fp32():
    model, rows = _model(), _rows()
    batch = collate_packs(rows, plan_packs(rows, min_shared=8))
    with torch.no_grad():
        fp32 = packed_logprobs(model, batch)
        with autocast("bf16"):
            bf16 = packed_logprobs(model, batch).float()
    gap = (bf16 - fp32).abs()[batch.mask]
    assert float(gap.mean()) < BF16_MEAN_TOL and float(gap.max()) < BF16_MAX_TOL
    assert float(gap.max()) > 0  # it did run in bf16
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_precision_resolution():
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"
    assert resolve_precision("auto") in ("fp32", "bf16")
    assert set(PRECISIONS) == {"auto", "fp32", "bf16"}
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp16")


def test_model_probe_measures_the_model_and_leaves_it_as_it_was(caplog):
    model = _model(layers=6)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    names, rng = [n for n, _ in model.named_parameters()], torch.get_rng_state()
    ratio = model_bf16_speedup(model, torch.get_num_threads())
    assert ratio is not None and ratio > 0
    assert model_bf16_speedup(model, torch.get_num_threads()) == ratio  # cached per shape and thread count
    assert len(model.model.layers) == 6 and [n for n, _ in model.named_parameters()] == names
    assert torch.equal(torch.get_rng_state(), rng) and not model.training
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)
    with caplog.at_level(logging.INFO, logger="envace.runtime.precision"):
        chosen = resolve_precision("auto", model=model)
    if cpu_has_bf16():  # the model's own measurement decides
        assert chosen == ("bf16" if ratio >= BF16_MIN_SPEEDUP else "fp32")
        assert f"{ratio:.2f}x on the model's decoder" in caplog.text
    else:
        assert chosen == "fp32"
    assert decoder_of(torch.nn.Linear(4, 4)) is None  # no decoder: the matmul probe decides
    assert model_bf16_speedup(torch.nn.Linear(4, 4), 1) is None


def test_bf16_update_keeps_fp32_state_and_learns():
    model, rows = _model(), _rows()
    before = copy.deepcopy(model)
    cfg = OptimConfig(lr=1e-2)
    opt = make_optimizer(model, cfg)
    updater = PolicyUpdater(Slot("policy", model, frozenset(Role), opt), cfg, 0, 0, precision="bf16")
    updater.prepare(rows)
    metrics = updater.update(rows, step=0)
    assert metrics["grad_norm"] > 0 and abs(metrics["rollout/logprob_diff"]) > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(
        v.dtype == torch.float32 for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
    )
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), before.parameters()))


def test_threads_auto_is_measured_and_explicit_counts_are_validated(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    precision.auto_threads.cache_clear()
    chosen = resolve_threads("auto")
    assert chosen in (1, cores) and torch.get_num_threads() == 1  # the probe restores the thread count
    assert resolve_threads(2) == 2 and resolve_threads("3") == 3
    with pytest.raises(ValueError, match="num_threads"):
        resolve_threads(0)
    # busy neighbours or a single usable core: one thread, whatever the probe would say
    precision.auto_threads.cache_clear()
    monkeypatch.setattr(precision, "foreign_cpu_cores", lambda seconds: 1.0)
    assert resolve_threads("auto") == 1
    precision.auto_threads.cache_clear()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert resolve_threads("auto") == 1
    precision.auto_threads.cache_clear()
    foreign = precision.foreign_cpu_cores(0.05)
    assert foreign is None or foreign >= 0.0


def test_packed_forward_attends_segment_by_segment(monkeypatch):
    """The packed batch's mask carries its layout, and the attention runs per segment (not over L × L)."""
    calls = []
    real = attention.segment_attention
    monkeypatch.setattr(attention, "segment_attention", lambda *a: calls.append(a[3]) or real(*a))
    model, rows = _model(), _rows()
    batch = collate_packs(rows, plan_packs(rows, min_shared=8))
    with torch.no_grad():
        packed_logprobs(model, batch)
    assert len(calls) == 2  # one call per layer
    assert any(len(spans) > 1 for _, spans in calls[0].rows)  # a pack with several suffixes


# packed layouts: (prefix_len, suffix spans) per row. "mixed": every suffix its own length, one row per
# layout. "runs": rows sharing a layout (batched together, in and out of order: rows 0, 2, 4 and 1, 3), runs
# of equal-length suffixes (batched per run), a lone suffix in a shared layout (rows 1 and 3), 1-token
# suffixes and a row with no suffix
LAYOUTS = {
    "mixed": (23, ((6, ((6, 10), (10, 15), (15, 21))), (9, ((9, 12),)), (20, ()))),
    "runs": (
        26,
        (
            (5, ((5, 9), (9, 13), (13, 17), (17, 20), (20, 23))),
            (7, ((7, 13), (13, 19), (19, 22))),
            (5, ((5, 9), (9, 13), (13, 17), (17, 20), (20, 23))),
            (7, ((7, 13), (13, 19), (19, 22))),
            (5, ((5, 9), (9, 13), (13, 17), (17, 20), (20, 23))),
            (10, ((10, 11), (11, 12), (12, 13))),
            (26, ()),
        ),
    ),
    # trie segments (start, end, parent): two children of the prefix (3 tokens each); the first has two
    # children (2 each), the second one (2); the first grandchild has a child of its own (4)
    "tree": (
        20,
        (
            (4, ((4, 7, -1), (7, 10, -1), (10, 12, 0), (12, 14, 0), (14, 16, 1), (16, 20, 2))),
            (6, ((6, 9, -1), (9, 11, 0), (11, 13, 0), (13, 14, -1))),
        ),
    ),
}


def test_layout_row_sets_and_equal_runs():
    width, rows = LAYOUTS["runs"]
    layout = PackLayout(width, rows)
    sets = layout.row_sets()
    assert [members for members, _ in sets] == [[0, 2, 4], [1, 3], [5], [6]]
    assert attention._equal_runs(layout.rows[0][1]) == [(5, 3, 4, -1), (17, 2, 3, -1)]
    assert attention._equal_runs(layout.rows[5][1]) == [(10, 3, 1, -1)]
    assert attention._equal_runs(()) == []
    # siblings of equal length run together only behind the same parent
    tree = PackLayout(*LAYOUTS["tree"]).rows[0][1]
    assert attention._equal_runs(tree) == [(4, 2, 3, -1), (10, 2, 2, 0), (14, 1, 2, 1), (16, 1, 4, 2)]
    with pytest.raises(ValueError, match="parent"):
        PackLayout(8, ((2, ((2, 4, 1), (4, 6, -1))),))


@pytest.mark.parametrize("layouts", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flash_min", [0, 8, 10**9], ids=["prefix-flash", "mixed", "prefix-matmul"])
def test_segment_attention_equals_masked_attention_with_gradients(dtype, flash_min, layouts, monkeypatch):
    """Segment-wise attention = one SDPA under the block-causal pack mask: outputs and input gradients.

    ``flash_min`` moves the prefix-length threshold of the flash kernel, so that every prefix, some, or none
    takes it (at the real threshold, 384 tokens, these toy prefixes would never reach it).
    """
    monkeypatch.setattr(attention, "CAUSAL_FLASH_MIN_TOKENS", flash_min)
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    width, rows = LAYOUTS[layouts]
    layout = PackLayout(width, rows)
    seg = torch.full((len(rows), width), -1)
    parents = []
    for b, (prefix, spans) in enumerate(layout.rows):
        seg[b, :prefix] = 0
        for j, (s, e, _) in enumerate(spans, start=1):
            seg[b, s:e] = j
        parents.append([parent for _, _, parent in spans])
    mask = torch.stack([pack_mask(s, par) for s, par in zip(seg, parents)]).unsqueeze(1)
    q = torch.randn(len(rows), heads, width, dim, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(len(rows), kv_heads, width, dim, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(len(rows), kv_heads, width, dim, generator=g, dtype=dtype, requires_grad=True)
    got = segment_attention(q, k, v, layout, None)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    real = (seg >= 0)[:, :, None, None]  # padding positions are not compared (nothing reads them)
    tol = {"atol": 5e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got * real, want * real, **tol)
    weights = torch.randn(got.shape, generator=g, dtype=dtype) * real
    grads_got = torch.autograd.grad((got * weights).sum(), (q, k, v))
    grads_want = torch.autograd.grad((want * weights).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, **tol)
