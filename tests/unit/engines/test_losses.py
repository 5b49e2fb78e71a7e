"""The clipped policy loss: hand numbers for clipping, masking, aggregation and KL, and equality with verl.

The equivalence tests import verl's ``core_algos`` (inside a fixture, so that the other tests of this
process never load verl) and compare losses, gradients and metrics on random batches: every aggregation
mode, KL estimator and clip setting, with and without global-batch normalisation, in fp32 and bf16.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from envace.engines.losses import AGG_MODES, KL_TYPES, LossOutput, compute_policy_loss


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor([values])


def test_clipping_by_hand() -> None:
    # tokens: (A, ratio) = (+1, 1.5) clipped at 1.2; (+1, 0.5) unclipped; (−1, 0.5) clipped at 0.8; (−1, 1.1) inside
    ratios = [1.5, 0.5, 0.5, 1.1]
    log_probs = torch.log(_row(ratios)).requires_grad_(True)
    out = compute_policy_loss(log_probs, torch.zeros(1, 4), _row([1.0, 1.0, -1.0, -1.0]), torch.ones(1, 4))
    # per-token losses: −1.2, −0.5, +0.8, +1.1 → token-mean 0.05
    assert out.pg_loss.item() == pytest.approx(0.05, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.05, abs=1e-6)
    assert out.clipfrac == pytest.approx(0.5) and out.clipfrac_lower == 0.0
    assert out.ppo_kl == pytest.approx(-sum(math.log(r) for r in ratios) / 4, abs=1e-6)
    out.loss.backward()
    # d/dlogρ of −A·ρ is −A·ρ; clipped tokens get no gradient; token-mean divides by 4
    assert log_probs.grad.tolist()[0] == pytest.approx([0.0, -0.125, 0.0, 0.275], abs=1e-6)


def test_dual_clip_and_custom_ratio() -> None:
    out = compute_policy_loss(torch.log(_row([4.0])), torch.zeros(1, 1), _row([-1.0]), torch.ones(1, 1))
    assert out.pg_loss.item() == pytest.approx(3.0) and out.clipfrac_lower == 1.0  # −A·c with c = 3
    narrow = compute_policy_loss(
        torch.log(_row([1.15])), torch.zeros(1, 1), _row([1.0]), torch.ones(1, 1), clip_ratio=0.1
    )
    assert narrow.pg_loss.item() == pytest.approx(-1.1) and narrow.clipfrac == 1.0
    default = compute_policy_loss(torch.log(_row([1.15])), torch.zeros(1, 1), _row([1.0]), torch.ones(1, 1))
    assert default.pg_loss.item() == pytest.approx(-1.15) and default.clipfrac == 0.0


def test_matches_textbook_formula_on_random_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    log_probs = torch.randn(3, 6, generator=gen) * 0.3
    old = log_probs + torch.randn(3, 6, generator=gen) * 0.2
    adv = torch.randn(3, 1, generator=gen).expand(3, 6)
    mask = (torch.rand(3, 6, generator=gen) > 0.3).float()
    out = compute_policy_loss(log_probs, old, adv, mask)
    ratio = torch.exp(log_probs - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    assert out.pg_loss.item() == pytest.approx(float((per_token * mask).sum() / mask.sum()), abs=1e-6)
    assert math.isfinite(out.loss.item())


def test_gradient_only_through_masked_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    log_probs = (torch.randn(2, 5, generator=gen) * 0.1).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 0]])
    adv = torch.tensor([[0.7] * 5, [-0.4] * 5])
    ref = log_probs.detach() + 0.05
    out = compute_policy_loss(log_probs, log_probs.detach(), adv, mask, kl_coef=0.1, ref_log_probs=ref)
    out.loss.backward()
    grad = log_probs.grad
    assert torch.all(grad[mask == 0] == 0)
    assert torch.all(grad[mask == 1] != 0)


def test_token_mean_vs_sequence_mean() -> None:
    # ratio 1 everywhere, per-token loss = −A: row 0 has three tokens of −1, row 1 one token of +3
    adv = torch.tensor([[1.0, 1.0, 1.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    zeros = torch.zeros(2, 3)
    assert compute_policy_loss(zeros, zeros, adv, mask).pg_loss.item() == pytest.approx(0.0)
    seq = compute_policy_loss(zeros, zeros, adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert seq.pg_loss.item() == pytest.approx(1.0)


def test_kl_zero_at_reference_and_low_var_kl_by_hand() -> None:
    log_probs = torch.log(torch.tensor([[0.3, 0.6]]))
    adv = torch.tensor([[0.5, 0.5]])
    same = compute_policy_loss(log_probs, log_probs, adv, torch.ones(1, 2), kl_coef=1e-4, ref_log_probs=log_probs)
    assert same.kl.item() == 0.0 and same.loss.item() == same.pg_loss.item()
    # ref = 2·π on token 0 only: r = log 2, k3 = e^r − r − 1 = 1 − log 2; token-mean over 2 tokens
    ref = log_probs + torch.tensor([[math.log(2.0), 0.0]])
    out = compute_policy_loss(log_probs, log_probs, adv, torch.ones(1, 2), kl_coef=0.5, ref_log_probs=ref)
    expected_kl = (1 - math.log(2.0)) / 2
    assert out.kl.item() == pytest.approx(expected_kl, abs=1e-6)
    assert out.loss.item() == pytest.approx(out.pg_loss.item() + 0.5 * expected_kl, abs=1e-6)


def test_empty_mask_gives_zero_loss_with_graph() -> None:
    log_probs = torch.zeros(2, 3, requires_grad=True)
    out = compute_policy_loss(log_probs, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3))
    assert isinstance(out, LossOutput) and out.loss.item() == 0.0 and out.n_tokens == 0
    out.loss.backward()
    assert torch.all(log_probs.grad == 0)


def test_global_batch_info_normalises_over_global_tokens() -> None:
    zeros = torch.zeros(1, 2)
    out = compute_policy_loss(
        zeros,
        zeros,
        torch.tensor([[1.0, 1.0]]),
        torch.ones(1, 2),
        global_batch_info={"dp_size": 1, "batch_num_tokens": 8},
    )
    assert out.pg_loss.item() == pytest.approx(-2.0 / 8)


def test_errors_and_metrics() -> None:
    x = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="needs ref_log_probs"):
        compute_policy_loss(x, x, x, torch.ones(1, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match="advantages has shape"):
        compute_policy_loss(x, x, torch.zeros(1), torch.ones(1, 3))
    metrics = compute_policy_loss(x, x, x, torch.ones(1, 3)).metrics()
    assert set(metrics) >= {"actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac", "actor/ppo_kl"}
    assert all(isinstance(v, float) for v in metrics.values())


# --- equality with verl's core_algos ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def core_algos() -> Any:
    # verl (and Ray under it) is imported here only: the loss itself must never load it
    from verl.trainer.ppo import core_algos

    return core_algos


def _verl_loss(core_algos: Any, log_probs, old, adv, mask, ref, *, kl_coef, kl_type, mode, info, clip) -> tuple:
    """verl's vanilla policy loss plus β·agg(kl_penalty), as verl's actor sums them; returns (loss, pg, kl, metrics)."""
    config = OmegaConf.create({"clip_ratio_low": None, "clip_ratio_high": None, **clip, "global_batch_info": info})
    pg, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=log_probs, advantages=adv, response_mask=mask, loss_agg_mode=mode, config=config
    )
    kl = core_algos.agg_loss(core_algos.kl_penalty(log_probs, ref, kl_type), mask, mode, **info)
    return pg + kl_coef * kl, pg, kl, metrics


def _random_batch(seed: int, shape: tuple[int, int], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Log-probs with ratios from ~e^-3 to ~e^3 (both clip bounds and the dual clip active), one log-ratio past
    the ±20 guard, per-row and per-token advantages of both signs, a ragged mask with one empty row."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape
    log_probs = -torch.rand(shape, generator=gen) * 4
    old = log_probs + torch.randn(shape, generator=gen) * 1.2
    old[0, 0] = log_probs[0, 0] + 25.0
    adv = torch.randn(rows, 1, generator=gen).expand(shape) + 0.5 * torch.randn(shape, generator=gen)
    mask = torch.rand(shape, generator=gen) > 0.3
    mask[0, :] = True
    if rows > 2:
        mask[-1, :] = False
    ref = log_probs + torch.randn(shape, generator=gen) * 0.5
    ref[-1, -1] = log_probs[-1, -1] - 30.0  # low_var_kl past its ±10 guard
    batch = {"log_probs": log_probs, "old": old, "adv": adv, "ref": ref}
    return {**{k: v.to(dtype) for k, v in batch.items()}, "mask": mask}


CLIPS = (
    {"clip_ratio": 0.2},
    {"clip_ratio": 0.1, "clip_ratio_c": 2.0},
    {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0},
)


def _batch_infos(mask: torch.Tensor) -> list[dict[str, int]]:
    tokens, rows = int(mask.sum()), mask.shape[0]
    return [
        {},
        {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": rows},
        {"dp_size": 2, "batch_num_tokens": 3 * tokens, "global_batch_size": 2 * rows, "loss_scale_factor": 7},
    ]


def _ours_and_verl(core_algos: Any, batch: dict, **kw: Any) -> tuple[tuple, tuple]:
    """Both losses on fresh leaf copies of the log-probs, after backward; each returns (output…, grad)."""
    lp_ours = batch["log_probs"].clone().requires_grad_(True)
    lp_verl = batch["log_probs"].clone().requires_grad_(True)
    args = (batch["old"], batch["adv"], batch["mask"])
    ours = compute_policy_loss(
        lp_ours,
        *args,
        **kw["clip"],
        kl_coef=kw["kl_coef"],
        ref_log_probs=batch["ref"],
        kl_type=kw["kl_type"],
        loss_agg_mode=kw["mode"],
        global_batch_info=kw["info"] or None,
    )
    ours.loss.backward()
    loss, pg, kl, metrics = _verl_loss(core_algos, lp_verl, *args, batch["ref"], **kw)
    loss.backward()
    return (ours, lp_ours.grad), ((loss, pg, kl, metrics), lp_verl.grad)


def _assert_same(ours: tuple, theirs: tuple, atol: float, rtol: float) -> None:
    (out, grad), ((loss, pg, kl, metrics), verl_grad) = ours, theirs
    for mine, ref in ((out.loss, loss), (out.pg_loss, pg), (out.kl, kl), (grad, verl_grad)):
        torch.testing.assert_close(mine.float(), ref.float(), atol=atol, rtol=rtol)
    assert out.clipfrac == pytest.approx(metrics["actor/pg_clipfrac"], abs=atol)
    assert out.clipfrac_lower == pytest.approx(metrics["actor/pg_clipfrac_lower"], abs=atol)
    assert out.ppo_kl == pytest.approx(metrics["actor/ppo_kl"], abs=max(atol, rtol * abs(out.ppo_kl)))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_equals_verl_over_modes_clips_and_batch_info(core_algos: Any, mode: str) -> None:
    for seed, shape in ((0, (1, 1)), (1, (3, 7)), (2, (5, 33))):
        batch = _random_batch(seed, shape, torch.float32)
        for clip, info in itertools.product(CLIPS, _batch_infos(batch["mask"])):
            kw = {"clip": clip, "kl_coef": 0.05, "kl_type": "low_var_kl", "mode": mode, "info": info}
            ours, theirs = _ours_and_verl(core_algos, batch, **kw)
            _assert_same(ours, theirs, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_equals_verl_for_every_kl_estimator(core_algos: Any, kl_type: str) -> None:
    batch = _random_batch(3, (4, 9), torch.float32)
    for mode in ("token-mean", "seq-mean-token-mean"):
        kw = {"clip": CLIPS[0], "kl_coef": 0.3, "kl_type": kl_type, "mode": mode, "info": {}}
        ours, theirs = _ours_and_verl(core_algos, batch, **kw)
        _assert_same(ours, theirs, atol=1e-6, rtol=1e-6)


def test_local_trainer_call_is_bitwise_equal_to_verl(core_algos: Any) -> None:
    # the exact call of envace.engines.local.trainer: token-mean over the mini-batch's tokens, default clip
    batch = _random_batch(4, (6, 40), torch.float32)
    info = {"dp_size": 1, "batch_num_tokens": int(batch["mask"].sum()) + 11, "global_batch_size": 9}
    kw = {"clip": {"clip_ratio": 0.2}, "kl_coef": 0.01, "kl_type": "low_var_kl", "mode": "token-mean", "info": info}
    (out, grad), ((loss, pg, kl, metrics), verl_grad) = _ours_and_verl(core_algos, batch, **kw)
    assert torch.equal(out.loss, loss) and torch.equal(out.pg_loss, pg) and torch.equal(out.kl, kl)
    assert torch.equal(grad, verl_grad)
    assert (out.clipfrac, out.ppo_kl) == (metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"])


@pytest.mark.parametrize("mode", AGG_MODES)
def test_equals_verl_in_bf16(core_algos: Any, mode: str) -> None:
    batch = _random_batch(5, (4, 17), torch.bfloat16)
    for info in _batch_infos(batch["mask"]):
        kw = {"clip": CLIPS[2], "kl_coef": 0.05, "kl_type": "k3+", "mode": mode, "info": info}
        ours, theirs = _ours_and_verl(core_algos, batch, **kw)
        _assert_same(ours, theirs, atol=0.0, rtol=0.0)  # exact: same ops, bf16 row sums widened as verl does


def test_same_errors_as_verl_for_bad_settings(core_algos: Any) -> None:
    x, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        compute_policy_loss(x, x, x, mask, global_batch_info={"dp_size": 2})
    with pytest.raises(ValueError, match="global_batch_size"):
        compute_policy_loss(x, x, x, mask, loss_agg_mode="seq-mean-token-sum", global_batch_info={"dp_size": 2})
    with pytest.raises(ValueError, match="loss_agg_mode 'token-average'.*token-mean"):
        compute_policy_loss(x, x, x, mask, loss_agg_mode="token-average")
    with pytest.raises(ValueError, match="kl_type 'k4'.*low_var_kl"):
        compute_policy_loss(x, x, x, mask, ref_log_probs=x, kl_type="k4")
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(x, x, x, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="global_batch_info key 'tokens'"):
        compute_policy_loss(x, x, x, mask, global_batch_info={"tokens": 6})
    for mode, info in (("token-mean", {"dp_size": 2}), ("seq-mean-token-sum", {"dp_size": 2})):
        with pytest.raises(ValueError):
            core_algos.agg_loss(x, mask, mode, **info)
