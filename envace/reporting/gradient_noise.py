"""The gradient noise scale of a policy-gradient step, from independent step gradients of one fixed policy.

``scripts/organism_gradient_noise.py`` records step gradients without applying them (so every step samples
the same policy) and calls ``noise_scale``. With g_1..g_n i.i.d. with mean G and total variance s2 (the sum
of the per-coordinate variances): E[g_i . g_j] = |G|^2 for i != j and E|g_i|^2 = |G|^2 + s2. The noise scale
s2 / |G|^2 (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training") is how many steps' worth of
batch one update needs for half its squared length to be signal; in high dimension, the means of two
disjoint sets of b steps have cosine about |G|^2 / (|G|^2 + s2 / b).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch


def noise_scale(grads: Sequence[torch.Tensor], draws: tuple[int, int] | None = None) -> dict[str, Any]:
    """|G|^2 (``signal_sq_norm``), s2 (``noise_var``), the noise scale in steps, a jackknife standard error
    of |G|^2 with a one-sided 95% upper bound and the noise scale's matching lower bound (defined even when the signal
    is not detected), and per m = 1, 2, 4, ... the mean cosine between means of disjoint sets of m steps,
    measured and as the estimates predict it.

    ``draws`` = (items per step, items in all): the steps drew their items (prompts) without replacement from
    a finite set, as one epoch of the training data does. Two steps of one epoch then never share an item,
    which makes their products smaller by up to (items per step) x s2 / (items in all - 1); that much is added
    to the upper bound of |G|^2 (``draw_bias_max``), so the lower bound of the noise scale stays a bound.
    None: the steps are independent (or share all their items: the fixed-prompt control)."""
    if len(grads) < 4:
        raise ValueError(f"noise_scale: {len(grads)} step gradients; need at least 4")
    g = torch.stack(grads).double()
    n = g.shape[0]
    gram = g @ g.T
    sq = gram.diagonal().mean().item()
    off = gram.sum(1) - gram.diagonal()  # per step: sum of its products with the other steps
    total = off.sum().item()  # every product of two different steps (each pair twice)
    cross = total / (n * (n - 1))
    signal = max(cross, 0.0)
    noise = sq - cross
    # jackknife over steps: the standard error of the signal estimate, and from it a one-sided 95% upper bound
    # on the signal, hence a lower bound on the noise scale that holds even when the signal is not detected
    # (s2, a mean of squared norms, is far better determined than |G|^2 and is taken as known)
    leave = [(total - 2 * off[i].item()) / ((n - 1) * (n - 2)) for i in range(n)]
    mean_leave = sum(leave) / n
    se = ((n - 1) / n * sum((x - mean_leave) ** 2 for x in leave)) ** 0.5
    per, population = draws if draws is not None else (0, 2)
    draw_bias = per * max(noise, 0.0) / (population - 1)
    upper = cross + 1.645 * se + draw_bias
    out: dict[str, Any] = {
        "n_steps": n,
        "mean_sq_norm": sq,
        "signal_sq_norm": cross,
        "noise_var": noise,
        "signal_se": se,
        "draw_bias_max": draw_bias,
        "signal_upper95": upper,
        "noise_scale_steps": (noise / signal) if signal > 0 else None,
        "noise_scale_steps_lower95": (noise / upper) if upper > 0 else None,
        "cosines": [],
    }
    m = 1
    while 2 * m <= n:
        sets = [g[i : i + m].mean(0) for i in range(0, n - n % m, m)]
        pairs = list(itertools.combinations(range(len(sets)), 2))
        cos = [torch.nn.functional.cosine_similarity(sets[a], sets[b], dim=0).item() for a, b in pairs]
        predicted = signal / (signal + noise / m) if signal > 0 else 0.0
        out["cosines"].append(
            {"steps_per_mean": m, "pairs": len(pairs), "measured": sum(cos) / len(cos), "predicted": predicted}
        )
        m *= 2
    return out


def update_direction(steps: torch.Tensor, kind: str = "mean") -> torch.Tensor:
    """The direction of one update built from all of ``steps`` (steps x parameters: recorded step gradients of
    one policy), scaled to a root-mean-square of 1 per parameter: ``mean``, their mean (one large-batch SGD
    step); ``adam``, their mean over the root of their mean square, per parameter (the step Adam takes when its
    moments are estimated from all of them). ``scripts/organism_gradient_step.py`` moves a policy along it."""
    if steps.dim() != 2 or steps.shape[0] < 1:
        raise ValueError(f"update_direction: expected a (steps x parameters) tensor, got shape {tuple(steps.shape)}")
    if kind not in ("mean", "adam"):
        raise ValueError(f"update_direction: kind {kind!r} is not 'mean' or 'adam'")
    steps = steps.double()
    direction = steps.mean(0)
    if kind == "adam":
        direction = direction / (steps.pow(2).mean(0).sqrt() + 1e-12)
    rms = direction.pow(2).mean().sqrt()
    if not float(rms) > 0:
        raise ValueError("update_direction: the mean gradient is zero; there is no direction to move along")
    return (direction / rms).float()
