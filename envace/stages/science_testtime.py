"""The base rehearser's half of the first seed's test-time grid (``testtime_base`` in science/dvc.yaml).

``science testtime --seed K`` runs a seed's rehearsal sweep in one process. For the first seed that is
the whole grid, N × mode × {trained, base}: about twice the work of any other science stage, so it would
run alone on one core while the other idles. The DAG therefore splits it: ``testtime`` runs every seed
with the trained rehearser only (and N=0, which has no rehearser), and this stage runs the first seed's
grid with the base rehearser (the SFT checkpoint) at every N > 0 of ``science.testtime_n_attempts``,
in parallel with it. Its files go to ``<science.metrics>/base_rehearser/testtime/<cell>/`` (the same
layout as the trained half); ``envace.reporting.science`` folds its cells into the seed's sweep, so
every cell is paired with the same tasks and the same N=0 as before the split.

    python -m envace.stages.science_testtime [key=value ...]
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig

from envace.config import PARAMS_FILE, load_params, to_plain
from envace.reporting.science import BASE_REHEARSER_DIR
from envace.stages import science
from envace.stages.runner import EXIT_USAGE, _failure, configure_logging
from envace.utils.telemetry import telemetry_off


def base_attempts(cfg: DictConfig) -> list[int]:
    """The N of the base half: the first seed's grid without N=0."""
    attempts = [int(n) for n in to_plain(cfg.science.testtime_n_attempts) if int(n) != 0]
    if not attempts:
        raise ValueError(
            "science testtime_base: science.testtime_n_attempts has no N > 0, so there is nothing to rehearse "
            "with the base model; add one (e.g. science.testtime_n_attempts=[0,2]) or skip this stage"
        )
    return attempts


def base_overrides(cfg: DictConfig) -> tuple[int, list[str]]:
    """(first seed, the overrides that turn its ``testtime`` part into the base half)."""
    s = cfg.science
    seed = int(to_plain(s.seeds)[0])
    name = science.cell_name(to_plain(s.testtime_variant), seed)
    metrics = f"{s.metrics}/{BASE_REHEARSER_DIR}/testtime/{name}"
    return seed, [
        "rehearsal.rehearsers=[base]",
        f"rehearsal.n_attempts=[{','.join(map(str, base_attempts(cfg)))}]",
        f"paths.rehearsal={s.dir}/testtime_base/{name}",
        f"paths.metrics={metrics}",
        f"paths.plots={metrics}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envace.stages.science_testtime",
        description=__doc__.split("\n\n")[0],
        epilog="Trailing key=value arguments override params.yaml.",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    telemetry_off()
    configure_logging()
    try:
        seed, overrides = base_overrides(load_params(PARAMS_FILE, list(args.overrides)))
        science.run_part("testtime", None, seed, [*overrides, *args.overrides])
    except (Exception, KeyboardInterrupt) as exc:
        return _failure("science testtime_base", exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
