"""The science report's primary family: the few comparisons it tests, and how.

The matrix prints ~27 paired differences and ~14 test-time gains; read one by one at 95%, some would
exclude 0 by chance alone. So ``science.primary.comparisons`` (conf/config.yaml) declares the family of
primary comparisons before the numbers exist, and only they get a verdict; every other row of the report
is exploratory (an unadjusted 95% interval, no verdict).

Names (``check_family`` refuses any other, listing the valid ones):
- ``A-B``: a difference of the matrix (envace.reporting.science_stats.comparisons: ``envace-grpo``,
  ``envace-sft_base``, ...), paired on the test tasks, per training seed;
- ``<testtime_variant>/<mode>/n<N>/<rehearser>-vs-n0``: the test-time gain of that sweep cell over the
  same seed's N=0, on every seed the sweep ran it;
- ``<testtime_variant>/<mode>/n<N>/<rehearser>-vs-<other rehearser>``: e.g. ``trained-vs-base``, the
  trained rehearser minus the SFT-start one at the same N (the sweep runs ``base`` on the first seed only).

The test of one primary, A − B:
1. per training seed s that both sides have (a side with one run, the SFT start, serves every seed), the
   paired difference d_s of mean success on the same tasks;
2. a one-sided sign-flip permutation test of H0 "d_s is symmetric about 0" against "A > B", with the
   statistic sum(d_s): p is the share of the 2^S sign patterns whose sum is at least the observed one
   (all patterns for S <= ``EXACT_MAX_SEEDS``; beyond, ``permutations`` random patterns from a fixed
   seed and p = (1 + hits) / (1 + draws)). The seed is the unit: a rerun changes the training
   randomness, which the task-level bootstrap alone does not test;
3. Holm's step-down adjustment over the declared family (a primary not measured counts as p = 1, so the
   family keeps its declared size); the verdict is "supported" when the adjusted p < ``alpha``, else
   "not supported" ("not measured" where the run lacks its cells).

Deliberate choices:
- One-sided: every primary is a directional claim of the paper (A beats B). A two-sided test spends half
  of alpha on a direction no claim makes and, with few seeds, cannot reject at all. The verdict therefore
  never says "A < B": a negative difference reads "not supported".
- The smallest attainable p is 1/2^S: 1/8 = 0.125 with 3 seeds, 1/32 = 0.031 with 5 (two-sided it would
  be 2/32 = 0.0625, never below 0.05), 1/128 = 0.0078 with 7. Holm's first step compares the smallest p
  with alpha/m, so a family of 4 at alpha 0.05 needs p <= 0.0125: at least 7 seeds, every one of them in
  favour of A. The report prints each primary's smallest attainable p beside its p.
- The test conditions on the test tasks (the same set in every cell): it asks whether A beats B on these
  tasks in expectation over training seeds. Beside it the report prints the task-level paired bootstrap
  interval (envace.reporting.science_stats) at the Bonferroni level 1 − alpha/m, a simultaneous interval
  for the family; it sizes the effect and does not enter the verdict.
- Measured on synthetic matrices (tests/unit/reporting/test_science_stats.py::test_verdict_false_positive_rate):
  the verdict's false-positive rate is about 1/2^S for one primary and at most alpha for the family.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from omegaconf.errors import MissingMandatoryValue

from envace.config.enums import Rehearser
from envace.config.load import to_plain
from envace.core.rehearsal import RehearsalMode
from envace.reporting.science_stats import (
    Outcomes,
    aligned,
    comparisons,
    outcomes_of,
    paired_resamples,
    percentile_interval,
)

TEST = "one-sided sign-flip permutation over per-seed paired differences (A > B), Holm over the family"
EXACT_MAX_SEEDS = 16  # up to 2^16 sign patterns are enumerated; more seeds draw random patterns
TIE_TOLERANCE = 1e-9  # a pattern's sum counts as reaching the observed one within this (float rounding)
SINGLE_RUNS = ("sft_base", "untrained_base")  # groups with one run, no training seed
TESTTIME_NAME = re.compile(r"^(?P<variant>\w+)/(?P<mode>\w+)/n(?P<n>\d+)/(?P<a>\w+)-vs-(?P<b>\w+)$")


def holm(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values of the family along the last axis (leading axes: other families).

    The k-th smallest of m p-values is multiplied by m − k + 1, made non-decreasing along that order and
    capped at 1; rejecting where the adjusted p < alpha controls the family-wise error rate at alpha."""
    p = np.asarray(p, dtype=float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    ranked = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    adjusted = np.empty_like(ranked)
    np.put_along_axis(adjusted, order, ranked, axis=-1)
    return adjusted


def _sign_patterns(n_seeds: int, permutations: int | None, seed: int) -> tuple[np.ndarray, bool]:
    """The ±1 sign patterns, shape (patterns, seeds), and whether they are all 2^S of them."""
    if n_seeds <= EXACT_MAX_SEEDS:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n_seeds))).reshape(-1, n_seeds), True
    if not permutations or permutations < 1:
        raise ValueError(
            f"sign-flip test over {n_seeds} seeds: more than {EXACT_MAX_SEEDS} seeds draws random sign patterns; "
            "give their number (science.primary.permutations, e.g. 20000)"
        )
    rng = np.random.default_rng(seed)
    return rng.choice((1.0, -1.0), size=(permutations, n_seeds)), False


def sign_flip_p(diffs: np.ndarray, permutations: int | None = None, seed: int = 0) -> np.ndarray | float:
    """One-sided p of the sign-flip permutation test that paired differences ``diffs`` (shape (..., S):
    one per seed, leading axes are separate tests) have a positive mean: the share of sign patterns
    whose sum reaches the observed sum. Exact for S <= ``EXACT_MAX_SEEDS``, else ``permutations`` random
    patterns (seeded) with p = (1 + hits) / (1 + draws)."""
    diffs = np.asarray(diffs, dtype=float)
    signs, exact = _sign_patterns(diffs.shape[-1], permutations, seed)
    sums = diffs @ signs.T  # (..., patterns)
    hits = (sums >= diffs.sum(axis=-1, keepdims=True) - TIE_TOLERANCE).sum(axis=-1)
    p = hits / len(signs) if exact else (1 + hits) / (1 + len(signs))
    return float(p) if np.ndim(p) == 0 else p


def min_attainable_p(n_seeds: int, permutations: int | None = None) -> float:
    """The smallest p ``sign_flip_p`` can give over ``n_seeds`` seeds (1 with none)."""
    if n_seeds <= EXACT_MAX_SEEDS:
        return 2.0**-n_seeds
    return 1.0 / (1 + int(permutations or 0))


def seeds_needed(alpha: float, family_size: int) -> int:
    """The fewest seeds whose exact sign-flip test can pass Holm's first step (p < alpha / m)."""
    return int(np.floor(np.log2(max(family_size, 1) / alpha))) + 1


def holm_decisions(p: np.ndarray, alpha: float) -> dict[str, np.ndarray]:
    """Holm-adjusted p (along the last axis) and where it is below ``alpha`` ("supported")."""
    adjusted = holm(p)
    return {"p_holm": adjusted, "supported": adjusted < alpha}


def family_verdicts(seed_diffs: np.ndarray, alpha: float, permutations: int | None = None) -> dict[str, np.ndarray]:
    """The verdicts of a family whose primaries share a number of seeds: ``seed_diffs`` of shape
    (..., m primaries, S seeds) -> raw ``p``, ``p_holm`` and ``supported``, each (..., m)."""
    p = np.asarray(sign_flip_p(seed_diffs, permutations))
    return {"p": p, **holm_decisions(p, alpha)}


# ---- the declared family ----------------------------------------------------------------------------


def _testtime_name_error(name: str, s: Any) -> str | None:
    """Why ``name`` is not a test-time comparison of this matrix (None when it is one)."""
    match = TESTTIME_NAME.match(name)
    if match is None:
        return "neither a difference of the matrix nor a test-time comparison"
    rehearsers, modes = [r.value for r in Rehearser], [m.value for m in RehearsalMode]
    if match["variant"] != str(to_plain(s.testtime_variant)):
        return f"the test-time sweep runs science.testtime_variant={to_plain(s.testtime_variant)} only"
    if match["mode"] not in modes or int(match["n"]) < 1:
        return f"mode must be one of {modes} and N >= 1"
    if match["a"] not in rehearsers or (
        match["b"] != "n0" and (match["b"] not in rehearsers or match["b"] == match["a"])
    ):
        return f"compare a rehearser in {rehearsers} with n0 or with the other rehearser"
    return None


def valid_names(s: Any) -> str:
    """The names ``science.primary.comparisons`` may hold for the science section ``s``, in words."""
    diffs = [f"{a}-{b}" for a, b in comparisons(str(v) for v in to_plain(s.variants))]
    tv = to_plain(s.testtime_variant)
    modes, rehearsers = "|".join(m.value for m in RehearsalMode), "|".join(r.value for r in Rehearser)
    return (
        f"the matrix's differences {diffs}, or test-time comparisons {tv}/<{modes}>/n<N >= 1>/<{rehearsers}>-vs-n0 "
        f"and {tv}/<mode>/n<N>/trained-vs-base (e.g. {tv}/parallel/n2/trained-vs-base)"
    )


def check_family(s: Any) -> list[str]:
    """The declared primary names of the science section ``s`` (``cfg.science``), checked: each must be a
    comparison this matrix computes; alpha in (0, 1); no name twice. Raises ValueError listing valid names."""
    try:
        names = [str(n) for n in to_plain(s.primary.comparisons)]
        alpha = float(s.primary.alpha)
    except MissingMandatoryValue as exc:
        raise ValueError(f"science.primary is incomplete ({exc}); regenerate params.yaml with `make params`") from exc
    diffs = {f"{a}-{b}" for a, b in comparisons(str(v) for v in to_plain(s.variants))}
    bad = {n: why for n in names if n not in diffs and (why := _testtime_name_error(n, s))}
    if bad:
        raise ValueError(
            f"science.primary.comparisons: unknown {'; '.join(f'{n!r} ({w})' for n, w in bad.items())}. "
            f"Valid: {valid_names(s)}"
        )
    if len(set(names)) != len(names) or not 0 < alpha < 1:
        raise ValueError(f"science.primary: comparisons {names} must be distinct and alpha={alpha} in (0, 1)")
    return names


# ---- the family's rows ------------------------------------------------------------------------------
Side = dict[int | None, Outcomes]  # training seed -> that seed's run; None: one run serving every seed
NOT_MEASURED = {"diff": None, "n_seeds": 0, "n_tasks": 0, "p": None, "min_attainable_p": 1.0, "ci": None}


def _matrix_side(name: str, summary: Mapping[str, Any]) -> Side:
    if name in SINGLE_RUNS:
        group = summary["groups"].get(name)
        return {None: group} if group is not None else {}
    cells = summary["cells"].values()
    return {int(c["seed"]): outcomes_of([c["tasks"]]) for c in cells if c["variant"] == name and c["tasks"]}


def _testtime_side(testtime: Mapping[str, Any], variant: str, mode: str, n: str, rehearser: str) -> Side:
    out: Side = {}
    for key, cell in testtime.items():
        v, seed, m, nn, r = key.split("/")
        if (v, m, nn, r) == (variant, mode, n, rehearser) and cell["tasks"]:
            out[int(seed.removeprefix("seed"))] = outcomes_of([cell["tasks"]], f" of test-time cell {key}")
    return out


def sides(name: str, summary: Mapping[str, Any]) -> tuple[Side, Side]:
    """The runs of A and B of a checked primary name (``check_family``)."""
    match = TESTTIME_NAME.match(name)
    if match is None:
        a, b = name.split("-", 1)
        return _matrix_side(a, summary), _matrix_side(b, summary)
    variant, mode, n = match["variant"], match["mode"], f"n{match['n']}"
    a = _testtime_side(summary["testtime"], variant, mode, n, match["a"])
    if match["b"] == "n0":
        return a, _testtime_side(summary["testtime"], variant, "none", "n0", "none")
    return a, _testtime_side(summary["testtime"], variant, mode, n, match["b"])


def paired_by_seed(a: Side, b: Side) -> list[tuple[Outcomes, Outcomes]]:
    """(A's run, B's run) per training seed both have, in seed order; a single run pairs with every seed."""
    if None in b:
        return [(a[s], b[None]) for s in sorted(a, key=str)]
    if None in a:
        return [(a[None], b[s]) for s in sorted(b)]
    return [(a[s], b[s]) for s in sorted(set(a) & set(b))]


def primary_row(pairs: list[tuple[Outcomes, Outcomes]], n_boot: int, confidence: float, primary: Any) -> dict[str, Any]:
    """One primary's numbers before the family's correction: per-seed differences, the raw sign-flip p and
    the task-level paired bootstrap interval at ``confidence``."""
    if not pairs:  # the run lacks a side's cells
        return dict(NOT_MEASURED, per_seed=[])
    first = pairs[0][0]
    a_rows = np.array([aligned(a, first.task_ids)[0] for a, _ in pairs])
    b_by_seed = np.array([aligned(b, first.task_ids)[0] for _, b in pairs])
    b_runs = list({id(b): row for (_, b), row in zip(pairs, b_by_seed)}.values())  # a single run once
    per_seed = a_rows.mean(axis=1) - b_by_seed.mean(axis=1)
    a_all = Outcomes(first.task_ids, a_rows, first.rows)
    b_all = Outcomes(first.task_ids, np.array(b_runs), first.rows)
    permutations, seed = int(primary.permutations), int(primary.permutation_seed)
    return {
        "diff": a_all.mean - b_all.mean,
        "per_seed": [float(d) for d in per_seed],
        "n_seeds": len(pairs),
        "n_tasks": len(first.task_ids),
        "p": sign_flip_p(per_seed, permutations, seed),
        "min_attainable_p": min_attainable_p(len(pairs), permutations),
        "ci": percentile_interval(paired_resamples(a_all, b_all, n_boot), confidence),
    }


def primary_family(summary: Mapping[str, Any], s: Any, n_boot: int) -> dict[str, Any]:
    """``science.json``'s ``primary``: per declared comparison its difference, per-seed differences, raw
    and Holm-adjusted p, verdict and the bootstrap interval at ``interval_level`` (1 − alpha/m)."""
    names = check_family(s)
    alpha = float(s.primary.alpha)
    level = 1 - alpha / max(len(names), 1)
    rows = {n: primary_row(paired_by_seed(*sides(n, summary)), n_boot, level, s.primary) for n in names}
    p = np.array([1.0 if r["p"] is None else r["p"] for r in rows.values()])  # unmeasured: kept in the family
    decided = holm_decisions(p, alpha)
    for row, adjusted, supported in zip(rows.values(), decided["p_holm"], decided["supported"]):
        measured = row["p"] is not None
        row["p_holm"] = float(adjusted) if measured else None
        row["verdict"] = "supported" if measured and supported else "not supported" if measured else "not measured"
    return {
        "alpha": alpha,
        "test": TEST,
        "family": names,  # the declared order (science.json sorts the keys of ``comparisons``)
        "family_size": len(names),
        "interval_level": level,
        "comparisons": rows,
    }
