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
    assert cos[16]["measured"] > cos[4]["measured"] > cos[1]["measured"]


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
