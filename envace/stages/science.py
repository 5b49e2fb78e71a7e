"""The science matrix: one shared SFT warm-up, variant × seed cells, a test-time sweep, the aggregation.

Each part is a DVC stage (``science_*`` in dvc.yaml; ``make science`` runs them) that runs the ordinary
stages (prepare_data, template_prompts, train, evaluate, rehearsal_sweep) with overrides that put the
matrix's data, checkpoints and metrics in their own places (``science.*`` in conf/config.yaml):

- ``data``: the tool world at ``science.n_train/n_val/n_test`` tasks, generated with ``science.data_seed``;
- ``sft``: the SFT warm-up of the base model (``science.sft_epochs`` over the gold ACT/REHEARSE targets,
  no GRPO step), run once: every cell starts from this checkpoint, the fair comparison;
- ``sft_eval``: the SFT checkpoint (``policy``) and the untrained base model (``base``, never ``auto``,
  which would pick the SFT weights themselves) on the test split, with REHEARSE fidelity on both models'
  own calls and on the oracle's calls — the calibration and the "trained − SFT base" reference;
- ``cell --variant V --seed K``: ``science.steps`` GRPO steps of variant V with training seed K from the
  SFT checkpoint, then the test split. ``data.seed`` stays ``science.data_seed``, so every cell meets the
  same training pool, probe tasks and test tasks (paired comparisons); only training randomness varies.
  The cell's evaluation scores REHEARSE on the oracle's calls (``science.gold_fidelity_tasks``), not on
  the model's own calls (that pass costs ~6 min of a core per cell; the training probe covers it);
- ``testtime --seed K``: the rehearsal sweep on the ``science.testtime_variant`` cell of seed K with the
  trained rehearser: N in ``testtime_n_attempts_grid`` × ``testtime_modes`` for the first seed (N=0 included,
  the shared baseline; each mode's N capped by ``testtime_max_n_by_mode``), N in
  ``testtime_other_seeds_n_attempts_grid`` (parallel) for the others;
- ``testtime_base``: the first seed's grid with the ``base`` rehearser (the SFT checkpoint, the policy
  before RL) and the ``oracle`` one (a sandboxed copy of the real environment, the upper bound) at every
  N > 0 — a stage of its own so that two workers share that seed's grid; its files go
  to ``<science.metrics>/base_rehearser/testtime/<cell>/`` and the aggregate folds them into the seed's
  sweep (same tasks, same N=0);
- ``aggregate``: ``metrics/science.json`` and ``reports/science*`` (envace.reporting.science), with the
  declared primary comparisons (``science.primary``) tested as a family (envace.reporting.science_family);
  every part first checks that family's names.

Per-cell metrics (``science.metrics/<part>/``) are small, git-tracked files (DVC outputs with
``cache: false``), including ``tasks.json``: the per-task outcomes the paired statistics resample.

One precision for the whole matrix: the SFT warm-up decides ``engine.precision`` (``auto``: its probe, once)
and its manifest records it; every later part runs with ``engine.precision`` and ``eval.precision`` pinned to
that record where they are ``auto`` (``precision_pins``), so a busy machine cannot make two cells decide
differently. Every stage writes the precision it ran at (``precision`` in its details file), and the
aggregate refuses a matrix whose files name more than one (``one_precision``), listing them.

    python -m envace.stages.science cell --variant grpo --seed 1 [key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from envace.config.load import PARAMS_FILE, group_switch, load_params, to_plain, typed_config
from envace.config.schema import Config
from envace.reporting.metrics_files import DETAILS_SUFFIX
from envace.reporting.science import aggregate
from envace.reporting.science_family import check_family
from envace.reporting.science_stats import BASE_REHEARSER_DIR
from envace.runtime.precision import cpu_model
from envace.stages import evaluate, prepare_data, rehearsal_sweep, template_prompts, train
from envace.stages.common import MANIFEST
from envace.stages.runner import (
    EXIT_USAGE,
    _failure,
    configure_logging,
    default_metrics_path,
    execute,
    restart_on_allocator,
)
from envace.utils.io import read_json, read_jsonl, write_json
from envace.utils.telemetry import telemetry_off

logger = logging.getLogger(__name__)

PARTS = ("data", "sft", "sft_eval", "cell", "testtime", "testtime_base", "aggregate")
TRAINING_PARTS = ("sft", "cell")  # the parts that train: they start on the training allocator
TASK_FIELDS = (
    "task_id",
    "domain",
    "held_out",
    "held_out_kind",
    "success",
    "score",
    "termination",
    "parse_failures",
    "real_calls",
)
# what each ordinary stage leaves per task, as (directory key in paths, glob, suffix of the label)
OUTCOME_FILES = {"evaluate": ("evaluation", "*.predictions.jsonl"), "rehearsal_sweep": ("rehearsal", "*.records.jsonl")}


def cell_name(variant: str, seed: int) -> str:
    """The directory name of a cell (``envace-seed0``); ``science.json`` keys it ``envace/seed0``."""
    return f"{variant}-seed{int(seed)}"


def _data(s: DictConfig) -> list[str]:
    return [
        f"data.seed={s.data_seed}",
        f"data.n_train={s.n_train}",
        f"data.n_val={s.n_val}",
        f"data.n_test={s.n_test}",
        f"paths.prepared={s.dir}/prepared",
        f"paths.prompts={s.dir}/prompts",
        "tracking.log_model=false",
        "eval.n_tasks=0",
        "eval.benchmark=toolworld",
    ]


def _into(s: DictConfig, part: str) -> list[str]:
    """Metrics and plots of a part into ``science.metrics/<part>`` (git-tracked)."""
    return [f"paths.metrics={s.metrics}/{part}", f"paths.plots={s.metrics}/{part}"]


def _from_sft(cfg: DictConfig) -> list[str]:
    """The model of every cell: the shared SFT checkpoint (its manifest names the policy directory)."""
    s = cfg.science
    return [
        "model.kind=path",
        f"model.path={s.dir}/sft/final/policy",
        f"model.name={cfg.model.name}+sft",
        "train.sft_epochs=0",
    ]


def _eval(s: DictConfig, sft_eval: bool) -> list[str]:
    """``sft_eval``: the SFT checkpoint against the untrained model (``baseline=base``: ``auto`` would pick
    the SFT weights the checkpoint lists, i.e. the evaluated policy), with fidelity on the models' own
    calls; a cell: the trained model alone, fidelity on the oracle's calls only."""
    return [
        f"eval.compare_base={str(sft_eval).lower()}",
        *(["eval.baseline=base"] if sft_eval else []),
        f"eval.fidelity={str(sft_eval).lower()}",
        f"eval.gold_fidelity_tasks={s.gold_fidelity_tasks}",
    ]


def base_attempts(s: DictConfig) -> list[int]:
    """The N of ``testtime_base``: the first seed's grid without N=0."""
    attempts = [int(n) for n in to_plain(s.testtime_n_attempts_grid) if int(n) != 0]
    if not attempts:
        raise ValueError(
            "science testtime_base: science.testtime_n_attempts_grid has no N > 0, so there is nothing to rehearse "
            "with the base model; add one (e.g. science.testtime_n_attempts_grid=[0,2]) or skip this stage"
        )
    return attempts


def part_overrides(cfg: DictConfig, part: str, variant: str | None = None, seed: int | None = None) -> list[list[str]]:
    """The override lists of the ordinary stages that ``part`` runs, in order (one list per stage run)."""
    s = cfg.science
    base = _data(s)
    if part == "data":
        return [[*base, f"seed={s.data_seed}", *_into(s, "data")]] * 2
    if part == "sft":
        return [
            [
                *base,
                f"seed={s.data_seed}",
                "train.steps=0",
                f"train.sft_epochs={s.sft_epochs}",
                "train.fidelity_every=0",
                # no validation probe: sft_eval measures the start, and a probe row after the warm-up would
                # become the run's final metrics in place of the warm-up's (final/sft/loss lost)
                "train.val_every=0",
                f"engine.num_threads={s.sft_threads}",
                f"paths.checkpoints={s.dir}/sft",
                *_into(s, "sft"),
            ]
        ]
    if part == "sft_eval":
        return [
            [
                *base,
                f"seed={s.data_seed}",
                f"paths.checkpoints={s.dir}/sft",
                f"paths.evaluation={s.dir}/sft_eval",
                *_eval(s, True),
                *_into(s, "sft"),
            ]
        ]
    assert variant is not None and seed is not None
    name = cell_name(variant, seed)
    # two cells may run side by side (one per core): one thread each, never the measured ``auto``
    cell = [
        *base,
        f"seed={seed}",
        *_from_sft(cfg),
        f"paths.checkpoints={s.dir}/cells/{name}/checkpoints",
        "engine.num_threads=1",
    ]
    if part == "cell":
        train = [
            *cell,
            # the variant's whole algo group (grpo: its trajectory_mean baseline too), not only its name
            *group_switch("algo", variant, to_plain(cfg.algo.name)),
            f"train.steps={s.steps}",
            f"train.fidelity_every={s.fidelity_every}",
            f"train.val_every={s.val_every}",
            "train.val_tasks=0",  # all science.n_val validation tasks
            *_into(s, f"cells/{name}"),
        ]
        evaluate = [
            *cell,
            f"paths.evaluation={s.dir}/cells/{name}/evaluation",
            *_eval(s, False),
            *_into(s, f"cells/{name}"),
        ]
        return [train, evaluate]
    if part in ("testtime", "testtime_base"):
        first = int(seed) == int(s.seeds[0])
        if part == "testtime_base":
            if not first:
                raise ValueError(f"science testtime_base: runs on the first seed ({s.seeds[0]}), not {seed}")
            # the SFT start answering (the rehearser before RL) and the oracle (a sandboxed real environment:
            # the upper bound of what rehearsal can give), at the same N and tasks as the trained rehearser
            attempts, rehearser, into = base_attempts(s), "base,oracle", f"{BASE_REHEARSER_DIR}/testtime/{name}"
            rehearsal_dir = f"{s.dir}/testtime_base/{name}"
        else:
            attempts = to_plain(s.testtime_n_attempts_grid if first else s.testtime_other_seeds_n_attempts_grid)
            rehearser, into, rehearsal_dir = "trained", f"testtime/{name}", f"{s.dir}/testtime/{name}"
        modes = to_plain(s.testtime_modes) if first else ["parallel"]
        # merged onto params.yaml's rehearsal.max_n_by_mode (a YAML flow mapping: "mode: N", with the space)
        caps = to_plain(s.testtime_max_n_by_mode) if first else {}
        cap_overrides = ["rehearsal.max_n_by_mode={" + ", ".join(f"{m}: {int(n)}" for m, n in caps.items()) + "}"]
        return [
            [
                *cell,
                f"paths.rehearsal={rehearsal_dir}",
                "rehearsal.benchmarks=[toolworld]",
                "rehearsal.split=test",
                f"rehearsal.n_tasks={s.testtime_n_tasks}",
                f"rehearsal.n_attempts_grid=[{','.join(map(str, attempts))}]",
                f"rehearsal.modes=[{','.join(modes)}]",
                *(cap_overrides if caps else []),
                f"rehearsal.rehearsers=[{rehearser}]",
                *_into(s, into),
            ]
        ]
    raise ValueError(f"science: unknown part {part!r}; one of {PARTS}")


PRECISION_KEYS = ("engine.precision", "eval.precision")


def precision_pins(cfg: DictConfig, part: str) -> list[str]:
    """Overrides pinning ``PRECISION_KEYS`` that are ``auto`` to the precision the SFT warm-up decided (its
    manifest's ``precision`` record) for a part after it; [] for the parts up to the SFT warm-up, or when the
    manifest records none (written before records: each stage decides, and the aggregate checks)."""
    if part in ("data", "sft"):
        return []
    manifest = Path(cfg.science.dir) / "sft" / MANIFEST
    record = read_json(manifest).get("precision") if manifest.is_file() else None
    if record is None:
        logger.warning("science %s: %s records no precision; each stage decides its own", part, manifest)
        return []
    auto = [key for key in PRECISION_KEYS if str(OmegaConf.select(cfg, key)) == "auto"]
    return [f"{key}={record['precision']}" for key in auto]


def one_precision(metrics: Path) -> str | None:
    """The precision every stage of the matrix ran at (``precision`` in the details files under ``metrics``),
    None when none records one; raises ``ValueError`` naming each part's when they differ."""
    found = {}
    for path in sorted(metrics.rglob(f"*{DETAILS_SUFFIX}")):
        value = read_json(path).get("precision")
        if value is not None:
            found[str(path.relative_to(metrics)).removesuffix(DETAILS_SUFFIX)] = str(value)
    if len({one for value in found.values() for one in value.split("+")}) > 1:  # "bf16+fp32": a mixed stage
        listing = "; ".join(f"{part}: {value}" for part, value in found.items())
        raise ValueError(
            f"science aggregate: the parts under {metrics} ran at different precisions ({listing}), so their "
            "numbers are not comparable. Re-run the parts at another precision than the SFT warm-up's "
            "(`dvc repro --force --single-item science/dvc.yaml:<stage>`): they take the SFT's precision "
            "unless engine.precision or eval.precision is set explicitly"
        )
    return next(iter(found.values()), None)


def torch_threads() -> int:
    import torch  # lazy: the aggregate and report paths of this module never load torch

    return int(torch.get_num_threads())


def write_task_outcomes(directory: Path, pattern: str, out: Path) -> dict[str, Any]:
    """``tasks.json``: per label (an evaluation's ``policy``/``base``, a sweep's ``n2-parallel-trained``) the
    per-task outcome rows of its records file."""
    outcomes = {}
    for path in sorted(directory.glob(pattern)):
        rows = read_jsonl(path)
        outcomes[path.name.removesuffix(pattern.lstrip("*"))] = [{k: r.get(k) for k in TASK_FIELDS} for r in rows]
    if not outcomes:
        raise FileNotFoundError(f"science: no {pattern} in {directory}: the stage wrote no per-task records")
    write_json(out / "tasks.json", outcomes)
    return outcomes


def _stages() -> dict[str, tuple[str, Callable[..., dict[str, Any]], Callable[[Config], Path]]]:
    return {
        "prepare_data": ("prepare_data", prepare_data.run, default_metrics_path("prepare_data")),
        "template_prompts": ("template_prompts", template_prompts.run, default_metrics_path("template_prompts")),
        "train": ("train", train.run, default_metrics_path("train")),
        "evaluate": ("evaluate", evaluate.run, evaluate.metrics_path),
        "rehearsal_sweep": ("rehearsal_sweep", rehearsal_sweep.run, default_metrics_path("rehearsal_sweep")),
    }


# part -> the ordinary stages it runs, in order
PART_STAGES = {
    "data": ("prepare_data", "template_prompts"),
    "sft": ("train",),
    "sft_eval": ("evaluate",),
    "cell": ("train", "evaluate"),
    "testtime": ("rehearsal_sweep",),
    "testtime_base": ("rehearsal_sweep",),
}


def run_part(part: str, variant: str | None, seed: int | None, extra: list[str]) -> None:
    """Run ``part`` (its stages in this process, each under its own MLflow run), then its outcome files."""
    cfg = load_params(PARAMS_FILE, extra)
    check_family(cfg.science)  # a misnamed primary comparison fails here, not after the matrix has run
    if part == "aggregate":
        logger.info("science: every part ran at precision %s", one_precision(Path(cfg.science.metrics)))
        aggregate(cfg)
        return
    if part == "testtime_base":
        seed = int(to_plain(cfg.science.seeds)[0]) if seed is None else seed
    if part in ("cell", "testtime", "testtime_base"):
        if seed is None or (part == "cell" and variant is None):
            raise ValueError(f"science {part}: give --seed" + (" and --variant" if part == "cell" else ""))
        variant = variant or to_plain(cfg.science.testtime_variant)
    stages = _stages()
    seconds: dict[str, float] = {}
    pins = precision_pins(cfg, part)
    for stage, overrides in zip(PART_STAGES[part], part_overrides(cfg, part, variant, seed)):
        name, run_fn, metrics_path = stages[stage]
        stage_cfg = typed_config(load_params(PARAMS_FILE, [*overrides, *pins, *extra]))
        logger.info("science %s: %s with %s", part, name, " ".join(overrides))
        started = time.perf_counter()
        execute(f"science_{part}/{name}", run_fn, stage_cfg, metrics_path(stage_cfg))
        seconds[name] = time.perf_counter() - started
        if name in OUTCOME_FILES:
            key, pattern = OUTCOME_FILES[name]
            records = Path(getattr(stage_cfg.paths, key)) / "toolworld"
            write_task_outcomes(records, pattern, Path(stage_cfg.paths.metrics))
    # wall time of each stage run, for the report's cost table (the file is part of the part's outputs)
    write_json(
        Path(stage_cfg.paths.metrics) / f"timing_{part}.json",
        {"part": part, "seconds": seconds, "threads": torch_threads(), "cpu": cpu_model()},
    )


PartRunner = Callable[[str, str | None, int | None, list[str]], str | None]


def cli(prog: str, doc: str, run: PartRunner, argv: list[str] | None) -> int:
    """The command line of a science part, shared by this module and ``science_matrix``: ``run(part,
    variant, seed, overrides)`` does the work; a line it returns is printed when the part ends."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog="Trailing key=value arguments override params.yaml for every stage run.",
    )
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--variant", default=None, help="cell: the algo option of the cell")
    parser.add_argument(
        "--seed", type=int, default=None, help="cell/testtime: the training seed of the cell (testtime_base: the first)"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    telemetry_off()
    configure_logging()
    try:
        if argv is None and args.part in TRAINING_PARTS:
            restart_on_allocator()
        line = run(args.part, args.variant, args.seed, list(args.overrides))
    except (Exception, KeyboardInterrupt) as exc:
        return _failure(f"science {args.part}", exc)
    if line:
        print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("python -m envace.stages.science", __doc__, run_part, argv)


if __name__ == "__main__":
    raise SystemExit(main())
