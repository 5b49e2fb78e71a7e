"""What every stage shares: load params.yaml (+ CLI ``key=value`` overrides), open the stage's nested
MLflow run, time it, write its metrics files atomically, and turn an exception into a FAILED run.

The loaded config becomes the typed ``Config`` (``envace.config.load.typed_config``) once, here: a stage's ``run``
and its metrics path take it and hand its typed sections on (``cfg.rollout``, ``cfg.eval`` ...).
A stage module is then ``run(cfg, tracker) -> dict`` plus ``main = stage_main("name", run)``: its command
line takes ``key=value`` overrides of params.yaml, answers ``--help`` from the module docstring, and
reports a failure as one stderr line and an exit status (2 configuration, 1 failed; ``ENVACE_DEBUG=1``
adds the traceback) while the stage's MLflow run ends FAILED.

What ``run`` returns is written as two metrics files (``envace.reporting.metrics_files``).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from envace.config.enums import EngineName
from envace.config.load import PARAMS_FILE, ConfigError, flatten, load_params, to_plain, typed_config
from envace.config.schema import Config
from envace.inference.preflight import preflight
from envace.reporting.metrics_files import headline_for, produced_by, write_metrics
from envace.tracking.runs import stage_run
from envace.tracking.tracker import NULL_TRACKER, NullTracker, Tracker
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


def configure_torch(cfg: Config) -> None:
    """Thread count from ``engine.num_threads`` (an int, or ``auto``: see ``resolve_threads``)."""
    import torch  # lazy: only stages that run a model need torch; the report stage starts without it

    # lazy: importing envace.engines.local loads the local engine (transformers, peft); the report stage never does
    from envace.runtime.precision import resolve_threads

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
    "rehearsal_sweep": ("rehearsal.n_tasks=1 'rehearsal.n_attempts_grid=[0,2]'",),
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
    "execute",
    "restart_on_allocator",
    "stage_main",
]
