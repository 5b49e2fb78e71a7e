"""Benchmark metrics from per-task records.

* ``success_rate`` — fraction of tasks whose score reached the adapter's success threshold; crashed
  tasks count as failures (they stay in the denominator).
* ``mean_score`` — mean score (crashes score 0).
* per domain, ``transfer`` (tasks of the held-out domain(s), ``task.meta['held_out'] == "domain"``),
  ``in_domain`` (the rest) and ``held_out`` per kind (``domain``, ``composition`` — tasks whose tool
  composition was held out), each with n / success rate / mean score.
* ``parse_failure_rate`` — malformed ACT generations / all ACT generations (a per-generation rate;
  ``episode_parse_failure_rate`` is the fraction of episodes with at least one).
* ``error_rate`` — fraction of tasks that crashed; mean real-environment calls and generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envace.evaluation.records import EpisodeRecord


@dataclass(frozen=True)
class GroupMetrics:
    n: int
    success_rate: float
    mean_score: float

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "success_rate": self.success_rate, "mean_score": self.mean_score}


@dataclass(frozen=True)
class BenchmarkMetrics:
    n_tasks: int
    success_rate: float
    mean_score: float
    parse_failure_rate: float
    episode_parse_failure_rate: float
    error_rate: float
    mean_real_calls: float
    mean_completion_tokens: float
    per_domain: dict[str, GroupMetrics] = field(default_factory=dict)
    transfer: GroupMetrics | None = None
    in_domain: GroupMetrics | None = None
    held_out: dict[str, GroupMetrics] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "n_tasks": self.n_tasks,
            "success_rate": self.success_rate,
            "mean_score": self.mean_score,
            "parse_failure_rate": self.parse_failure_rate,
            "episode_parse_failure_rate": self.episode_parse_failure_rate,
            "error_rate": self.error_rate,
            "mean_real_calls": self.mean_real_calls,
            "mean_completion_tokens": self.mean_completion_tokens,
            "per_domain": {k: v.to_json() for k, v in sorted(self.per_domain.items())},
            "transfer": None if self.transfer is None else self.transfer.to_json(),
            "in_domain": None if self.in_domain is None else self.in_domain.to_json(),
            "held_out": {k: v.to_json() for k, v in sorted(self.held_out.items())},
        }

    def flat(self, prefix: str = "") -> dict[str, float]:
        """Flat metric names for trackers (``domain/<d>/success_rate``, ``transfer/success_rate`` …)."""
        out = {
            f"{prefix}{k}": float(v)
            for k, v in self.to_json().items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        groups = {f"domain/{d}": g for d, g in self.per_domain.items()}
        groups.update({f"held_out/{k}": g for k, g in self.held_out.items()})
        groups.update({"transfer": self.transfer, "in_domain": self.in_domain})
        for label, group in groups.items():
            if group is not None:
                for k, v in group.to_json().items():
                    out[f"{prefix}{label}/{k}"] = float(v)
        return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _group(records: Sequence[EpisodeRecord]) -> GroupMetrics | None:
    if not records:
        return None
    return GroupMetrics(
        n=len(records),
        success_rate=_mean([1.0 if r.success else 0.0 for r in records]),
        mean_score=_mean([r.score for r in records]),
    )


def compute_metrics(records: Sequence[EpisodeRecord]) -> BenchmarkMetrics:
    """Aggregate metrics over ``records`` (empty input gives zeros)."""
    generations = sum(r.act_generations for r in records)
    domains: dict[str, list[EpisodeRecord]] = {}
    for r in records:
        domains.setdefault(r.domain, []).append(r)
    per_domain = {d: g for d, rs in domains.items() if (g := _group(rs)) is not None}
    kinds: dict[str, list[EpisodeRecord]] = {}
    for r in records:
        if r.held_out_kind:
            kinds.setdefault(r.held_out_kind, []).append(r)
    return BenchmarkMetrics(
        n_tasks=len(records),
        success_rate=_mean([1.0 if r.success else 0.0 for r in records]),
        mean_score=_mean([r.score for r in records]),
        parse_failure_rate=(sum(r.parse_failures for r in records) / generations) if generations else 0.0,
        episode_parse_failure_rate=_mean([1.0 if r.parse_failures else 0.0 for r in records]),
        error_rate=_mean([1.0 if r.crashed else 0.0 for r in records]),
        mean_real_calls=_mean([float(r.real_calls) for r in records]),
        mean_completion_tokens=_mean([float(r.completion_tokens()) for r in records]),
        per_domain=per_domain,
        transfer=_group([r for r in records if r.held_out]),
        in_domain=_group([r for r in records if not r.held_out]),
        held_out={k: g for k, rs in kinds.items() if (g := _group(rs)) is not None},
    )
