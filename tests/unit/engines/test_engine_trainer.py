"""PolicyUpdater: old log-probs, frozen roles, per-role gradient bookkeeping, KL to a reference."""

from __future__ import annotations

import contextlib
import copy
import math
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envace.core.records import Role, Segment, Stream, Trajectory
from envace.engines import get_variant
from envace.engines.local import OptimConfig
from envace.engines.local import sft as sft_module
from envace.engines.local import trainer as trainer_module
from envace.engines.local.batching import build_rows
from envace.engines.local.config import SFTConfig
from envace.engines.local.sft import sft_epoch
from envace.engines.local.trainer import (
    PolicyUpdater,
    Slot,
    compute_output_advantages,
    flat_gradients,
    make_optimizer,
)

torch.set_num_threads(1)
TEMPS = {Role.ACT: 1.0, Role.REHEARSE: 0.7}


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=40,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    ).eval()


def _trajs(n=4):
    g = torch.Generator().manual_seed(1)
    rand = lambda k: tuple(int(x) for x in torch.randint(1, 40, (k,), generator=g))
    out = []
    for i in range(n):
        act = Stream(
            Role.ACT,
            (
                Segment(rand(6)),
                Segment(rand(4), Role.ACT, (-1.0,) * 4),
                Segment(rand(3)),
                Segment(rand(5), Role.ACT, (-1.0,) * 5),
            ),
        )
        reh = Stream(Role.REHEARSE, (Segment(rand(5)), Segment(rand(4), Role.REHEARSE, (-1.0,) * 4)))
        out.append(Trajectory("p", i, streams=(act, reh), reward=float(i % 3) / 2))
    return out


def _rows(variant="envace", roles=frozenset(Role)):
    trajs = _trajs()
    adv = compute_output_advantages(trajs, [0] * len(trajs), get_variant(variant), OptimConfig())
    return build_rows(trajs, adv.values.tolist(), roles, TEMPS, adv.excluded)


def _update(cfg, roles=frozenset(Role), ref=False):
    model = _model()
    slot = Slot("policy", model, roles, make_optimizer(model, cfg), copy.deepcopy(model) if ref else None)
    updater = PolicyUpdater(slot, cfg, seed=0, pad_id=0)
    rows = _rows(roles=roles)
    diff = updater.prepare(rows)
    return model, updater.update(rows, step=0), rows, diff


def test_recompute_starts_at_ratio_one_and_changes_weights():
    cfg = OptimConfig(lr=1e-2, ppo_epochs=2)
    model, metrics, rows, diff = _update(cfg)
    assert diff > 0  # the synthetic sampling log-probs (-1.0) are not the model's
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), _model().parameters()))
    assert all(r.old_logprobs is not None and r.old_logprobs.shape == r.positions.shape for r in rows)


def test_single_pass_takes_old_logprobs_from_the_update_forward():
    """ppo_epochs=1, one mini-batch: no extra forward; ratio exactly 1; the gap is measured for free."""
    model, metrics, rows, diff = _update(OptimConfig(lr=1e-2, ppo_epochs=1))
    assert diff is None and all(r.old_logprobs is None for r in rows)  # prepare ran no forward
    assert metrics["clipfrac"] == 0.0 and metrics["grad_norm"] > 0
    checked, checked_metrics, _, check_diff = _update(OptimConfig(lr=1e-2, ppo_epochs=1, logprob_check=True))
    assert metrics["rollout/logprob_diff"] == pytest.approx(check_diff, abs=1e-6)  # same quantity, opt-in pass
    assert "rollout/logprob_diff" not in checked_metrics
    for a, b in zip(model.parameters(), checked.parameters()):  # the check does not change the update
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_mini_batches_split_each_epoch_into_that_many_optimiser_steps():
    """``mini_batches`` k: ceil(rows / k) rows per optimiser step (``mini_batch_streams``, when set, wins);
    the same split as the equivalent ``mini_batch_streams`` gives the same weights."""
    n_rows = len(_rows())
    steps = []
    for cfg in (OptimConfig(lr=1e-2, mini_batches=3), OptimConfig(lr=1e-2, mini_batch_streams=math.ceil(n_rows / 3))):
        model = _model()
        optimizer = make_optimizer(model, cfg)
        counted = []
        optimizer.register_step_post_hook(lambda *_, seen=counted: seen.append(1))
        updater = PolicyUpdater(Slot("policy", model, frozenset(Role), optimizer, None), cfg, seed=0, pad_id=0)
        assert updater.mini_batch_size(n_rows) == math.ceil(n_rows / 3) and not updater.single_pass(_rows())
        rows = _rows()
        updater.prepare(rows)
        updater.update(rows, step=0)
        steps.append((len(counted), model))
    assert steps[0][0] == steps[1][0] == 3
    for a, b in zip(steps[0][1].parameters(), steps[1][1].parameters()):
        assert torch.equal(a, b)
    one = PolicyUpdater(Slot("policy", _model(), frozenset(Role), None, None), OptimConfig(), seed=0, pad_id=0)
    assert one.mini_batch_size(n_rows) == n_rows and one.single_pass(_rows())


def test_sampling_logprobs_mode_reuses_rollout_values():
    cfg = OptimConfig(old_logprobs="sampling", lr=1e-2)
    _, _, rows, _ = _update(cfg)
    assert all(torch.equal(r.old_logprobs, r.sampling_logprobs) for r in rows)
    with pytest.raises(ValueError, match="old_logprobs"):
        _update(OptimConfig(old_logprobs="nope"))


def test_role_grad_tracking_does_not_change_the_update():
    plain, m1, _, _ = _update(OptimConfig(lr=1e-2, micro_batch_streams=3, mini_batch_streams=4, ppo_epochs=2))
    tracked, m2, _, _ = _update(
        OptimConfig(lr=1e-2, micro_batch_streams=3, mini_batch_streams=4, ppo_epochs=2, track_role_grad_norms=True)
    )
    for a, b in zip(plain.parameters(), tracked.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert m2["grad_norm/act"] > 0 and m2["grad_norm/rehearse"] > 0
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6)


def test_flat_gradient_buffer_is_bit_identical_and_released(monkeypatch):
    """Gradients accumulated into one flat buffer equal torch's own per-parameter ones bit for bit."""
    cfg = OptimConfig(lr=1e-2, micro_batch_streams=1, share_prefix=False, ppo_epochs=2)  # 4 backwards per step
    flat, m1, _, _ = _update(cfg)
    assert all(p.grad is None for p in flat.parameters())  # nothing held into the next rollout
    monkeypatch.setattr(trainer_module, "flat_gradients", lambda model: contextlib.nullcontext())
    own, m2, _, _ = _update(cfg)
    for a, b in zip(flat.parameters(), own.parameters()):
        assert torch.equal(a, b)
    assert m1 == m2


def test_sft_epoch_with_the_flat_gradient_buffer_is_bit_identical(monkeypatch):
    def epoch():
        model = _model()
        opt = make_optimizer(model, OptimConfig(), lr=1e-2)
        rows = _rows()
        for e in range(2):  # two epochs: the second steps moments created by the first
            sft_epoch(model, opt, rows, SFTConfig(batch_streams=2), epoch=e, seed=0, pad_id=0)
        assert all(p.grad is None for p in model.parameters())
        return model

    flat = epoch()
    monkeypatch.setattr(sft_module, "flat_gradients", lambda model: contextlib.nullcontext())
    own = epoch()
    for a, b in zip(flat.parameters(), own.parameters()):
        assert torch.equal(a, b)


def test_flat_gradients_view_one_buffer_and_unreached_parameters_get_none():
    model = _model()
    model.lm_head.weight.requires_grad_(False)  # frozen: never given a gradient
    trainable = [p for p in model.parameters() if p.requires_grad]
    with flat_gradients(model):
        assert all(p.grad is not None and not p.grad.any() for p in trainable)
        assert len({p.grad.untyped_storage().data_ptr() for p in trainable}) == 1
        ids = torch.tensor([[1, 2, 3]])
        model.model.embed_tokens(ids).sum().backward()  # reaches the embedding only
    assert model.lm_head.weight.grad is None
    assert model.model.embed_tokens.weight.grad is not None and model.model.embed_tokens.weight.grad.any()
    assert all(p.grad is None for p in model.model.layers.parameters())  # no backward reached them
    with flat_gradients(model):
        pass  # no backward at all: the optimiser would skip every parameter, as without the buffer
    assert all(p.grad is None for p in model.model.layers.parameters())


def test_frozen_role_has_no_rows_and_no_gradient():
    _, metrics, rows, _ = _update(OptimConfig(lr=1e-2, track_role_grad_norms=True), roles=frozenset({Role.ACT}))
    assert {int(x) for r in rows for x in r.roles} == {int(Role.ACT)}
    assert "grad_norm/rehearse" not in metrics and metrics["grad_norm/act"] > 0


def test_kl_to_reference_is_reported_and_grows():
    cfg = OptimConfig(lr=5e-2, kl_coef=0.1, ppo_epochs=3)
    _, metrics, rows, _ = _update(cfg, ref=True)
    assert all(r.ref_logprobs is not None for r in rows)
    assert metrics["kl"] > 0  # the policy moved away from its frozen reference during the epochs


def test_segmented_micro_batches_scale_with_the_activation_width():
    """SmolLM2 (and anything wider) keeps SEGMENTED_BATCH_TOKENS per segment-wise forward; a narrower model
    takes proportionally more tokens (the same activation memory); a model without a Llama-like config keeps
    the SmolLM2 cap."""
    from envace.engines.local.trainer import SEGMENTED_BATCH_TOKENS, segmented_batch_tokens

    def shaped(**sizes):
        holder = torch.nn.Module()
        holder.config = LlamaConfig(**sizes)
        return holder

    smollm2 = dict(vocab_size=49152, num_hidden_layers=30, hidden_size=576, intermediate_size=1536)
    assert segmented_batch_tokens(shaped(**smollm2)) == SEGMENTED_BATCH_TOKENS
    assert segmented_batch_tokens(shaped(**{**smollm2, "vocab_size": 151936})) == SEGMENTED_BATCH_TOKENS
    half = {**smollm2, "vocab_size": 49152 // 2, "hidden_size": 576 // 2, "intermediate_size": 1536 // 2}
    assert segmented_batch_tokens(shaped(**half)) == 2 * SEGMENTED_BATCH_TOKENS
    assert segmented_batch_tokens(torch.nn.Linear(2, 2)) == SEGMENTED_BATCH_TOKENS


def test_sft_cosine_schedule_warms_up_decays_and_is_set_per_step():
    cfg = SFTConfig(lr=1e-3, schedule="cosine", warmup_frac=0.1, min_lr_frac=0.1, batch_streams=2)
    total = 20
    lrs = [cfg.lr_at(s, total) for s in range(total)]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)  # 2 warm-up steps
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))  # then never rises
    assert lrs[-1] == pytest.approx(1e-4)  # ends at min_lr_frac x lr
    assert SFTConfig(lr=1e-3).lr_at(7, total) == 1e-3  # constant
    with pytest.raises(ValueError, match="schedule"):
        SFTConfig(schedule="linear")
    # sft_epoch sets each step's rate from the global step: epoch 1 of 2 ends on the schedule's last value
    model = _model()
    opt = make_optimizer(model, OptimConfig(), lr=cfg.lr)
    rows = _rows()
    per_epoch = sft_module.steps_per_epoch(rows, cfg)
    sft_epoch(model, opt, rows, cfg, epoch=1, seed=0, pad_id=0, total_steps=2 * per_epoch)
    assert opt.param_groups[0]["lr"] == pytest.approx(cfg.lr_at(2 * per_epoch - 1, 2 * per_epoch))


def test_sft_prefix_batching_groups_streams_with_one_opening():
    from envace.engines.local.sft import PREFIX_KEY_TOKENS, sft_batches

    def row(opening: int, n: int):
        ids = torch.tensor([opening] * PREFIX_KEY_TOKENS + list(range(n)))
        return SimpleNamespace(input_ids=ids)

    rows = [row(k % 3, k) for k in range(11)]  # openings 0,1,2: groups of 4, 4 and 3 streams
    cfg = SFTConfig(batch_streams=2, batching="prefix")
    plan = sft_batches(rows, cfg, seed=5)
    assert sorted(i for b in plan for i in b) == list(range(11))  # every stream once
    full = [b for b in plan if len({k % 3 for k in b}) == 1 and len(b) == 2]
    assert len(full) == 5  # 2 + 2 + 1 full same-opening batches, then the remainders (one of 0, 1 and 2)
    assert len(plan) == 6 and len(sft_batches(rows, cfg, seed=6)) == 6  # the count never depends on the seed
    assert sft_batches(rows, cfg, seed=5) == plan  # deterministic
    shuffled = sft_batches(rows, SFTConfig(batch_streams=2), seed=5)
    order = list(range(11))
    random.Random(5).shuffle(order)
    assert shuffled == [order[i : i + 2] for i in range(0, 11, 2)]  # the old order, unchanged
    with pytest.raises(ValueError, match="batching"):
        SFTConfig(batching="sorted")
