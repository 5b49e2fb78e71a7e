"""The first seed's whole test-time grid, run on further seeds (stage ``testtime_grid`` of science/dvc.yaml).

Stages ``testtime`` and ``testtime_base`` run the whole grid (N in ``science.testtime_n_attempts_grid`` ×
``science.testtime_modes`` × the trained, base and oracle rehearsers) on the first seed only; the other seeds
get N in ``science.testtime_other_seeds_n_attempts_grid`` (parallel, trained). This part runs one half of
that whole grid on another seed K, exactly as those two stages run it on the first seed:

- ``--half trained``: stage ``testtime``'s part with K as the first seed (every N, N=0 included, both modes);
- ``--half base``: stage ``testtime_base``'s part with K as the first seed (base and oracle, every N > 0).

It is a stage of its own, in a module of its own, so that adding it leaves every finished cell and test-time
part up to date (none of them depends on this file). Its files go to
``<science.metrics>/full_grid/<half>/testtime/<cell>/`` and its per-task records to
``<science.dir>/full_grid/<half>/<cell>/``; the aggregate folds its cells in beside the others
(envace.reporting.science_stats.testtime_cells). The trained half runs N=0 and parallel N=2 again, which stage
``testtime`` already has for K: the aggregate keeps ``testtime``'s run and reports how the two agree.

    python -m envace.stages.science_grid --seed 1 --half trained [key=value ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from envace.config.load import PARAMS_FILE, load_params, to_plain
from envace.reporting.science_stats import GRID_DIR, GRID_HALVES
from envace.stages import science
from envace.stages.runner import EXIT_USAGE, _failure, configure_logging
from envace.stages.science_matrix import peak_rss_mb, require_trained, trained_checkpoints
from envace.utils.io import read_json, write_json
from envace.utils.telemetry import telemetry_off

PART_OF_HALF = {"trained": "testtime", "base": "testtime_base"}  # the part each half runs, as if K were first
assert set(PART_OF_HALF) == set(GRID_HALVES)


def grid_metrics(s: DictConfig, half: str, name: str) -> str:
    """Where the half of cell ``name`` writes its metrics (git-tracked, the stage's output)."""
    return f"{s.metrics}/{GRID_DIR}/{half}/testtime/{name}"


def grid_overrides(s: DictConfig, seed: int, half: str) -> list[str]:
    """The overrides that make the part run ``half`` of the whole grid on ``seed`` into the grid's own
    directories: ``science.seeds=[seed]`` (the part runs the whole grid on the first seed), then the metrics,
    plots and records paths (later overrides win over the part's own)."""
    if half not in PART_OF_HALF:
        raise ValueError(f"science testtime_grid: --half must be one of {sorted(PART_OF_HALF)}, not {half!r}")
    seeds = [int(k) for k in to_plain(s.seeds)]
    if seed not in seeds[1:]:
        raise ValueError(
            f"science testtime_grid: seed {seed} is not one of the matrix's further seeds {seeds[1:]} "
            f"(science.seeds = {seeds}); the first seed's whole grid is stages testtime and testtime_base"
        )
    name = science.cell_name(str(s.testtime_variant), seed)
    out = grid_metrics(s, half, name)
    return [
        f"science.seeds=[{seed}]",
        f"paths.metrics={out}",
        f"paths.plots={out}",
        f"paths.rehearsal={s.dir}/{GRID_DIR}/{half}/{name}",
    ]


def run(seed: int, half: str, extra: list[str]) -> str:
    """Run ``half`` of the whole grid on ``seed``; record its peak memory; return the progress line."""
    s = load_params(PARAMS_FILE, extra).science
    overrides = grid_overrides(s, seed, half)
    variant = str(s.testtime_variant)
    name = science.cell_name(variant, seed)
    checkpoints = trained_checkpoints(s, name)
    require_trained(checkpoints, name, str(s.metrics))
    part = PART_OF_HALF[half]
    started = time.perf_counter()
    science.run_part(part, variant, seed, [*extra, *overrides, f"paths.checkpoints={checkpoints}"])
    seconds = time.perf_counter() - started
    peak = peak_rss_mb()
    timing = Path(grid_metrics(s, half, name)) / f"timing_{part}.json"
    if timing.is_file():
        write_json(timing, {**read_json(timing), "peak_rss_mb": peak})
    return f"[science] testtime_grid {half} {name} done in {seconds / 60:.1f} min, peak {peak:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envace.stages.science_grid",
        description=__doc__.split("\n\n")[0],
        epilog="Trailing key=value arguments override params.yaml for every stage run.",
    )
    parser.add_argument("--seed", type=int, required=True, help="a training seed of science.seeds other than the first")
    parser.add_argument("--half", choices=sorted(PART_OF_HALF), required=True)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    telemetry_off()
    configure_logging()
    try:
        line = run(args.seed, args.half, list(args.overrides))
    except (Exception, KeyboardInterrupt) as exc:
        return _failure(f"science testtime_grid {args.half}", exc)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
