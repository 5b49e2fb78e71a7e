"""Launching verl: dataset preparation, the ``main_ppo`` command, Ray multi-node commands, MLflow wiring.

Single node (the ``train`` stage): ``launch_verl_training(cfg)`` (the typed ``Config``) writes the verl datasets, builds
``python -m verl.trainer.main_ppo <overrides>`` (``config_builder``), logs it and runs it as a
subprocess (verl starts its own local Ray cluster); ``dry_run=True`` composes verl's config with the
overrides (struct errors surface here, on a CPU machine) and prints the command instead.

Multi-node: ``multinode_commands`` gives the ``ray start`` lines for the head and the workers and the
``ray job submit -- python -m verl.trainer.main_ppo …`` line (no job runtime env: the workers' environment has
one source, the overrides); ``write_multinode_scripts`` writes them as scripts, creates ``<output_dir>/metrics/``,
makes ``submit.sh`` refuse a second submission of the same launch and mark the MLflow child run FAILED when the
job fails. docs/GPU.md walks through them.

Checks: ``plan_launch`` runs ``preflight`` on verl's composed config before anything is created, and falls back
to sdpa attention when flash-attn is not installed (``attention_impl``; refused when flash was asked for).

MLflow: verl's ``mlflow`` logger attaches to the run named by ``MLFLOW_RUN_ID``. With a parent run (the
``train`` stage's run, or ``ENVACE_PARENT_RUN_ID``) we create a child run ``verl`` under it and hand
its id and an absolute ``MLFLOW_TRACKING_URI`` to every Ray worker through ``runtime_env.env_vars``
(verl logs its whole config as params; a child run keeps those apart from the stage's own params,
where a clash would make verl silently drop MLflow). verl's ``file`` logger also writes one JSON line
per step under ``<output_dir>/metrics/`` (read back by ``VerlEngine`` for the stage's callbacks).

Checkpoints: ``<output_dir>/checkpoints/global_step_N`` (verl's own format, HF weights included);
with ``train.resume`` a re-run of the same output directory continues from the latest one
(``trainer.resume_mode=auto``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from envace.config.load import load_params, typed_config
from envace.config.schema import Config, ModelConfig
from envace.engines.verl.attention_impl import attention_overrides
from envace.engines.verl.config_builder import (
    ConfigLike,
    VerlConfigError,
    build_overrides,
    check_supported,
    compose_verl_config,
)
from envace.engines.verl.episodes import act_prompt_uuids, split_records, write_dataset
from envace.engines.verl.preflight import preflight
from envace.utils.io import read_jsonl

logger = logging.getLogger(__name__)

PLUGIN_MODULE = "envace.engines.verl.plugin"
MAIN_MODULE = "verl.trainer.main_ppo"
LAUNCHER_MODULE = "envace.engines.verl.launcher"  # not __name__: "__main__" under python -m
TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
SPLITS = ("train", "val")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, computed without side effects."""

    command: list[str]
    overrides: list[str]
    env_vars: dict[str, str]
    output_dir: Path
    data_files: dict[str, Path]
    model_path: str
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        return shlex.join(self.command)

    @property
    def metrics_file(self) -> Path:
        """Where verl's ``file`` logger writes this launch's step metrics (it does not create the folder)."""
        return Path(self.env_vars["VERL_FILE_LOGGER_PATH"])


# ---- model and data -----------------------------------------------------------------------------
def _path_model(model: ModelConfig) -> str:
    if not model.path:
        raise VerlConfigError("model.kind=path needs model.path (a local HF model directory)")
    return str(Path(model.path).expanduser().resolve())


def _smollm2_model(model: ModelConfig) -> str:
    # lazy: envace.models loads transformers (~4.5 s); the train stage imports this module to build its config,
    # and a dead judge endpoint must fail it before that (tests/integration/test_endpoint_faults.py)
    from envace.models import ModelSpec
    from envace.models.smollm2 import ensure_smollm2_cache, model_cache_root

    return str(ensure_smollm2_cache(model_cache_root(ModelSpec(kind="smollm2"))))


def _tiny_model(model: ModelConfig) -> str:
    raise VerlConfigError(
        "model.kind=tiny is built in memory; verl loads models from a directory. Save it "
        "first (scripts/gpu_smoke.py does: build_tiny_model_dir) and use model.kind=path"
    )


MODEL_DIRS: dict[str, Callable[[ModelConfig], str]] = {
    "path": _path_model,
    "smollm2": _smollm2_model,
    "tiny": _tiny_model,
}


def model_dir(cfg: ConfigLike) -> str:
    """The local model directory verl loads (never a hub id)."""
    model = typed_config(cfg).model
    kind = model.kind.value
    if kind not in MODEL_DIRS:
        raise VerlConfigError(f"model.kind={kind!r}; valid for verl: {sorted(MODEL_DIRS)}")
    return MODEL_DIRS[kind](model)


def data_files(output_dir: Path) -> dict[str, Path]:
    return {split: output_dir / "data" / f"{split}.parquet" for split in SPLITS}


def prepare_verl_data(
    cfg: ConfigLike, output_dir: Path | str, *, uuids: Sequence[str] | None = None
) -> dict[str, Path]:
    """Write ``<output_dir>/data/{train,val}.parquet`` from the pipeline's files.

    Instructions are the ACT records of ``template_prompts``' ``{split}.parquet`` (rows whose prompts fit);
    episodes are built from ``prepare_data``'s ``{split}.jsonl`` rows. ``uuids`` restricts the train split
    (the ``train`` stage's own selection). An empty val split reuses the train file.
    """
    cfg = typed_config(cfg)
    paths, source = cfg.paths, cfg.data.source.value
    files = data_files(Path(output_dir))
    for split in SPLITS:
        parquet = Path(paths.prompts) / f"{split}.parquet"
        prepared = Path(paths.prepared) / f"{split}.jsonl"
        if not parquet.is_file() or not prepared.is_file():
            raise FileNotFoundError(
                f"verl data: {parquet} or {prepared} is missing; run the prepare_data and template_prompts stages first"
            )
        chosen = act_prompt_uuids(parquet)
        if split == "train" and uuids is not None:
            chosen = [u for u in chosen if u in set(uuids)]
        records = split_records(chosen, read_jsonl(prepared), split, source)
        if records:
            write_dataset(files[split], records)
        elif split == "train":
            raise ValueError("verl data: no training instructions left; check template_prompts' kept rows")
        else:
            files[split] = files["train"]
        logger.info("verl data: %d %s instructions -> %s", len(records), split, files[split])
    _check_batch(cfg, files["train"])
    return files


def _check_batch(cfg: Config, train_file: Path) -> None:
    n_rows = len(pd.read_parquet(train_file, columns=["agent_name"]))
    batch = cfg.rollout.prompts_per_step
    if n_rows < batch:
        raise VerlConfigError(
            f"rollout.prompts_per_step={batch} but only {n_rows} training instructions; verl "
            "drops incomplete batches, so lower prompts_per_step or add data"
        )


# ---- MLflow --------------------------------------------------------------------------------------
def absolute_tracking_uri(uri: str) -> str:
    """``sqlite:///rel.db`` → ``sqlite:////abs/rel.db`` (Ray workers do not share the driver's cwd)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    if "://" not in uri:  # a bare directory
        return str(Path(uri).resolve())
    return uri


def create_child_run(tracking_uri: str, parent_run_id: str, name: str = "verl") -> str:
    """A run nested under ``parent_run_id`` (same experiment) for verl to attach to; returns its id."""
    # lazy: mlflow takes seconds to import and is needed only with a parent run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    run = client.create_run(
        parent.info.experiment_id,
        run_name=name,
        tags={"mlflow.parentRunId": parent_run_id, "envace.kind": "engine", "envace.engine": "verl"},
    )
    return run.info.run_id


def mlflow_env(
    cfg: ConfigLike, *, tracking_uri: str | None, parent_run_id: str | None, create: bool
) -> tuple[dict[str, str], list[str]]:
    """Env vars attaching verl's MLflow logger to a child of the parent run (and notes for the log)."""
    tracking = typed_config(cfg).tracking
    if tracking.backend.value != "mlflow":
        return {}, ["tracking.backend is not mlflow: verl logs to the console only"]
    uri = absolute_tracking_uri(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db")
    env = {"MLFLOW_TRACKING_URI": uri}
    parent = parent_run_id or os.environ.get("ENVACE_PARENT_RUN_ID")
    if not parent:
        return env, [f"no parent run: verl creates its own run in experiment {tracking.experiment!r}"]
    if not create:
        return env, [f"a child run of {parent} is created at launch and passed as MLFLOW_RUN_ID"]
    env["MLFLOW_RUN_ID"] = create_child_run(uri, parent)
    return env, [f"verl logs to MLflow run {env['MLFLOW_RUN_ID']} (child of {parent})"]


def finish_child_run(env: Mapping[str, str], returncode: int) -> None:
    """Mark the child run FAILED when verl failed (verl ends it FINISHED itself on success)."""
    if "MLFLOW_RUN_ID" not in env or returncode == 0:
        return
    # lazy: mlflow takes seconds to import and is needed only when verl failed under a child run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    client.set_tag(env["MLFLOW_RUN_ID"], "envace.returncode", str(returncode))
    client.set_terminated(env["MLFLOW_RUN_ID"], status="FAILED")


# ---- commands ------------------------------------------------------------------------------------
def verl_command(overrides: Sequence[str], python: str | None = None) -> list[str]:
    """``python -m verl.trainer.main_ppo <overrides>`` as an argv list (no shell quoting needed)."""
    return [python or sys.executable, "-m", MAIN_MODULE, *overrides]


def multinode_commands(
    overrides: Sequence[str], *, head: str = "$HEAD_IP", n_gpus_per_node: int = 8, python: str = "python"
) -> dict[str, str]:
    """Shell lines for a Ray cluster: start the head, start each worker, submit the job from the head.

    The job carries no ``--runtime-env-json``: the workers' environment has one source, the
    ``+ray_kwargs.ray_init.runtime_env.env_vars.*`` overrides, which ``main_ppo`` passes to ``ray.init``. Ray
    refuses to start a job whose own runtime env shares any env var key with ``ray.init``'s, even with equal
    values ("Failed to merge the Job's runtime env").
    """
    job = [python, "-m", MAIN_MODULE, *overrides]
    return {  # the dashboard (Ray's unauthenticated job API) listens on the cluster address, not on all interfaces
        "head": f"ray start --head --port=6379 --dashboard-host={head} --num-gpus={n_gpus_per_node}",
        "worker": f"ray start --address={head}:6379 --num-gpus={n_gpus_per_node}",
        "submit": f"ray job submit --address=http://{head}:8265 -- " + shlex.join(job),
    }


def default_output_dir(cfg: ConfigLike) -> Path:
    cfg = typed_config(cfg)
    name = f"{cfg.experiment_name}-{cfg.algo.name.value}"
    return (Path(".envace") / "verl" / name).resolve()


def plan_launch(
    cfg: ConfigLike,
    *,
    output_dir: Path | str | None = None,
    dry_run: bool = False,
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    extra_overrides: Sequence[str] = (),
    files: Mapping[str, Path] | None = None,
    model_path: str | None = None,
) -> LaunchPlan:
    """Compute the launch (data paths, env vars, overrides, command) and check it against verl's composed config
    (``preflight``: raises on what verl would refuse, logs warnings into the notes); creates the MLflow child run
    unless ``dry_run``. Does not write datasets (``prepare_verl_data`` does)."""
    cfg = typed_config(cfg)
    check_supported(cfg)
    out = Path(output_dir).resolve() if output_dir else default_output_dir(cfg)
    files = dict(files or data_files(out))
    model = model_path or model_dir(cfg)
    launch_id = time.strftime("%Y%m%d-%H%M%S")
    # flash-attn or sdpa for the actor (refused here when flash is asked for and missing), before the user's overrides
    attention = attention_overrides([*cfg.engine.overrides, *extra_overrides])

    def plan(create_run: bool) -> tuple[dict[str, str], list[str], list[str]]:
        env, notes = mlflow_env(cfg, tracking_uri=tracking_uri, parent_run_id=parent_run_id, create=create_run)
        env.update(
            {
                "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
                "VERL_FILE_LOGGER_PATH": str(out / "metrics" / f"{launch_id}.jsonl"),
                **TELEMETRY_OFF,
            }
        )
        overrides = build_overrides(
            cfg,
            train_files=[str(files["train"])],
            val_files=[str(files["val"])],
            output_dir=out,
            model_path=model,
            env_vars=env,
            extra_loggers=["file"],
        )
        return env, notes, overrides + attention + list(extra_overrides)

    env, notes, overrides = plan(create_run=False)
    warnings = preflight(cfg, overrides)  # before the MLflow child run exists: a refused launch leaves none
    if not dry_run:
        env, notes, overrides = plan(create_run=True)
    notes += [f"warning: {w}" for w in warnings]
    if attention:
        notes.append(f"flash_attn is not installed: the actor trains with sdpa attention ({' '.join(attention)})")
    return LaunchPlan(verl_command(overrides), overrides, env, out, files, model, notes)


def launch_verl_training(
    cfg: ConfigLike,
    *,
    dry_run: bool = False,
    output_dir: Path | str | None = None,
    uuids: Sequence[str] | None = None,
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    extra_overrides: Sequence[str] = (),
) -> int:
    """Train with verl on this node: prepare data, build and log the command, run it; returns its exit code.

    ``cfg`` is our typed ``Config`` (a ``DictConfig`` or plain mapping of it is converted once). With
    ``dry_run`` nothing is written or started: verl's config is composed with the overrides (when verl is
    installed) and the command is printed; returns 0.
    """
    cfg = typed_config(cfg)
    plan = plan_launch(
        cfg,
        output_dir=output_dir,
        dry_run=dry_run,
        tracking_uri=tracking_uri,
        parent_run_id=parent_run_id,
        extra_overrides=extra_overrides,
    )
    for note in plan.notes:
        logger.info("verl launch: %s", note)
    logger.info("verl command:\n%s", plan.shell())
    if dry_run:
        try:
            compose_verl_config(plan.overrides)
            logger.info("verl config composes with %d overrides (dry run, nothing started)", len(plan.overrides))
        except VerlConfigError as exc:  # verl not installed here: the command is still useful
            logger.warning("verl config not checked: %s", exc)
        sys.stdout.write(plan.shell() + "\n")
        return 0
    prepare_verl_data(cfg, plan.output_dir, uuids=uuids)
    plan.metrics_file.parent.mkdir(parents=True, exist_ok=True)
    (plan.output_dir / "command.sh").write_text(plan.shell() + "\n", encoding="utf-8")
    env = {**os.environ, **plan.env_vars}
    returncode = subprocess.run(plan.command, env=env, check=False).returncode
    finish_child_run(plan.env_vars, returncode)
    if returncode != 0:
        logger.error("verl exited with %d; the command is in %s", returncode, plan.output_dir / "command.sh")
    return returncode


def _refuse_a_second_submission(metrics_file: Path) -> str:
    """Shell lines that stop ``submit.sh`` once its launch's metrics file exists (verl would truncate it)."""
    quoted = shlex.quote(str(metrics_file))
    message = (
        f"envace: {metrics_file} exists: this submit.sh already launched a run, and verl would overwrite its "
        "metrics. One submit.sh is one launch (one metrics file, one MLflow run): run "
        "'python -m envace.engines.verl.launcher --multinode HEAD_IP' again for a new launch "
        "(with train.resume it continues from the latest checkpoint)."
    )
    return f"if [ -e {quoted} ]; then\n  echo {shlex.quote(message)} >&2\n  exit 1\nfi\n"


def _fail_child_run_on_error(env: Mapping[str, str], python: str = "python") -> str:
    """Shell lines making ``submit.sh`` mark the launch's MLflow child run FAILED when the job fails (``ray job
    submit`` exits non-zero), also where verl never attached to the run (a failure before its training loop, where
    the ``envace`` trainer's own hook cannot see it); empty without a child run."""
    if "MLFLOW_RUN_ID" not in env:
        return ""
    run, uri = env["MLFLOW_RUN_ID"], env["MLFLOW_TRACKING_URI"]
    mark = shlex.join([python, "-m", LAUNCHER_MODULE, "--fail-run", run, "--tracking-uri", uri])
    return (
        "envace_on_exit() {\n"
        "  code=$?\n"
        f'  if [ "$code" -ne 0 ]; then {mark} --returncode "$code" || true; fi\n'
        '  exit "$code"\n'
        "}\n"
        "trap envace_on_exit EXIT\n"
    )


def write_multinode_scripts(plan: LaunchPlan, head: str, n_gpus_per_node: int) -> dict[str, Path]:
    """``head.sh`` / ``worker.sh`` / ``submit.sh`` next to the run (printed by the CLI; each script's command is
    its last line), and the metrics folder verl's file logger writes into without creating it. ``submit.sh``
    refuses to run again once its metrics file exists, so a re-submission never overwrites a run's metrics, and marks
    the launch's MLflow child run FAILED when the job fails."""
    plan.metrics_file.parent.mkdir(parents=True, exist_ok=True)
    guards = {"submit": _refuse_a_second_submission(plan.metrics_file) + _fail_child_run_on_error(plan.env_vars)}
    paths = {}
    for name, line in multinode_commands(plan.overrides, head=head, n_gpus_per_node=n_gpus_per_node).items():
        path = plan.output_dir / f"{name}.sh"
        body = guards.get(name, "") + line
        path.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n{body}\n", encoding="utf-8")
        path.chmod(0o755)
        paths[name] = path
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m envace.engines.verl.launcher --params params.yaml [--dry-run | --multinode HEAD_IP]
    [verl overrides…]`` (see docs/GPU.md); ``--fail-run RUN_ID --tracking-uri URI --returncode N`` is what a failed
    ``submit.sh`` calls."""
    parser = argparse.ArgumentParser(description="Train with verl from a composed envace params.yaml")
    parser.add_argument("--params", default="params.yaml", help="composed envace config (make params)")
    parser.add_argument("--output-dir", default=None, help="run directory (data, checkpoints, metrics)")
    parser.add_argument("--dry-run", action="store_true", help="compose verl's config and print the command")
    parser.add_argument("--multinode", metavar="HEAD_IP", help="prepare data and write head/worker/submit scripts")
    parser.add_argument("--fail-run", metavar="RUN_ID", help="mark this MLflow run FAILED (submit.sh, on error)")
    parser.add_argument("--tracking-uri", help="with --fail-run: the MLflow tracking URI")
    parser.add_argument("--returncode", type=int, default=1, help="with --fail-run: the failed command's status")
    parser.add_argument("verl_overrides", nargs="*", help="extra main_ppo overrides, appended last (they win)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.fail_run:
        env = {"MLFLOW_RUN_ID": args.fail_run, "MLFLOW_TRACKING_URI": args.tracking_uri or ""}
        finish_child_run(env, args.returncode or 1)
        logger.error("verl job failed (exit %d): MLflow run %s marked FAILED", args.returncode, args.fail_run)
        return 0
    cfg = typed_config(load_params(args.params))  # schema and cross-field checks, as a stage loads it
    if not args.multinode:
        return launch_verl_training(
            cfg, dry_run=args.dry_run, output_dir=args.output_dir, extra_overrides=args.verl_overrides
        )
    plan = plan_launch(cfg, output_dir=args.output_dir, extra_overrides=args.verl_overrides)
    prepare_verl_data(cfg, plan.output_dir)
    gpus = cfg.engine.n_gpus_per_node
    for name, path in write_multinode_scripts(plan, args.multinode, gpus).items():
        sys.stdout.write(f"# {name}: {path}\n{path.read_text(encoding='utf-8').splitlines()[-1]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
