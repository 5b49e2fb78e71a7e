"""What the training stage logs to MLflow beyond params and metrics: rollout tables, data sets, the trained
model and system metrics, plus the helpers every MLflow logger here shares. Every helper is a no-op for the
null tracker and bounded in size. Evaluation / test-time episode traces are ``envace.tracking.traces``'s.

- ``RolloutSampler``: the local engine's ``sample_hook``; per RL step at most ``rollout_rows_per_step``
  trajectories (one per prompt group first, then the next samples; no randomness, so training is
  untouched) as ``mlflow.log_table`` ``rollouts/step_XXXX.json``: prompt id, ACT output, REHEARSE
  output, the real responses where there are any, reward, mean advantage per role.
- ``log_datasets``: the prepared train/val splits as run inputs (``mlflow.log_input``: name, digest of
  the file, source path, a small per-row frame for the schema and profile).
- ``log_policy_model``: the final checkpoint's role directories as MLflow **transformers** logged models
  (the experiment's Models tab: named ``policy`` / ``rehearse_model``, the run as their source, the run's
  latest metrics linked; ``mlflow.transformers.load_model("runs:/<id>/policy")`` or ``"models:/<model id>"``
  gives a text-generation pipeline) when the weights total at most ``tracking.model_max_bytes``; above it
  the run gets a ``model.skipped`` tag and the manifest only.
- ``system_metrics``: MLflow's own monitor (psutil: CPU, memory, disk, network) on the training run.
- ``train_logging``: all of the above around a training run (the train stage's one entry point).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from envace.config.load import to_plain
from envace.core.records import Role

logger = logging.getLogger(__name__)

ROLLOUT_ROWS_PER_STEP = 8
MODEL_MAX_BYTES = 1_000_000_000
MAX_TEXT = 4000  # characters per table cell / span payload


def tracker_client(tracker: Any) -> Any:
    """The tracker's MLflow client, or None (null tracker)."""
    return getattr(tracker, "client", None) if getattr(tracker, "run_id", None) else None


def tracking_setting(cfg: Any, key: str, default: Any) -> Any:
    tracking = getattr(cfg, "tracking", None) if cfg is not None else None
    value = tracking.get(key, default) if hasattr(tracking, "get") else getattr(tracking, key, default)
    return default if value is None else value


def clip_text(text: Any, limit: int = MAX_TEXT) -> str:
    text = text if isinstance(text, str) else json.dumps(text, default=str)
    return text if len(text) <= limit else text[: limit - 12] + "…[clipped]"


# MLflow's settings while envace traces: traces exported synchronously, and trace/span ids drawn from a
# private generator seeded by the OS rather than from Python's ``random``, which every stage seeds
# (``envace.utils.seeds``): with shared ``random`` two runs with the same seed get the same trace ids and
# the later run overwrites the earlier one's traces (and tracing would shift the stage's own draws).
TRACING_ENV = {"MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false", "MLFLOW_TRACE_USE_ISOLATED_RANDOM_ID_GENERATOR": "true"}


@contextlib.contextmanager
def global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI (tracing and the fluent APIs export there) set to ``uri`` for the
    block, tracing under ``TRACING_ENV``, and everything restored afterwards."""
    # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
    import mlflow
    from mlflow.tracking._tracking_service import utils

    before = utils._tracking_uri
    env_before = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", *TRACING_ENV)}
    os.environ.update(TRACING_ENV)
    mlflow.set_tracking_uri(uri)
    mlflow.tracing.reset()  # the tracer provider is rebuilt under TRACING_ENV even if the URI was already set
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            mlflow.flush_trace_async_logging()
        mlflow.set_tracking_uri(before)
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---- rollouts ------------------------------------------------------------------------------------------
def sample_indices(n: int, group_size: int, limit: int) -> list[int]:
    """Up to ``limit`` of ``n`` trajectory indices: the first sample of every group, then the second, …"""
    k = max(1, group_size)
    order = [g * k + s for s in range(k) for g in range((n + k - 1) // k) if g * k + s < n]
    return sorted(order[: max(0, limit)])


def rollout_rows(
    step: int, trajectories: Sequence[Any], advantages: Any, group_size: int, limit: int = ROLLOUT_ROWS_PER_STEP
) -> list[dict[str, Any]]:
    """Table rows for a bounded sample of one step's scored trajectories (see the module docstring)."""
    raw = getattr(advantages, "values", None)
    values = [float(v) for v in (raw.tolist() if hasattr(raw, "tolist") else raw or [])]
    per_traj: list[dict[Role, list[float]]] = []
    pos = 0
    for traj in trajectories:  # the order compute_output_advantages walks the outputs in
        by_role: dict[Role, list[float]] = {}
        for role, _ in traj.outputs():
            if pos < len(values):
                by_role.setdefault(role, []).append(values[pos])
            pos += 1
        per_traj.append(by_role)
    rows = []
    for i in sample_indices(len(trajectories), group_size, limit):
        traj = trajectories[i]
        texts = {role: [seg.text for r, seg in traj.outputs() if r is role] for role in (Role.ACT, Role.REHEARSE)}
        real = [
            {"tool": c.name, "response": r}
            for t in traj.turns
            if not t.rehearsed
            for c, r in zip(t.tool_calls, t.responses)
        ]
        mean = {role: (sum(v) / len(v) if v else None) for role, v in per_traj[i].items()}
        rows.append(
            {
                "step": int(step),
                "prompt_id": str(traj.prompt_id),
                "sample_index": int(traj.sample_index),
                "act_output": clip_text("\n---\n".join(texts[Role.ACT])),
                "rehearse_output": clip_text("\n---\n".join(texts[Role.REHEARSE])),
                "real_response": clip_text(real) if real else "",
                "reward": float(traj.reward),
                "status": getattr(traj.status, "value", str(traj.status)),
                "advantage_act": mean.get(Role.ACT),
                "advantage_rehearse": mean.get(Role.REHEARSE),
            }
        )
    return rows


class RolloutSampler:
    """``LocalEngine.sample_hook``: logs each RL step's bounded rollout sample as an MLflow table."""

    def __init__(self, tracker: Any, group_size: int, limit: int = ROLLOUT_ROWS_PER_STEP) -> None:
        self.tracker, self.group_size, self.limit = tracker, group_size, limit

    def __call__(self, step: int, trajectories: Sequence[Any], advantages: Any) -> None:
        client = tracker_client(self.tracker)
        if client is None or self.limit <= 0:
            return
        try:
            rows = rollout_rows(step, trajectories, advantages, self.group_size, self.limit)
            client.log_table(self.tracker.run_id, pd.DataFrame(rows), f"rollouts/step_{int(step):04d}.json")
        except Exception:  # tracking never breaks training
            logger.exception("MLflow: could not log the rollouts of step %s", step)


# ---- data sets -----------------------------------------------------------------------------------------
def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def log_datasets(
    tracker: Any, splits: Mapping[str, Path], kept: Mapping[str, Iterable[str]] | None = None, prefix: str = ""
) -> list[str]:
    """Log each existing JSONL split as a run input (context = the split name); returns the names logged."""
    client = tracker_client(tracker)
    if client is None:
        return []
    # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
    import mlflow.data
    from mlflow.entities import DatasetInput, InputTag

    inputs, names = [], []
    for split, path in splits.items():
        path = Path(path)
        if not path.is_file():
            continue
        keep = set(kept[split]) if kept and split in kept else None
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        frame = pd.DataFrame(
            [
                {
                    "uuid": str(r.get("uuid", i)),
                    "n_messages": len(r.get("messages", []) or []),
                    "n_tools": len(r.get("tools", []) or []),
                    "kept": keep is None or r.get("uuid") in keep,
                }
                for i, r in enumerate(rows)
            ]
        )
        name = f"{prefix}{split}"
        dataset = mlflow.data.from_pandas(frame, source=str(path), name=name, digest=file_digest(path))
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), [InputTag("mlflow.data.context", split)]))
        names.append(name)
    if inputs:
        try:
            client.log_inputs(tracker.run_id, inputs)
        except Exception:
            logger.exception("MLflow: could not log the data sets %s", names)
            return []
    return names


# ---- the trained model ---------------------------------------------------------------------------------
def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def log_policy_model(
    tracker: Any,
    checkpoints: Path,
    manifest: Mapping[str, Any],
    *,
    enabled: bool = True,
    max_bytes: int = MODEL_MAX_BYTES,
) -> dict[str, str]:
    """Log the checkpoint's role directories (``manifest["roles"]``) as transformers models: the ACT
    directory as ``policy``, a separate REHEARSE directory as ``rehearse_model``. Returns artifact
    path -> checkpoint directory for what was logged ({} when off, too large or failed: a tag says why)."""
    client = tracker_client(tracker)
    if client is None or not enabled:
        return {}
    roles = manifest.get("roles", {})
    dirs: dict[str, Path] = {}
    for artifact, role in (("policy", "act"), ("rehearse_model", "rehearse")):
        path = Path(checkpoints) / roles.get(role, "final/policy")
        if path.is_dir() and path not in dirs.values():
            dirs[artifact] = path
    total = sum(dir_bytes(p) for p in dirs.values())
    if not dirs or total > max_bytes:
        why = "no checkpoint directory" if not dirs else f"{total} bytes > tracking.model_max_bytes={max_bytes}"
        logger.warning("MLflow: checkpoint not logged as a model (%s); the manifest is logged", why)
        tracker.set_tags({"model.skipped": why})
        return {}
    import mlflow.transformers  # lazy: MLflow's transformers flavour loads in seconds; only this model log needs it

    logged = {}
    for artifact, path in dirs.items():
        try:
            with tempfile.TemporaryDirectory() as tmp:
                target = Path(tmp) / artifact
                mlflow.transformers.save_model(
                    transformers_model=str(path),
                    path=str(target),
                    task="text-generation",
                    pip_requirements=_requirements(),
                    metadata={"envace.checkpoint": str(path)},
                )
                model_id = log_logged_model(client, tracker.run_id, artifact, target)
            logged[artifact] = str(path)
            tracker.set_tags({f"model.id.{artifact}": model_id})
        except Exception as exc:  # e.g. an architecture the installed flavour cannot rebuild
            logger.exception("MLflow: could not log %s as a transformers model", path)
            tracker.set_tags({"model.skipped": f"{type(exc).__name__}: {exc}"[:500]})
    if logged:
        tracker.set_tags({"model.uri": f"runs:/{tracker.run_id}/policy", "model.bytes": total})
    return logged


def log_logged_model(client: Any, run_id: str, name: str, saved: Path) -> str:
    """A saved MLflow model directory as a logged model ``name`` of the run's experiment: the run as its
    source and its output, the run's latest metrics linked to it. Returns the model id."""
    # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
    from mlflow.entities import LoggedModelOutput, Metric

    run = client.get_run(run_id)
    model = client.create_logged_model(run.info.experiment_id, name=name, source_run_id=run_id)
    client.log_model_artifacts(model.model_id, str(saved))
    client.finalize_logged_model(model.model_id, "READY")
    latest = [
        max(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)) for key in run.data.metrics
    ]
    step = max((m.step for m in latest), default=0)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
    linked = [Metric(m.key, m.value, m.timestamp, m.step, model_id=model.model_id) for m in latest]
    for i in range(0, len(linked), 1000):  # MLflow's batch limit
        client.log_batch(run_id, metrics=linked[i : i + 1000])
    return model.model_id


def _requirements() -> list[str]:
    """Pinned requirements of the installed stack (MLflow's inference needs torchvision, absent here)."""
    out = []
    for name in ("torch", "transformers", "tokenizers", "safetensors", "accelerate"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name}=={version(name)}")
    return out


# ---- system metrics --------------------------------------------------------------------------------------
@contextlib.contextmanager
def system_metrics(tracker: Any, *, enabled: bool = True, interval_s: float = 10.0) -> Iterator[Any]:
    """MLflow's system-metrics monitor (``system/*``) on the tracker's run for the block (needs psutil)."""
    client = tracker_client(tracker)
    monitor = None
    if client is not None and enabled:
        try:
            # lazy, inside the try: the monitor needs psutil, which is optional (no system metrics without it)
            from mlflow.system_metrics.system_metrics_monitor import (
                SystemMetricsMonitor,
            )

            monitor = SystemMetricsMonitor(
                tracker.run_id, sampling_interval=interval_s, tracking_uri=client.tracking_uri
            )
            monitor.start()
        except Exception:
            logger.warning("MLflow: system metrics unavailable", exc_info=True)
            monitor = None
    try:
        yield monitor
    finally:
        if monitor is not None:
            with contextlib.suppress(Exception):
                monitor.finish()


# ---- training: one entry point for stages/train.py ---------------------------------------------------------
@contextlib.contextmanager
def train_logging(cfg: Any, tracker: Any, engine: Any, checkpoints: Path | None = None) -> Iterator[None]:
    """Around training: data sets as inputs, system metrics, the rollout sampler on engines that have a
    ``sample_hook``; after a successful block the checkpoint at ``checkpoints`` (its manifest) as a model."""
    if tracker_client(tracker) is not None:
        paths = cfg.paths
        kept_file = Path(paths.prompts) / "kept_uuids.json"
        kept = json.loads(kept_file.read_text()) if kept_file.is_file() else None
        log_datasets(
            tracker,
            {s: Path(paths.prepared) / f"{s}.jsonl" for s in ("train", "val")},
            kept,
            prefix=f"{to_plain(cfg.data.source)}-",  # the enum's value: toolworld-train
        )
    hooked = hasattr(engine, "sample_hook")
    if hooked and tracker_client(tracker) is not None:
        engine.sample_hook = RolloutSampler(
            tracker,
            int(cfg.rollout.samples_per_prompt),
            int(tracking_setting(cfg, "rollout_rows_per_step", ROLLOUT_ROWS_PER_STEP)),
        )
    try:
        with system_metrics(tracker, enabled=bool(tracking_setting(cfg, "system_metrics", True))):
            yield
    finally:
        if hooked:
            engine.sample_hook = None
    manifest_file = Path(checkpoints or cfg.paths.checkpoints) / "manifest.json"  # stages.common.MANIFEST
    tracker.log_artifact(manifest_file, "checkpoint")
    tracker.log_artifact(Path(cfg.paths.plots) / "train_steps.csv", "train")
    if tracker_client(tracker) is not None and manifest_file.is_file():
        log_policy_model(
            tracker,
            manifest_file.parent,
            json.loads(manifest_file.read_text()),
            enabled=bool(tracking_setting(cfg, "log_model", True)),
            max_bytes=int(tracking_setting(cfg, "model_max_bytes", MODEL_MAX_BYTES)),
        )
