"""What the stages log to MLflow beyond params and metrics: rollout tables, data sets, the trained model,
system metrics and episode traces. Every helper is a no-op for the null tracker and bounded in size.

- ``RolloutSampler``: the local engine's ``sample_hook``; per RL step at most ``rollout_rows_per_step``
  trajectories (one per prompt group first, then the next samples; no randomness, so training is
  untouched) as ``mlflow.log_table`` ``rollouts/step_XXXX.json``: prompt id, ACT output, REHEARSE
  output, the real responses where there are any, reward, mean advantage per role.
- ``log_datasets``: the prepared train/val splits as run inputs (``mlflow.log_input``: name, digest of
  the file, source path, a small per-row frame for the schema and profile).
- ``log_policy_model``: the final checkpoint's role directories as MLflow **transformers** models
  (``mlflow.transformers.load_model("runs:/<id>/policy")`` gives a text-generation pipeline) when the
  weights total at most ``tracking.model_max_bytes``; above it the run gets a ``model.skipped`` tag and
  the manifest only.
- ``system_metrics``: MLflow's own monitor (psutil: CPU, memory, disk, network) on the training run.
- ``log_episode_traces``: evaluation / test-time episodes as traces (one span per ACT output, tool call,
  REHEARSE answer and real response; rehearsal attempts nested under their turn), with the score as a
  span attribute and a ``score`` feedback assessment; at most ``tracking.max_traces`` per stage run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from envace.core.records import Role
from envace.core.rehearsal import turn_from_json

logger = logging.getLogger(__name__)

ROLLOUT_ROWS_PER_STEP = 8
MAX_TRACES = 20
MODEL_MAX_BYTES = 1_000_000_000
MAX_TEXT = 4000  # characters per table cell / span payload
_TRACE_COUNTS: dict[str, int] = {}


def _client(tracker: Any) -> Any:
    """The tracker's MLflow client, or None (null tracker)."""
    return getattr(tracker, "client", None) if getattr(tracker, "run_id", None) else None


def _setting(cfg: Any, key: str, default: Any) -> Any:
    tracking = getattr(cfg, "tracking", None) if cfg is not None else None
    value = tracking.get(key, default) if hasattr(tracking, "get") else getattr(tracking, key, default)
    return default if value is None else value


def _clip(text: Any, limit: int = MAX_TEXT) -> str:
    text = text if isinstance(text, str) else json.dumps(text, default=str)
    return text if len(text) <= limit else text[: limit - 12] + "…[clipped]"


@contextlib.contextmanager
def global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI (tracing and the fluent APIs export there) set to ``uri`` for the
    block, traces exported synchronously, and everything restored afterwards."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    before, env_before = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    async_before = os.environ.get("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING")
    os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            mlflow.flush_trace_async_logging()
        mlflow.set_tracking_uri(before)
        for key, value in (("MLFLOW_TRACKING_URI", env_before), ("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", async_before)):
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
                "act_output": _clip("\n---\n".join(texts[Role.ACT])),
                "rehearse_output": _clip("\n---\n".join(texts[Role.REHEARSE])),
                "real_response": _clip(real) if real else "",
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
        client = _client(self.tracker)
        if client is None or self.limit <= 0:
            return
        try:
            import pandas as pd

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
    client = _client(tracker)
    if client is None:
        return []
    import mlflow.data
    import pandas as pd
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
    client = _client(tracker)
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
    import mlflow.transformers

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
                client.log_artifacts(tracker.run_id, str(target), artifact)
            logged[artifact] = str(path)
        except Exception as exc:  # e.g. an architecture the installed flavour cannot rebuild
            logger.exception("MLflow: could not log %s as a transformers model", path)
            tracker.set_tags({"model.skipped": f"{type(exc).__name__}: {exc}"[:500]})
    if logged:
        tracker.set_tags({"model.uri": f"runs:/{tracker.run_id}/policy", "model.bytes": total})
    return logged


def _requirements() -> list[str]:
    """Pinned requirements of the installed stack (MLflow's inference needs torchvision, absent here)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("torch", "transformers", "tokenizers", "safetensors", "accelerate"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name}=={version(name)}")
    return out


# ---- system metrics --------------------------------------------------------------------------------------
@contextlib.contextmanager
def system_metrics(tracker: Any, *, enabled: bool = True, interval_s: float = 10.0) -> Iterator[Any]:
    """MLflow's system-metrics monitor (``system/*``) on the tracker's run for the block (needs psutil)."""
    client = _client(tracker)
    monitor = None
    if client is not None and enabled:
        try:
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
    if _client(tracker) is not None:
        paths = cfg.paths
        kept_file = Path(paths.prompts) / "kept_uuids.json"
        kept = json.loads(kept_file.read_text()) if kept_file.is_file() else None
        log_datasets(
            tracker,
            {s: Path(paths.prepared) / f"{s}.jsonl" for s in ("train", "val")},
            kept,
            prefix=f"{cfg.data.source}-",
        )
    hooked = hasattr(engine, "sample_hook")
    if hooked and _client(tracker) is not None:
        engine.sample_hook = RolloutSampler(
            tracker,
            int(cfg.rollout.samples_per_prompt),
            int(_setting(cfg, "rollout_rows_per_step", ROLLOUT_ROWS_PER_STEP)),
        )
    try:
        with system_metrics(tracker, enabled=bool(_setting(cfg, "system_metrics", True))):
            yield
    finally:
        if hooked:
            engine.sample_hook = None
    manifest_file = Path(checkpoints or cfg.paths.checkpoints) / "manifest.json"  # stages.common.MANIFEST
    tracker.log_artifact(manifest_file, "checkpoint")
    tracker.log_artifact(Path(cfg.paths.plots) / "train_steps.csv", "train")
    if _client(tracker) is not None and manifest_file.is_file():
        log_policy_model(
            tracker,
            manifest_file.parent,
            json.loads(manifest_file.read_text()),
            enabled=bool(_setting(cfg, "log_model", True)),
            max_bytes=int(_setting(cfg, "model_max_bytes", MODEL_MAX_BYTES)),
        )


# ---- episode traces -----------------------------------------------------------------------------------------
def _turn(value: Any) -> Any:
    if isinstance(value, Mapping):
        return turn_from_json(value)
    return value


def _turn_spans(client: Any, trace_id: str, parent_id: str, turns: Iterable[Any], index0: int = 0) -> None:
    for i, turn in enumerate((_turn(t) for t in turns), start=index0):
        act = client.start_span(
            f"ACT {i}",
            trace_id=trace_id,
            parent_id=parent_id,
            span_type="LLM",
            inputs={"user_turn": turn.user_turn},
            attributes={"envace.role": "act"},
        )
        client.end_span(trace_id, act.span_id, outputs={"text": _clip(turn.act_text)})
        for j, call in enumerate(turn.tool_calls):
            response = turn.responses[j] if j < len(turn.responses) else None
            real = not turn.rehearsed and j not in turn.stand_ins
            tool = client.start_span(
                call.name,
                trace_id=trace_id,
                parent_id=parent_id,
                span_type="TOOL",
                inputs=dict(call.arguments)
                if isinstance(call.arguments, Mapping)
                else {"arguments": _clip(call.arguments)},
                attributes={"envace.response": "real" if real else "rehearsed"},
            )
            answer = client.start_span(
                "real response" if real else "REHEARSE answer",
                trace_id=trace_id,
                parent_id=tool.span_id,
                span_type="TOOL" if real else "LLM",
                attributes={"envace.role": "environment" if real else "rehearse"},
            )
            client.end_span(trace_id, answer.span_id, outputs={"response": _clip(response)})
            client.end_span(trace_id, tool.span_id, outputs={"response": _clip(response)})


def _episode_trace(client: Any, experiment_id: str, run_id: str, record: Any, tags: Mapping[str, str]) -> str:
    inputs = {
        "benchmark": record.benchmark,
        "task_id": record.task_id,
        "domain": record.domain,
        "policy": record.policy,
    }
    attrs = {
        "envace.score": float(record.score),
        "envace.success": bool(record.success),
        "envace.termination": getattr(record.termination, "value", str(record.termination)),
    }
    root = client.start_trace(
        f"episode {record.task_id}",
        span_type="AGENT",
        inputs=inputs,
        attributes=attrs,
        tags=dict(tags),
        experiment_id=experiment_id,
        run_id=run_id,
    )
    tid = root.trace_id
    rehearsal = record.info.get("rehearsal") if isinstance(record.info, Mapping) else None
    for outcome in (rehearsal or {}).get("outcomes", []) or []:
        block = client.start_span(
            f"rehearsal (turn {outcome.get('turn_index')})",
            trace_id=tid,
            parent_id=root.span_id,
            span_type="CHAIN",
            attributes={"envace.n_attempts": len(outcome.get("attempts", []))},
        )
        for attempt in outcome.get("attempts", []):
            span = client.start_span(
                f"attempt {attempt.get('index')}", trace_id=tid, parent_id=block.span_id, span_type="AGENT"
            )
            _turn_spans(client, tid, span.span_id, attempt.get("turns", []))
            client.end_span(
                tid,
                span.span_id,
                outputs={
                    "final_answers": attempt.get("final_answers", []),
                    "critique": _clip(attempt.get("critique_text", "")),
                },
            )
        client.end_span(tid, block.span_id, outputs={"memory": _clip(outcome.get("memory", ""))})
    _turn_spans(client, tid, root.span_id, record.turns)
    client.end_trace(
        tid, outputs={"final_answers": list(record.final_answers), "score": float(record.score), "error": record.error}
    )
    return tid


def log_episode_traces(
    tracker: Any,
    records: Sequence[Any],
    *,
    tags: Mapping[str, Any] | None = None,
    limit: int | None = None,
    max_traces: int = MAX_TRACES,
) -> list[str]:
    """Log up to ``limit`` of ``records`` (EpisodeRecord) as traces linked to the tracker's run, never more
    than ``max_traces`` per run in all; returns the trace ids."""
    client = _client(tracker)
    if client is None or not records:
        return []
    run_id = tracker.run_id
    budget = max_traces - _TRACE_COUNTS.get(run_id, 0)
    chosen = list(records)[: max(0, min(budget, len(records) if limit is None else limit))]
    if not chosen:
        return []
    import mlflow

    experiment_id = client.get_run(run_id).info.experiment_id
    plain_tags = {k: str(v)[:250] for k, v in (tags or {}).items()}
    ids = []
    try:
        with global_tracking_uri(client.tracking_uri):
            for record in chosen:
                tid = _episode_trace(client, experiment_id, run_id, record, plain_tags)
                ids.append(tid)
                with contextlib.suppress(Exception):
                    mlflow.log_feedback(
                        trace_id=tid,
                        name="score",
                        value=float(record.score),
                        rationale=f"termination {getattr(record.termination, 'value', '')}",
                    )
    except Exception:
        logger.exception("MLflow: could not log episode traces")
    _TRACE_COUNTS[run_id] = _TRACE_COUNTS.get(run_id, 0) + len(ids)
    return ids


def trace_episodes(cfg: Any, tracker: Any, records: Sequence[Any], *, share: int = 1, **tags: Any) -> list[str]:
    """``log_episode_traces`` with ``tracking.max_traces`` per stage run, ``1/share`` of it for this call
    (e.g. one share per evaluated model); ``tags`` become ``envace.<key>`` trace tags."""
    max_traces = int(_setting(cfg, "max_traces", MAX_TRACES))
    return log_episode_traces(
        tracker,
        records,
        tags={f"envace.{k}": v for k, v in tags.items()},
        limit=max(1, max_traces // max(1, share)),
        max_traces=max_traces,
    )
