"""Evaluation and test-time episodes as MLflow traces linked to the stage's run.

- ``log_episode_traces``: one trace per episode (one span per ACT output, tool call, REHEARSE answer and
  real response; rehearsal attempts nested under their turn), with the score as a span attribute and a
  ``score`` feedback assessment; at most ``tracking.max_traces`` per stage run.
- ``trace_episodes``: the stages' entry point (``tracking.max_traces`` from the config, shared between
  the models a stage evaluates).

Like ``envace.tracking.mlflow_logging`` (whose shared helpers this uses), a no-op for the null tracker.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envace.core.rehearsal import turn_from_json
from envace.tracking.mlflow_logging import clip_text, global_tracking_uri, tracker_client, tracking_setting

logger = logging.getLogger(__name__)

MAX_TRACES = 20
_TRACE_COUNTS: dict[str, int] = {}


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
        client.end_span(trace_id, act.span_id, outputs={"text": clip_text(turn.act_text)})
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
                else {"arguments": clip_text(call.arguments)},
                attributes={"envace.response": "real" if real else "rehearsed"},
            )
            answer = client.start_span(
                "real response" if real else "REHEARSE answer",
                trace_id=trace_id,
                parent_id=tool.span_id,
                span_type="TOOL" if real else "LLM",
                attributes={"envace.role": "environment" if real else "rehearse"},
            )
            client.end_span(trace_id, answer.span_id, outputs={"response": clip_text(response)})
            client.end_span(trace_id, tool.span_id, outputs={"response": clip_text(response)})


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
                    "critique": clip_text(attempt.get("critique_text", "")),
                },
            )
        client.end_span(tid, block.span_id, outputs={"memory": clip_text(outcome.get("memory", ""))})
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
    client = tracker_client(tracker)
    if client is None or not records:
        return []
    run_id = tracker.run_id
    budget = max_traces - _TRACE_COUNTS.get(run_id, 0)
    chosen = list(records)[: max(0, min(budget, len(records) if limit is None else limit))]
    if not chosen:
        return []
    # lazy: mlflow loads in ~1.5 s; a stage with tracking=none or a bad config never pays it
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
    max_traces = int(tracking_setting(cfg, "max_traces", MAX_TRACES))
    return log_episode_traces(
        tracker,
        records,
        tags={f"envace.{k}": v for k, v in tags.items()},
        limit=max(1, max_traces // max(1, share)),
        max_traces=max_traces,
    )
