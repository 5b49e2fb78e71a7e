"""What every stage shares: load params.yaml (+ CLI ``key=value`` overrides), open the stage's nested
MLflow run, time it, write its metrics files atomically, and turn an exception into a FAILED run.

The loaded config becomes the typed ``Config`` (``envace.config.typed_config``) once, here: a stage's ``run``
and its metrics path take it and hand its typed sections on (``cfg.rollout``, ``cfg.eval`` ...).
A stage module is then ``run(cfg, tracker) -> dict`` plus ``main = stage_main("name", run)``: its command
line takes ``key=value`` overrides of params.yaml, answers ``--help`` from the module docstring, and
reports a failure as one stderr line and an exit status (2 configuration, 1 failed; ``ENVACE_DEBUG=1``
adds the traceback) while the stage's MLflow run ends FAILED.

What ``run`` returns is written split in two (``split_metrics``), so that DVC reads numbers only:
``metrics/<stage>.json`` holds the stage's headline numbers and booleans (``HEADLINE``), nested by key
as returned (DVC's ``metrics:``: ``dvc metrics show/diff``); ``metrics/<stage>.details.json`` holds
everything else at the same keys (the other numbers, strings, lists such as per-step curves, None; a
DVC ``outs:`` entry with ``cache: false``).
``read_metrics`` merges both back into what ``run`` returned (``merge_metrics``; a round trip).
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from envace.config import PARAMS_FILE, ConfigError, flatten, load_params, to_plain, typed_config
from envace.config_enums import EngineName
from envace.config_schema import Config
from envace.inference.preflight import preflight
from envace.reporting.provenance import head_state
from envace.tracking import NULL_TRACKER, NullTracker, Tracker
from envace.tracking_runs import stage_run
from envace.utils.io import read_json, write_json
from envace.utils.machine import cpu_has_bf16, cpu_model
from envace.utils.malloc import AllocatorError, ensure_allocator, running_allocator
from envace.utils.secrets import install_log_redaction, redact, register_key_envs
from envace.utils.seeds import seed_everything
from envace.utils.telemetry import telemetry_off

logger = logging.getLogger(__name__)

RunFn = Callable[[Config, Tracker], dict[str, Any]]
MetricsPathFn = Callable[[Config], Path]


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    install_log_redaction()  # API keys a server echoes never reach the log (envace.utils.secrets)
    for noisy in ("alembic", "mlflow.store", "urllib3", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def default_metrics_path(name: str) -> MetricsPathFn:
    return lambda cfg: Path(cfg.paths.metrics) / f"{name}.json"


DETAILS_SUFFIX = ".details.json"


PRODUCED_BY = "produced_by"  # details-file key: the commit whose code wrote it (envace.reporting.provenance)


def produced_by(precision: Any = None) -> dict[str, Any]:
    """``{"commit", "code_dirty", "cpu", "cpu_bf16", "precision"}``: the code running now (the report's stale
    check reads it back), the CPU it runs on and the precision the stage resolved (None where it ran no
    model): bf16 numerics differ between instruction sets, so a result names both."""
    commit, dirty = head_state(Path.cwd())
    return {
        "commit": commit,
        "code_dirty": dirty,
        "cpu": cpu_model(),
        "cpu_bf16": cpu_has_bf16(),
        "precision": precision,
    }


def details_path(metrics_path: Path) -> Path:
    """``metrics/<stage>.json`` -> ``metrics/<stage>.details.json`` (the non-numeric part)."""
    path = Path(metrics_path)
    return path.with_name(path.name.removesuffix(".json") + DETAILS_SUFFIX)


def is_metric(value: Any) -> bool:
    """A value DVC shows as a metric: a finite number or a boolean."""
    if isinstance(value, bool):
        return True
    return isinstance(value, (int, float)) and math.isfinite(value)


# The numbers ``dvc metrics show`` lists per stage (glob patterns over the nested key path, one pattern
# segment per level): few, so that the one-row-per-file table of every stage reads on a terminal. A stage
# not named here keeps all its numbers in its metrics file. The other numbers are in the details file,
# at the same keys: ``dvc metrics show/diff --targets metrics/<stage>.details.json`` lists them.
HEADLINE: dict[str, tuple[str, ...]] = {
    "prepare_data": ("n_raw", "n_train", "n_val", "n_rejected"),
    "template_prompts": ("*/rows_kept", "records_filtered"),
    "train": (
        "steps_done",
        "final/reward/mean",
        "final/loss",
        "final/kl",
        "final/fidelity/field_f1",
        "final/tokens_per_s",
    ),
    "evaluate": (
        "n_tasks",
        "success_gain_vs_base",
        "policy.success_rate",
        "base.success_rate",
        "policy.context_overflows",
        "policy.fidelity.field_f1",
    ),
    "rehearsal_sweep": ("cells.*.success_rate",),
}


def headline_for(stage: str) -> tuple[str, ...] | None:
    """The ``HEADLINE`` patterns of a stage id (``evaluate@bfcl`` -> evaluate's), None when it has none."""
    return HEADLINE.get(stage.split("@")[0])


def _matches(path: tuple[str, ...], patterns: tuple[str, ...] | None) -> bool:
    if patterns is None:
        return True
    for pattern in patterns:
        parts = pattern.split(".")
        if len(parts) == len(path) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(path, parts)):
            return True
    return False


def split_metrics(
    metrics: dict[str, Any], headline: tuple[str, ...] | None = None, _path: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(numbers, details)``: every number/boolean at its nested key in ``numbers`` (with ``headline``
    patterns: only those that match one); everything else (strings, lists, None, NaN/inf, empty dicts,
    unmatched numbers) at the same key in ``details``. Sub-dicts holding both appear in both halves, each
    with its own part, so ``merge_metrics(numbers, details) == metrics``."""
    numbers: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for key, value in metrics.items():
        path = (*_path, str(key))
        if isinstance(value, dict) and value:
            sub_numbers, sub_details = split_metrics(value, headline, path)
            if sub_numbers:
                numbers[key] = sub_numbers
            if sub_details:
                details[key] = sub_details
        elif is_metric(value) and _matches(path, headline):
            numbers[key] = value
        else:
            details[key] = value
    return numbers, details


def merge_metrics(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep merge (a new dict): ``extra``'s keys into ``base``, sub-dicts merged key by key."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_metrics(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_metrics(
    metrics_path: Path, metrics: dict[str, Any], headline: tuple[str, ...] | None = None
) -> tuple[Path, Path]:
    """Write the two halves of ``metrics`` (``split_metrics``); returns (numbers path, details path)."""
    numbers, details = split_metrics(metrics, headline)
    details_file = details_path(metrics_path)
    write_json(details_file, {**details, PRODUCED_BY: produced_by(metrics.get("precision"))})
    write_json(metrics_path, numbers)
    return Path(metrics_path), details_file


def read_metrics(metrics_path: Path) -> dict[str, Any]:
    """A stage's metrics as ``run`` returned them: the numbers file merged with its details file (when
    there is one: files written before the split, or by hand, are read as they are)."""
    metrics = read_json(metrics_path)
    details_file = details_path(metrics_path)
    if isinstance(metrics, dict) and details_file.exists():
        details = {k: v for k, v in read_json(details_file).items() if k != PRODUCED_BY}
        metrics = merge_metrics(metrics, details)
    return metrics


def configure_torch(cfg: Config) -> None:
    """Thread count from ``engine.num_threads`` (an int, or ``auto``: see ``resolve_threads``)."""
    import torch

    # lazy: importing envace.engines.local loads the local engine (transformers, peft); the report stage never does
    from envace.engines.local.precision import resolve_threads

    torch.set_num_threads(resolve_threads(cfg.engine.num_threads))


def execute(
    name: str, run_fn: RunFn, cfg: Config | DictConfig, metrics_path: Path, *, tracking_uri: str | None = None
) -> dict[str, Any]:
    """Run one stage under its MLflow run; returns the metrics (also written: ``write_metrics``). ``run_fn``
    gets the typed ``Config`` (a composed ``DictConfig`` given here is converted once)."""
    cfg = typed_config(cfg)
    register_key_envs(flatten(cfg))  # the configured API keys are redacted from every error text
    preflight(cfg, name)  # a dead endpoint fails the stage before any model loads
    seed_everything(cfg.seed)
    started = time.perf_counter()
    with stage_run(
        name,
        flatten(cfg),
        profile=to_plain(cfg.profile),
        backend=to_plain(cfg.tracking.backend),
        experiment=cfg.tracking.experiment,
        tracking_uri=tracking_uri,
    ) as tracker:
        tracker.set_tags({ALLOCATOR_TAG: running_allocator()})  # the C allocator this stage ran on
        metrics = run_fn(cfg, tracker)
        numbers_file, details_file = write_metrics(metrics_path, metrics, headline_for(name))
        machine = produced_by(metrics.get("precision"))  # what the details file records, on the run too
        tracker.set_tags({f"envace.{k}": str(machine[k]) for k in ("cpu", "cpu_bf16", "precision")})
        seconds = time.perf_counter() - started
        tracker.log_metrics({**flatten(metrics), "stage_seconds": seconds})
        tracker.log_artifact(numbers_file, "metrics")
        tracker.log_artifact(details_file, "metrics")
    logger.info("stage %s done in %.1f s -> %s", name, seconds, metrics_path)
    return metrics


ALLOCATOR_TAG = "envace.allocator"  # stage-run tag: jemalloc | glibc (envace.utils.malloc)
ENV_DEBUG = "ENVACE_DEBUG"  # "1": a failing stage prints its traceback too
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

# ``--help`` examples per stage (a test loads each against params.yaml, so they stay valid keys)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "prepare_data": ("data.n_train=16 data.n_val=4", "seed=1"),
    "template_prompts": ("rollout.max_prompt_tokens=4096",),
    "train": ("train.steps=4 train.checkpoint_every=1", "algo.lr=1e-5 rollout.samples_per_prompt=2"),
    "evaluate": ("eval.benchmark=toolworld eval.n_tasks=2", "eval.compare_base=false"),
    "rehearsal_sweep": ("rehearsal.n_tasks=1 'rehearsal.n_attempts=[0,2]'",),
    "report": ("paths.reports=/tmp/envace-reports",),
}

OVERRIDES_HELP = """\
Configuration: the stage reads params.yaml in the working directory (the composed config that
`make params` writes from conf/ and `dvc repro` reads). Each argument is a Hydra-style override,
key=value on a dotted key of that config, applied for this run only (params.yaml is not changed):
{examples}
Lists: 'eval.benchmarks=[toolworld,bfcl]'. Group selections (profile=smoke, algo=grpo) recompose the
config and are refused here: run `make params ARGS='profile=smoke'` or `dvc exp run -S profile=smoke`.

Exit status: 0 done; 2 bad usage or configuration; 1 the stage failed (one line on stderr; its MLflow
run ends FAILED with the traceback in error.txt); 130 interrupted. {debug}=1 prints the traceback."""


def stage_purpose(module_doc: str | None) -> str:
    """The first paragraph of a stage module's docstring, on one line."""
    paragraphs = inspect.cleandoc(module_doc or "").split("\n\n")
    return " ".join(paragraphs[0].split())


def stage_parser(name: str, module_doc: str | None) -> argparse.ArgumentParser:
    """``python -m envace.stages.<name> [-h] [key=value …]``: purpose from the docstring, override help."""
    examples = "\n".join(f"  python -m envace.stages.{name} {e}" for e in EXAMPLES.get(name, ()))
    parser = argparse.ArgumentParser(
        prog=f"python -m envace.stages.{name}",
        description=stage_purpose(module_doc),
        epilog=OVERRIDES_HELP.format(examples=examples, debug=ENV_DEBUG),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of params.yaml (below)")
    return parser


def one_line(exc: BaseException) -> str:
    """What a user reads of ``exc``: its message on one line (a missing file named with its path)."""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return (
            f"missing input {exc.filename} ({exc.strerror}); run the stage that writes it first "
            "(`dvc repro` runs them in order) or fix the paths.* keys"
        )
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


def _failure(stage_id: str, exc: BaseException) -> int:
    """Report a failed stage on one stderr line (+ traceback with ENVACE_DEBUG=1), configured API keys
    redacted (``envace.utils.secrets``); returns the exit status."""
    if os.environ.get(ENV_DEBUG, "") not in ("", "0"):
        sys.stderr.write(redact("".join(traceback.format_exception(exc))))
    if isinstance(exc, KeyboardInterrupt):
        message, status = "interrupted", EXIT_INTERRUPTED
    elif isinstance(exc, ConfigError):
        message, status = f"bad configuration: {one_line(exc)}", EXIT_USAGE
    elif isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        message, status = one_line(exc), EXIT_FAILED
    else:  # not a user error: name the type and say where the traceback is
        where = next((n for n in getattr(exc, "__notes__", ()) if n.startswith("MLflow run")), "")
        hint = f"{where}; " if where else ""
        message = f"{type(exc).__name__}: {one_line(exc)} ({hint}{ENV_DEBUG}=1 prints the traceback)"
        status = EXIT_FAILED
    sys.stderr.write(redact(f"{stage_id}: error: {message}\n"))
    return status


def restart_on_allocator() -> None:
    """Put a training command line on ``ENVACE_ALLOCATOR``'s C allocator (jemalloc where found): this
    may re-execute the process once, same command line, before any MLflow run opens
    (``envace.utils.malloc.ensure_allocator``). A setting that cannot be honoured is a configuration error."""
    try:
        ensure_allocator()
    except AllocatorError as exc:
        raise ConfigError(str(exc)) from None


def stage_main(
    name: str, run_fn: RunFn, metrics_path: MetricsPathFn | None = None, *, trains: bool = False
) -> Callable[..., int]:
    """Build the ``main(argv)`` of a stage module (``python -m envace.stages.<name> [key=value…]``):
    ``--help`` from the module's docstring; a failure becomes one stderr line and an exit status
    (``_failure``) while its MLflow run ends FAILED (``stage_run``). A stage that ``trains`` on the local
    engine, run from its command line (``argv`` None), starts on the training allocator
    (``restart_on_allocator``)."""
    module_doc = getattr(sys.modules.get(run_fn.__module__), "__doc__", None)

    def main(argv: list[str] | None = None) -> int:
        parser = stage_parser(name, module_doc)
        try:
            overrides = parser.parse_args(sys.argv[1:] if argv is None else argv).overrides
        except SystemExit as done:  # --help (0) or an unknown option (2): argparse has printed why
            return done.code if isinstance(done.code, int) else EXIT_USAGE
        telemetry_off()
        configure_logging()
        stage_id = os.environ.get("DVC_STAGE") or name
        bare = [o for o in overrides if "=" not in o and not o.startswith("~")]
        if bare:
            parser.print_usage(sys.stderr)
            sys.stderr.write(f"{stage_id}: error: {bare} are not overrides: write key=value (e.g. train.steps=4)\n")
            return EXIT_USAGE
        try:
            cfg = typed_config(load_params(PARAMS_FILE, overrides))  # checked, then typed once
            if trains and argv is None and cfg.engine.name == EngineName.local:
                restart_on_allocator()
            execute(stage_id, run_fn, cfg, (metrics_path or default_metrics_path(name))(cfg))
        except (Exception, KeyboardInterrupt) as exc:
            return _failure(stage_id, exc)
        return 0

    return main


__all__ = [
    "NULL_TRACKER",
    "NullTracker",
    "Tracker",
    "configure_torch",
    "details_path",
    "execute",
    "restart_on_allocator",
    "merge_metrics",
    "read_metrics",
    "split_metrics",
    "stage_main",
    "write_metrics",
]
