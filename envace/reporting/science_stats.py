"""Statistics of the science matrix: per-cell outcomes in, ``science.json`` out.

Inputs are the git-tracked files the science stages write (``science.metrics``, envace.stages.science):
``sft/tasks.json`` (the SFT checkpoint ``policy`` and the untrained ``base``), ``cells/<variant>-seed<k>/``
(``tasks.json``, ``train.json`` + details, ``evaluate_toolworld.json``) and ``testtime/<cell>/``
(``tasks.json``, ``rehearsal_sweep.json``). Every test task is the same in every cell (``data.seed``
fixed), so outcomes line up as a ``seeds × tasks`` 0/1 matrix per variant.

Intervals are percentile bootstraps (numpy, seeded). A variant's mean resamples tasks and seeds
independently (two-way: the task set and the training seeds are both samples). A paired difference
A − B draws one set of task indices for both sides (the pairing: the same tasks), and seeds of each side
independently; a side with one run (the SFT base: greedy decoding, no training seed) keeps it.
Each interval here is an unadjusted 95% reading of one row (the report's exploratory rows); only the
declared primary comparisons are tested, with a correction for their number (envace.reporting.science_family).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envace.reporting.metrics_files import read_metrics
from envace.utils.io import read_json

CELL_DIR = re.compile(r"^(?P<variant>[a-z_]+)-seed(?P<seed>\d+)$")
CONFIDENCE = 0.95
# subsets of the test split a comparison is also reported on: name -> which task rows belong to it
SUBSETS = {
    "all": lambda row: True,
    "in_domain": lambda row: not row.get("held_out"),
    "held_out_domain": lambda row: row.get("held_out_kind") == "domain",
}


@dataclass(frozen=True)
class Outcomes:
    """0/1 success of ``runs`` (seeds) on ``task_ids`` (the same order for every run)."""

    task_ids: tuple[str, ...]
    matrix: np.ndarray  # shape (runs, tasks)
    rows: tuple[Mapping[str, Any], ...]  # one task's descriptive row (domain, held_out, ...) per task

    def subset(self, name: str) -> Outcomes:
        keep = [i for i, row in enumerate(self.rows) if SUBSETS[name](row)]
        return Outcomes(tuple(self.task_ids[i] for i in keep), self.matrix[:, keep], tuple(self.rows[i] for i in keep))

    @property
    def mean(self) -> float:
        return float(self.matrix.mean()) if self.matrix.size else float("nan")


BASE_REHEARSER_DIR = "base_rehearser"  # under science.metrics: stage testtime_base's files
# under science.metrics: stage testtime_grid's files, the first seed's whole test-time grid run on further seeds,
# one directory per half (``trained``: stage testtime's cells; ``base``: testtime_base's)
GRID_DIR = "full_grid"
GRID_HALVES = ("trained", "base")


def outcomes_of(runs: Sequence[Sequence[Mapping[str, Any]]], where: str = "") -> Outcomes:
    """Stack per-run task rows (``tasks.json`` lists) into one matrix; every run must hold the same tasks."""
    if not runs:
        raise ValueError(f"science: no runs to stack{where}")
    ids = [str(row["task_id"]) for row in runs[0]]
    for run in runs[1:]:
        other = [str(row["task_id"]) for row in run]
        if sorted(other) != sorted(ids):
            raise ValueError(
                f"science: runs{where} were scored on different test tasks ({len(ids)} vs {len(other)}"
                f", {len(set(ids) ^ set(other))} differ): re-run them with the same data.seed"
            )
    by_id = [{str(r["task_id"]): r for r in run} for run in runs]
    matrix = np.array([[1.0 if by[i].get("success") else 0.0 for i in ids] for by in by_id])
    return Outcomes(tuple(ids), matrix, tuple(by_id[0][i] for i in ids))


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> list[float]:
    """The two-sided percentile interval of bootstrap replicates ``values`` at ``confidence``."""
    lo, hi = np.percentile(values, [100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2])
    return [float(lo), float(hi)]


def _resample_mean(m: np.ndarray, tasks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Means of ``m`` over resampled seeds (rows, drawn here) and the given resampled task columns."""
    n_boot, runs = tasks.shape[0], m.shape[0]
    seeds = rng.integers(0, runs, size=(n_boot, runs)) if runs > 1 else np.zeros((n_boot, 1), dtype=int)
    # per resample: mean over the drawn runs of each run's mean over the drawn tasks
    per_run = m[:, tasks].mean(axis=2)  # (runs, n_boot)
    return np.take_along_axis(per_run.T, seeds, axis=1).mean(axis=1)


def mean_interval(o: Outcomes, n_boot: int, seed: int = 0) -> dict[str, Any]:
    """Mean success with its 95% two-way bootstrap interval (tasks × seeds), n tasks and n runs."""
    n_tasks, runs = o.matrix.shape[1], o.matrix.shape[0]
    out: dict[str, Any] = {
        "mean": o.mean,
        "n_tasks": n_tasks,
        "n_seeds": runs,
        "ci95": None,
        "per_seed": [float(x) for x in o.matrix.mean(axis=1)] if n_tasks else [],
    }
    if n_tasks:
        rng = np.random.default_rng(seed)
        tasks = rng.integers(0, n_tasks, size=(n_boot, n_tasks))
        out["ci95"] = percentile_interval(_resample_mean(o.matrix, tasks, rng))
    return out


def aligned(b: Outcomes, task_ids: Sequence[str]) -> np.ndarray:
    """``b``'s matrix with its columns in the order of ``task_ids`` (how a paired difference pairs tasks)."""
    index = {t: i for i, t in enumerate(b.task_ids)}
    missing = [t for t in task_ids if t not in index]
    if missing:
        raise ValueError(
            f"science: cannot pair on tasks {missing[:5]} ({len(missing)} in all): one side was not scored on them"
        )
    return b.matrix[:, [index[t] for t in task_ids]]


def paired_resamples(a: Outcomes, b: Outcomes, n_boot: int, seed: int = 0) -> np.ndarray:
    """``n_boot`` bootstrap replicates of A − B: one draw of tasks for both sides (the pairing), the runs
    (seeds) of each side drawn independently (envace.reporting.science_stats's docstring)."""
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, len(a.task_ids), size=(n_boot, len(a.task_ids)))
    return _resample_mean(a.matrix, tasks, rng) - _resample_mean(aligned(b, a.task_ids), tasks, rng)


def paired_difference(a: Outcomes, b: Outcomes, n_boot: int, seed: int = 0) -> dict[str, Any]:
    """A − B on the same tasks: the difference of means and its 95% paired bootstrap interval, with
    ``verdict`` "A > B", "A < B" or "cannot tell" (the interval covers 0): one unadjusted reading, not a
    test of a primary comparison (envace.reporting.science_family)."""
    bm = aligned(b, a.task_ids)
    n_tasks = len(a.task_ids)
    out: dict[str, Any] = {
        "diff": a.mean - float(bm.mean()) if n_tasks else float("nan"),
        "n_tasks": n_tasks,
        "n_seeds": [a.matrix.shape[0], b.matrix.shape[0]],
        "ci95": None,
        "verdict": "cannot tell",
    }
    if not n_tasks:
        return out
    diffs = paired_resamples(a, b, n_boot, seed)
    lo, hi = percentile_interval(diffs)
    out["ci95"] = [lo, hi]
    out["p_boot_le_0"] = float(np.mean(diffs <= 0))
    out["verdict"] = "A > B" if lo > 0 else "A < B" if hi < 0 else "cannot tell"
    return out


def trial_keyed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``task_id`` made unique per trial (``<id>#<k>``: the k-th trial of the task), so that
    repeated trials of one task (``eval.suites.<b>.trials``) stay separate outcomes, paired k with k."""
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        k = seen[row["task_id"]] = seen.get(row["task_id"], -1) + 1
        out.append({**row, "task_id": f"{row['task_id']}#{k}"})
    return out


def gain_vs_base(
    policy: list[dict[str, Any]], base: list[dict[str, Any]], n_boot: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """Policy − baseline success, paired on the same tasks, with its 95% bootstrap interval (over tasks),
    overall and on the held-out domain / the rest when the split has both."""
    a, b = outcomes_of([trial_keyed(policy)], " (policy)"), outcomes_of([trial_keyed(base)], " (baseline)")
    return {
        subset: paired_difference(a.subset(subset), b.subset(subset), n_boot, seed)
        for subset in SUBSETS
        if subset == "all" or 0 < len(a.subset(subset).task_ids) < len(a.task_ids)
    }


def cell_dirs(folder: Path, required: str) -> Iterator[tuple[Path, str, int]]:
    """``(directory, variant, seed)`` of each ``<variant>-seed<k>`` directory in ``folder`` holding ``required``."""
    for path in sorted(folder.glob("*")):
        match = CELL_DIR.match(path.name)
        if match and (path / required).exists():
            yield path, match["variant"], int(match["seed"])


def load_cells(root: Path) -> dict[str, dict[str, Any]]:
    """``{"<variant>/seed<k>": {"variant", "seed", "tasks", "train", "evaluate"}}`` from ``root/cells``."""
    cells: dict[str, dict[str, Any]] = {}
    for path, variant, seed in cell_dirs(root / "cells", "tasks.json"):
        cells[f"{variant}/seed{seed}"] = {
            "variant": variant,
            "seed": seed,
            "dir": path,
            "tasks": read_json(path / "tasks.json")["policy"],
            "train": read_metrics(path / "train.json") if (path / "train.json").exists() else {},
            "evaluate": read_metrics(path / "evaluate_toolworld.json"),
        }
    return cells


def variant_outcomes(cells: Mapping[str, Mapping[str, Any]], variant: str) -> Outcomes | None:
    runs = [c["tasks"] for c in sorted(cells.values(), key=lambda c: c["seed"]) if c["variant"] == variant]
    return outcomes_of(runs, f" of variant {variant}") if runs else None


def comparisons(variants: Iterable[str]) -> list[tuple[str, str]]:
    """The paired differences the issue asks for: envace − each other variant, each trained − SFT base."""
    names = list(variants)
    pairs = [("envace", v) for v in names if v != "envace" and "envace" in names]
    return pairs + [(v, "sft_base") for v in names]


def staged_testtime_cells(root: Path) -> dict[str, dict[str, Any]]:
    """The test-time cells of the stages that run on the matrix's first seeds, keyed like ``testtime_cells``:
    ``root/testtime`` (stage ``testtime``: every seed's trained-rehearser cells and N=0) and
    ``root/base_rehearser/testtime`` (stage ``testtime_base``: the first seed's base and oracle cells). A cell
    in both is refused."""
    out = _sweep_cells(root / "testtime")
    extra = _sweep_cells(root / BASE_REHEARSER_DIR / "testtime")
    where = f"{root / BASE_REHEARSER_DIR} repeats test-time cells of {root / 'testtime'}"
    _refuse_clash(out, extra, where, "testtime_base")
    return {**out, **extra}


def testtime_cells(
    root: Path,
    grid: Mapping[str, dict[str, Any]] | None = None,
    staged: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{"<variant>/seed<k>/<mode>/n<N>/<rehearser>": metrics + per-task rows}`` of every test-time part, one
    dict, so that every cell pairs with its seed's N=0 on the same tasks: the cells of stages ``testtime`` and
    ``testtime_base`` (``staged_testtime_cells``) and those of stage ``testtime_grid``
    (``root/full_grid/<half>/testtime``: the first seed's grid on further seeds, ``grid_cells``). Where both
    ran a cell (N=0 and parallel N=2 of the grid's seeds) the staged run is the one used; the grid's is a
    re-run (``testtime_reruns``). ``grid``, ``staged``: those cells when the caller has read them already."""
    staged = staged_testtime_cells(root) if staged is None else staged
    grid = grid_cells(root) if grid is None else grid
    return {**staged, **{k: c for k, c in grid.items() if k not in staged}}


def _refuse_clash(a: Mapping[str, Any], b: Mapping[str, Any], what: str, stage: str) -> None:
    clash = sorted(set(a) & set(b))
    if clash:
        raise ValueError(
            f"science aggregate: {what}: {clash}; the base half must hold only base-rehearser cells with N > 0 "
            f"(re-run stage {stage})"
        )


def grid_cells(root: Path) -> dict[str, dict[str, Any]]:
    """The cells of stage ``testtime_grid`` (``root/full_grid/<half>/testtime``), both halves in one dict."""
    trained, base = (_sweep_cells(root / GRID_DIR / half / "testtime") for half in GRID_HALVES)
    _refuse_clash(trained, base, f"{root / GRID_DIR}'s two halves hold the same test-time cells", "testtime_grid")
    return {**trained, **base}


def testtime_reruns(
    staged: Mapping[str, Mapping[str, Any]], grid: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The test-time cells run twice, once by stage ``testtime`` or ``testtime_base`` (``staged``, from
    ``staged_testtime_cells``: the run the report uses) and once by stage ``testtime_grid`` (``grid``, from
    ``grid_cells``; it runs a seed's whole grid, N=0 and parallel N=2 included): per cell both success rates
    and the share of tasks whose outcome agrees, a measure of what a re-run of one configuration changes
    (another machine's arithmetic, or nothing). A cell that lacks per-task rows in one of its two runs is
    left out."""
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(set(staged) & set(grid)):
        first, again = staged[key], grid[key]
        if not first["tasks"] or not again["tasks"]:
            continue
        a, b = outcomes_of([first["tasks"]]), outcomes_of([again["tasks"]], f" of the re-run of {key}")
        out[key] = {
            "success": a.mean,
            "rerun_success": b.mean,
            "n_tasks": len(a.task_ids),
            "agree": float(np.mean(a.matrix[0] == aligned(b, a.task_ids)[0])),
        }
    return out


def _sweep_cells(directory: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path, variant, seed in cell_dirs(directory, "rehearsal_sweep.json"):
        sweep = read_metrics(path / "rehearsal_sweep.json")
        tasks = read_json(path / "tasks.json") if (path / "tasks.json").exists() else {}
        for key, cell in sweep.get("cells", {}).items():
            _, mode, n, rehearser = key.split("/")
            label = f"{n}-{mode}-{rehearser}"
            out[f"{variant}/seed{seed}/{mode}/{n}/{rehearser}"] = {
                **cell,
                "mode": mode,
                "rehearser": rehearser,
                "seed": seed,
                "variant": variant,
                "tasks": tasks.get(label, []),
            }
    return out


def sft_warmed_up(root: Path) -> bool:
    """Whether the matrix's SFT part ran a warm-up (``root/sft/train.json`` records its last epoch's loss).
    Without one (the organism: every cell starts from a committed SFT model, ``science.model_files``) the SFT
    eval's ``base`` is that same model, not an untrained one, so no "untrained base" is reported. A matrix
    whose SFT part left no train.json is taken as warmed up (the layout before that file)."""
    path = root / "sft" / "train.json"
    if not path.exists():
        return True
    loss = read_json(path).get("final/sft/loss")
    return loss is not None and not math.isnan(float(loss))


def summarize(root: Path, variants: Sequence[str], n_boot: int) -> dict[str, Any]:
    """Everything ``science.json`` holds (see envace.reporting.science for the layout)."""
    cells = load_cells(root)
    sft = read_json(root / "sft" / "tasks.json")
    base = {"sft_base": outcomes_of([sft["policy"]], " of the SFT checkpoint")}
    if "base" in sft and sft_warmed_up(root):
        base["untrained_base"] = outcomes_of([sft["base"]], " of the untrained base")
    groups = {v: o for v in variants if (o := variant_outcomes(cells, v)) is not None}
    groups.update(base)
    aggregate: dict[str, Any] = {"variants": {}, "differences": {}}
    for name, o in groups.items():
        aggregate["variants"][name] = {s: mean_interval(o.subset(s), n_boot) for s in SUBSETS}
    for a, b in comparisons(v for v in variants if v in groups):
        aggregate["differences"][f"{a}-{b}"] = {
            s: paired_difference(groups[a].subset(s), groups[b].subset(s), n_boot) for s in SUBSETS
        }
    staged, grid = staged_testtime_cells(root), grid_cells(root)
    testtime = testtime_cells(root, grid, staged)
    aggregate["testtime"] = testtime_comparisons(testtime, n_boot)
    aggregate["testtime_reruns"] = testtime_reruns(staged, grid)
    return {"cells": cells, "groups": groups, "aggregate": aggregate, "testtime": testtime}


def testtime_comparisons(testtime: Mapping[str, Mapping[str, Any]], n_boot: int) -> dict[str, Any]:
    """Gain of each (seed, mode, N, rehearser) cell over the same seed's N=0, paired on its tasks; the paper's
    comparison, parallel N=2 with the trained rehearser minus the base one, on every seed that ran both; and
    each of these pooled over the seeds that have it (``testtime_pooled``)."""
    out: dict[str, Any] = {}
    for key, cell in testtime.items():
        variant, seed, mode, n, rehearser = key.split("/")
        none = testtime.get(f"{variant}/{seed}/none/n0/none")
        if n == "n0" or none is None or not cell["tasks"] or not none["tasks"]:
            continue
        out[f"{key}-vs-n0"] = paired_difference(outcomes_of([cell["tasks"]]), outcomes_of([none["tasks"]]), n_boot)
    for variant, seed in sorted({tuple(k.split("/")[:2]) for k in testtime}):
        trained = testtime.get(f"{variant}/{seed}/{PAPER_CELL}/trained")
        base = testtime.get(f"{variant}/{seed}/{PAPER_CELL}/base")
        if trained and base and trained["tasks"] and base["tasks"]:
            out[f"{variant}/{seed}/{PAPER_CELL}/trained-vs-base"] = paired_difference(
                outcomes_of([trained["tasks"]]), outcomes_of([base["tasks"]]), n_boot
            )
    return out | testtime_pooled(testtime, n_boot)


PAPER_CELL = "parallel/n2"  # the test-time setting the paper compares rehearsers at


def testtime_pooled(testtime: Mapping[str, Mapping[str, Any]], n_boot: int) -> dict[str, Any]:
    """Per ``<variant>/<mode>/n<N>/<rehearser>``, its gain over N=0 pooled over every seed that ran both
    (the key without a seed: ``envace/parallel/n2/trained-vs-n0``), and trained − base at the paper's
    setting (``envace/parallel/n2/trained-vs-base``), where two or more seeds have it. Paired on the tasks;
    seeds enter as rows (``paired_difference``); ``per_seed`` and ``seeds`` list each seed's difference."""
    by_setting: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for key, cell in testtime.items():
        variant, seed, setting = key.split("/", 2)
        if cell["tasks"]:
            by_setting.setdefault((variant, setting), {})[int(seed.removeprefix("seed"))] = cell
    pairs = []
    for (variant, setting), runs in sorted(by_setting.items()):
        mode, n, rehearser = setting.split("/")
        if n != "n0":
            pairs.append((f"{variant}/{setting}-vs-n0", runs, by_setting.get((variant, "none/n0/none"), {})))
    for variant in sorted({v for v, _ in by_setting}):
        trained, base = (by_setting.get((variant, f"{PAPER_CELL}/{r}"), {}) for r in ("trained", "base"))
        pairs.append((f"{variant}/{PAPER_CELL}/trained-vs-base", trained, base))
    out: dict[str, Any] = {}
    for name, a_runs, b_runs in pairs:
        seeds = sorted(set(a_runs) & set(b_runs))
        if len(seeds) < 2:
            continue
        a = outcomes_of([a_runs[k]["tasks"] for k in seeds], f" of {name}")
        b = outcomes_of([b_runs[k]["tasks"] for k in seeds], f" of {name}")
        b_rows = aligned(b, a.task_ids)
        out[name] = paired_difference(a, b, n_boot) | {
            "seeds": seeds,
            "per_seed": [float(d) for d in a.matrix.mean(axis=1) - b_rows.mean(axis=1)],
        }
    return out
