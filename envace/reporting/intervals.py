"""95% intervals for the report's tables.

- ``wilson``: the Wilson score interval of a binary success rate from (successes, n) — a task's
  success is binary (``envace.evaluation.metrics``), so the counts in the metrics files are all the
  per-task information a rate has. Used for every single-benchmark cell; unlike a percentile
  bootstrap it does not collapse to a point when every task has the same outcome (0/3 → [0, 56.1]).
- ``bootstrap_overall``: the percentile bootstrap over tasks of a mean of several benchmarks' rates
  (the Overall columns), resampling tasks within each benchmark (stratified; each benchmark's
  outcomes rebuilt from its counts, which for binary outcomes is exact). It collapses to a point when
  every task of every benchmark has the same outcome.
- ``bootstrap_over_seeds``: the percentile bootstrap over runs (seeds) of their mean score.

All bootstraps are seeded (``BOOTSTRAP_SEED``) so a report is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

N_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def successes(rate: float, n: int) -> int:
    """The success count behind a rate over ``n`` binary outcomes."""
    return int(round(rate * n))


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval (0-1) for ``k`` successes in ``n`` trials (scipy's ``binomtest``); None when
    n = 0."""
    if n <= 0:
        return None
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    # exact bounds at the edges (no rounding residue such as 5e-15 for 0 successes)
    return (0.0 if k == 0 else float(ci.low)), (1.0 if k == n else float(ci.high))


def bootstrap_overall(
    counts: Sequence[tuple[int, int]], *, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float] | None:
    """Percentile 95% interval (0-1) of the mean over benchmarks of their success rates, resampling
    tasks within each benchmark. ``counts``: (successes, n) per benchmark; None if any n = 0."""
    if not counts or any(n <= 0 for _, n in counts):
        return None
    rng = np.random.default_rng(seed)
    # resampling n binary outcomes of which k succeed = a Binomial(n, k/n) draw of the success count
    rates = np.stack([rng.binomial(n, k / n, size=n_resamples) / n for k, n in counts])
    lo, hi = np.percentile(rates.mean(axis=0), [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_over_seeds(
    values: Sequence[float], *, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float] | None:
    """Percentile 95% interval of the mean of ``values`` (one per seed); None for fewer than two."""
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    data = np.asarray(values, dtype=float)
    means = rng.choice(data, size=(n_resamples, len(data)), replace=True).mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)
