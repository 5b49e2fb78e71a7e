"""Clipped policy loss on top of verl: hand numbers for clipping, masking, aggregation and KL."""

from __future__ import annotations

import math

import pytest
import torch

from envace.engines.losses import LossOutput, compute_policy_loss


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
