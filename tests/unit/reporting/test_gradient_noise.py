"""The gradient noise scale (envace.reporting.gradient_noise) recovers known signal and noise."""

from __future__ import annotations

import pytest
import torch

from envace.reporting.gradient_noise import noise_scale


def draws(n: int, dim: int, signal: float, noise_var: float, seed: int = 0) -> list[torch.Tensor]:
    """``n`` vectors: a fixed mean of squared norm ``signal`` plus isotropic noise of total variance ``noise_var``."""
    gen = torch.Generator().manual_seed(seed)
    mean = torch.randn(dim, generator=gen, dtype=torch.float64)
    mean *= signal**0.5 / mean.norm()
    return [mean + torch.randn(dim, generator=gen, dtype=torch.float64) * (noise_var / dim) ** 0.5 for _ in range(n)]


def test_signal_noise_and_scale_are_recovered_and_cosines_follow_the_prediction():
    out = noise_scale(draws(32, 20_000, signal=1.0, noise_var=4.0))
    assert out["signal_sq_norm"] == pytest.approx(1.0, rel=0.1)
    assert out["noise_var"] == pytest.approx(4.0, rel=0.1)
    assert out["noise_scale_steps"] == pytest.approx(4.0, rel=0.2)
    assert out["signal_upper95"] > out["signal_sq_norm"] > out["signal_sq_norm"] - 2 * out["signal_se"] > 0
    assert out["noise_scale_steps_lower95"] < out["noise_scale_steps"]
    cos = {row["steps_per_mean"]: row for row in out["cosines"]}
    assert sorted(cos) == [1, 2, 4, 8, 16]
    assert cos[1]["predicted"] == pytest.approx(0.2, rel=0.2) and cos[1]["measured"] == pytest.approx(0.2, abs=0.05)
    assert cos[8]["predicted"] == pytest.approx(1 / (1 + 4 / 8), rel=0.15)  # |G|^2 / (|G|^2 + s2 / m)
    assert cos[8]["measured"] == pytest.approx(cos[8]["predicted"], abs=0.1)
    assert cos[16]["measured"] > cos[4]["measured"] > cos[1]["measured"]


def test_the_jackknife_error_is_the_spread_of_the_estimate_over_repeated_draws():
    """The standard error matches how much |G|^2's estimate actually varies between independent sets of steps
    (a wrong leave-one-out sum or variance factor would be off by a factor of 2 or more)."""
    runs = [noise_scale(draws(16, 2_000, signal=0.05, noise_var=1.0, seed=s)) for s in range(150)]
    estimates = torch.tensor([r["signal_sq_norm"] for r in runs])
    mean_se = sum(r["signal_se"] for r in runs) / len(runs)
    assert mean_se == pytest.approx(float(estimates.std()), rel=0.3)
    assert float(estimates.mean()) == pytest.approx(0.05, abs=3 * float(estimates.std()) / len(runs) ** 0.5)


def test_pure_noise_gives_no_point_estimate_but_a_lower_bound():
    """No signal: the point estimate is undefined, the bound still says how large the noise scale at least is."""
    out = noise_scale(draws(24, 20_000, signal=0.0, noise_var=1.0, seed=1))
    assert abs(out["signal_sq_norm"]) < 3 * out["signal_se"]
    if out["signal_sq_norm"] <= 0:
        assert out["noise_scale_steps"] is None
    assert out["noise_scale_steps_lower95"] > 10
    assert all(abs(row["measured"]) < 0.1 for row in out["cosines"])


def test_too_few_steps_is_an_error():
    with pytest.raises(ValueError, match="need at least 4"):
        noise_scale(draws(3, 10, 1.0, 1.0))


def test_drawing_without_replacement_widens_the_bound_by_its_largest_bias():
    """Steps of one epoch share no prompt, which lowers their products by up to per x s2 / (all - 1): the
    upper bound of the signal grows by exactly that, the point estimates stay."""
    grads = draws(16, 5_000, signal=0.1, noise_var=1.0, seed=2)
    free, epoch = noise_scale(grads), noise_scale(grads, draws=(8, 201))
    assert free["draw_bias_max"] == 0.0
    assert epoch["draw_bias_max"] == pytest.approx(8 * epoch["noise_var"] / 200)
    assert epoch["signal_upper95"] == pytest.approx(free["signal_upper95"] + epoch["draw_bias_max"])
    assert epoch["noise_scale_steps_lower95"] < free["noise_scale_steps_lower95"]
    assert epoch["signal_sq_norm"] == free["signal_sq_norm"] and epoch["noise_var"] == free["noise_var"]


def test_update_direction_is_the_mean_or_adams_step_at_rms_one():
    from envace.reporting.gradient_noise import update_direction

    steps = torch.tensor([[1.0, 2.0, 0.0, -4.0], [3.0, -2.0, 0.0, -4.0]])
    mean = update_direction(steps, "mean")  # mean (2, 0, 0, -4), rms sqrt(5)
    assert torch.allclose(mean, torch.tensor([2.0, 0.0, 0.0, -4.0]) / 5**0.5)
    adam = update_direction(steps, "adam")  # mean / sqrt(mean square): (2/sqrt(5), 0, 0, -1)
    raw = torch.tensor([2 / 5**0.5, 0.0, 0.0, -1.0])
    assert torch.allclose(adam, raw / raw.pow(2).mean().sqrt())
    assert float(adam.pow(2).mean()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="mean gradient is zero"):
        update_direction(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
    with pytest.raises(ValueError, match="not 'mean' or 'adam'"):
        update_direction(steps, "sgd")
