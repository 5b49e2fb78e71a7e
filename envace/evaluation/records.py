"""Per-task evaluation records: one ``EpisodeRecord`` per task, JSON-able (the evaluate stage writes JSONL).

A record carries everything later analysis needs without the environment: the ACT turns with the real
responses (``Turn`` from ``envace.core.records``; the fidelity measurement reads them), the final answers
and state, the score, parse statistics, generation costs per purpose, wall time, real-environment calls,
and ``info`` (the rehearsal attempts and memory when the episode was rehearsed). A task that crashed is a
record too: ``error`` holds the exception, ``termination`` is ``ERROR`` and the score is 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envace.core.env import Task
from envace.core.records import Termination, Turn
from envace.core.rehearsal import turn_from_json, turn_to_json

RECORD_SCHEMA_VERSION = 1


def held_out_kind(task: Task) -> str | None:
    """What a task holds out from training (``task.meta['held_out']``): "domain", "composition" or None.

    A bare ``True`` counts as "domain".
    """
    kind = task.meta.get("held_out")
    if kind is True:
        return "domain"
    return str(kind) if kind else None


def is_held_out(task: Task) -> bool:
    """Whether a task belongs to a domain held out from training (the ``transfer`` metric)."""
    return held_out_kind(task) == "domain"


@dataclass(frozen=True)
class EpisodeRecord:
    benchmark: str
    task_id: str
    domain: str
    split: str
    held_out: bool
    score: float
    success: bool
    final_answers: tuple[str, ...] = ()
    turns: tuple[Turn, ...] = ()
    termination: Termination = Termination.FINAL_REPLY
    act_generations: int = 0
    parse_failures: int = 0
    parse_error_codes: tuple[str, ...] = ()
    real_calls: int = 0
    final_state: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    costs: dict[str, dict[str, Any]] = field(default_factory=dict)  # purpose -> calls/tokens/seconds
    wall_s: float = 0.0
    policy: str = ""
    held_out_kind: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def crashed(self) -> bool:
        return self.error is not None

    def completion_tokens(self, purposes: tuple[str, ...] | None = None) -> int:
        return sum(
            int(c.get("completion_tokens", 0)) for p, c in self.costs.items() if purposes is None or p in purposes
        )

    @classmethod
    def unscored(cls, benchmark: str, task: Task, **fields: Any) -> EpisodeRecord:
        """A record of ``task`` (its id, domain, split, held-out kind) with score 0, not a success, and
        ``fields`` set; adapters score it afterwards."""
        return cls(
            benchmark=benchmark,
            task_id=task.task_id,
            domain=task.domain,
            split=task.split,
            held_out=is_held_out(task),
            held_out_kind=held_out_kind(task),
            score=0.0,
            success=False,
            **fields,
        )

    @classmethod
    def failed(
        cls, benchmark: str, task: Task, error: str, *, policy: str = "", info: Mapping[str, Any] | None = None
    ) -> EpisodeRecord:
        return cls.unscored(
            benchmark,
            task,
            termination=Termination.ERROR,
            error=error,
            policy=policy,
            info=dict(info or {}),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": RECORD_SCHEMA_VERSION,
            "benchmark": self.benchmark,
            "task_id": self.task_id,
            "domain": self.domain,
            "split": self.split,
            "held_out": self.held_out,
            "score": self.score,
            "success": self.success,
            "final_answers": list(self.final_answers),
            "turns": [turn_to_json(t) for t in self.turns],
            "termination": self.termination.value,
            "act_generations": self.act_generations,
            "parse_failures": self.parse_failures,
            "parse_error_codes": list(self.parse_error_codes),
            "real_calls": self.real_calls,
            "final_state": self.final_state,
            "error": self.error,
            "costs": self.costs,
            "wall_s": self.wall_s,
            "policy": self.policy,
            "held_out_kind": self.held_out_kind,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EpisodeRecord:
        version = d.get("schema_version")
        if version != RECORD_SCHEMA_VERSION:
            raise ValueError(
                f"EpisodeRecord has schema_version={version!r}; this envace reads {RECORD_SCHEMA_VERSION}. "
                "Re-run the evaluate stage to regenerate the predictions file."
            )
        return cls(
            benchmark=d["benchmark"],
            task_id=d["task_id"],
            domain=d["domain"],
            split=d["split"],
            held_out=bool(d["held_out"]),
            score=float(d["score"]),
            success=bool(d["success"]),
            final_answers=tuple(d.get("final_answers", ())),
            turns=tuple(turn_from_json(t) for t in d.get("turns", ())),
            termination=Termination(d.get("termination", "final_reply")),
            act_generations=int(d.get("act_generations", 0)),
            parse_failures=int(d.get("parse_failures", 0)),
            parse_error_codes=tuple(d.get("parse_error_codes", ())),
            real_calls=int(d.get("real_calls", 0)),
            final_state=dict(d.get("final_state", {})),
            error=d.get("error"),
            costs=dict(d.get("costs", {})),
            wall_s=float(d.get("wall_s", 0.0)),
            policy=d.get("policy", ""),
            held_out_kind=d.get("held_out_kind"),
            info=dict(d.get("info", {})),
        )
