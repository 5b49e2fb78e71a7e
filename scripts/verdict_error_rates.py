"""False-positive rate and power of the science report's verdicts on synthetic outcomes (issue 42, point 7).

Simulates ``--sims`` experiments of two arms x ``--seeds`` seeds x ``--tasks`` tasks with Bernoulli successes:
a per-task difficulty shared by both arms, a per-seed effect shared by both arms and one per arm (standard
deviation ``--seed-sd`` on the logit scale), and ``--effect`` added to arm A's success probability. For each,
it prints how often the old verdict (a task-level paired bootstrap interval excluding 0) and the new one (a
one-sided sign-flip test over seeds, ``envace.reporting.science_family``) call A better than B.

    python scripts/verdict_error_rates.py --seeds 5 --effect 0.0   # false-positive rates
    python scripts/verdict_error_rates.py --seeds 5 --effect 0.10  # power at +10 points
"""

from __future__ import annotations

import argparse

import numpy as np

from envace.reporting.science_family import family_verdicts
from envace.reporting.science_stats import Outcomes, paired_difference


def outcomes(rng: np.random.Generator, sims: int, seeds: int, tasks: int, effect: float, seed_sd: float) -> np.ndarray:
    """0/1 outcomes shaped (sims, arms, seeds, tasks)."""
    difficulty = rng.normal(-0.5, 1.5, size=(sims, 1, 1, tasks))
    shared_seed = rng.normal(0.0, 0.2, size=(sims, 1, seeds, 1))
    own_seed = rng.normal(0.0, seed_sd, size=(sims, 2, seeds, 1))
    prob = 1 / (1 + np.exp(-(difficulty + shared_seed + own_seed)))
    prob[:, 0] = np.clip(prob[:, 0] + effect, 0.0, 1.0)
    return (rng.random(prob.shape) < prob).astype(float)


def rates(y: np.ndarray, resamples: int, alpha: float) -> tuple[float, float]:
    """(old verdict 'A > B' rate, new verdict 'supported' rate)."""
    sims, _, _, tasks = y.shape
    ids = tuple(f"t{i}" for i in range(tasks))
    rows = tuple({} for _ in ids)
    old = [
        paired_difference(Outcomes(ids, y[k, 0], rows), Outcomes(ids, y[k, 1], rows), resamples, seed=k)["verdict"]
        for k in range(sims)
    ]
    per_seed = y[:, 0].mean(-1) - y[:, 1].mean(-1)  # (sims, seeds)
    new = family_verdicts(per_seed[:, None, :], alpha)["supported"][:, 0]
    return float(np.mean([v == "A > B" for v in old])), float(new.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--effect", type=float, default=0.0)
    parser.add_argument("--seed-sd", type=float, default=0.2)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args()
    y = outcomes(np.random.default_rng(7), args.sims, args.seeds, args.tasks, args.effect, args.seed_sd)
    old, new = rates(y, args.resamples, args.alpha)
    print(
        f"{args.sims} simulations, {args.seeds} seeds x {args.tasks} tasks, effect {args.effect:+.2f}, seed sd "
        f"{args.seed_sd}: old bootstrap verdict 'A > B' {old:.3f}; new sign-flip verdict 'supported' {new:.3f}"
    )


if __name__ == "__main__":
    main()
