"""Per-step rollout metrics of the local engine (the pipeline logs them to MLflow).

Keys: ``reward/mean``, ``reward/std`` (valid trajectories), ``judge_failures`` (this step) and
``judge_failures_total`` (the run so far), ``real_env/calls`` (calls the real environment executed in
this step's rollouts) and ``real_env/calls_total`` (the run so far, the SFT warm-up's recorded gold
responses included: ``running_totals``; the fidelity probe's measurement calls are not counted); per role r in
{act, rehearse}: ``adv/r/{mean,std,abs_mean}``, ``tokens/r`` (generated), ``outputs/r``,
``parse_fail/r`` (failed outputs / outputs of the role); ``termination/<name>`` (share of
trajectories); ``rollout/seconds``, ``rollout/forwards``, ``rollout/fed_tokens``.

The engine adds per trained model (prefixed ``act/`` / ``rehearse/`` under ``per_role``): ``loss``,
``pg_loss``, ``kl``, ``clipfrac``, ``grad_norm`` (pre-clip), ``loss/<role>``, ``tokens_in_loss/<role>``,
``grad_norm/<role>`` (with ``track_role_grad_norms``), ``rollout/logprob_diff``; and per step
``tokens_per_s`` (generated tokens / rollout seconds), ``update/tokens_per_s``, ``time/{rollout,update,step}``;
on fidelity-probe steps (``envace.engines.local.fidelity``) ``fidelity/{exact_match,field_f1,
error_agreement,parse_failure_rate,n_calls}`` and ``time/fidelity`` (not part of ``time/step``); on validation
steps (``envace.engines.local.validation``) ``val/{success,score,n,real_calls,crashed}`` and ``time/val`` (the
probe's calls are measurement, not training, and stay out of ``real_env/calls_total``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from envace.core.records import Role, Termination, Trajectory, TrajectoryStatus

_PARSE_TERMINATION = {Role.ACT: Termination.ACT_PARSE_ERROR, Role.REHEARSE: Termination.REHEARSE_PARSE_ERROR}


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    t = torch.tensor(values, dtype=torch.float64)
    return {
        f"{prefix}/mean": float(t.mean()),
        f"{prefix}/std": float(t.std(unbiased=False)),
        f"{prefix}/abs_mean": float(t.abs().mean()),
    }


def rollout_metrics(batch: Any, trajectories: Sequence[Trajectory], advantages: Any) -> dict[str, float]:
    """Metrics of one scored rollout batch with its per-output advantages (``OutputAdvantages``)."""
    valid = [t.reward for t in trajectories if t.status is TrajectoryStatus.OK]
    out: dict[str, float] = {
        "reward/mean": float(torch.tensor(valid).mean()) if valid else 0.0,
        "reward/std": float(torch.tensor(valid, dtype=torch.float64).std(unbiased=False)) if valid else 0.0,
        "judge_failures": float(sum(t.status is TrajectoryStatus.JUDGE_FAILED for t in trajectories)),
        # calls the real environment executed in this step's rollouts (grpo on the real environment)
        "real_env/calls": float(sum(t.info.get("real_env_calls", 0) for t in trajectories)),
        "trajectories": float(len(trajectories)),
        "rollout/seconds": float(batch.seconds),
        "rollout/forwards": float(batch.forwards),
        "rollout/fed_tokens": float(batch.fed_tokens),
    }
    for role in Role:
        tag = role.name.lower()
        n_out = sum(t.info.get("outputs", {}).get(role.name, 0) for t in trajectories)
        failed = sum(t.termination is _PARSE_TERMINATION[role] for t in trajectories)
        out[f"outputs/{tag}"] = float(n_out)
        out[f"parse_fail/{tag}"] = failed / n_out if n_out else 0.0
        out[f"tokens/{tag}"] = float(batch.generated_tokens.get(role, 0))
        values = [float(a) for a, r in zip(advantages.values.tolist(), advantages.roles) if r is role]
        out.update(_stats(values, f"adv/{tag}"))
    for term in Termination:
        out[f"termination/{term.value}"] = sum(t.termination is term for t in trajectories) / max(len(trajectories), 1)
    return out


def sft_real_calls(specs: Sequence[Any]) -> int:
    """Real tool responses the SFT warm-up trains on: the gold calls whose responses were recorded (the tool
    world executes them on a fresh executor, CM2 rows carry them)."""
    return sum(len(step.calls) for spec in specs for turn in spec.gold for step in turn if step.responses is not None)


def running_totals(metrics: dict[str, float], previous: dict[str, float] | None, sft_calls: int) -> dict[str, float]:
    """Totals over the run so far, carried from the previous history row (a resumed run restores it):
    ``real_env/calls_total`` (the SFT warm-up's real responses included: the sample-efficiency axis) and
    ``judge_failures_total`` (every trajectory excluded from the loss so far); ``real_env/sft_calls`` is the
    warm-up's share (where the SFT start sits on the sample-efficiency axis)."""
    prev = previous or {}
    return {
        "real_env/sft_calls": float(sft_calls),
        "real_env/calls_total": prev.get("real_env/calls_total", float(sft_calls)) + metrics.get("real_env/calls", 0.0),
        "judge_failures_total": prev.get("judge_failures_total", 0.0) + metrics.get("judge_failures", 0.0),
    }
