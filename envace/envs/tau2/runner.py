"""Evaluate a policy on τ²-Bench domains over several trials and report pass^k (tau2's formula).

``run_tau2`` = ``envace.evaluation.run_programs`` (batched, crash-isolated, bounded concurrency, progress
bar; with the customer seat in ``user_seat`` mode) over every (task, trial) — trial ``t`` is the task with
``meta["trial"] = t`` (different generation seeds) — then per domain: average reward, success rate and
pass^k for k = 1..trials (``tau2.metrics.agent_metrics.pass_hat_k``: mean over tasks of
C(successes, k) / C(trials, k); success = reward 1, as in tau2). Crashed episodes count as failures.
Domains that cannot run in the configured mode are reported with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from envace.envs.tau2.adapter import Tau2Adapter, domain_table
from envace.envs.tau2.config import Tau2Mode
from envace.envs.tau2.episode import CUSTOMER
from envace.evaluation.base import with_trials
from envace.evaluation.metrics import compute_metrics
from envace.evaluation.programs import ACTOR
from envace.evaluation.runner import BenchmarkRun, backend_name, run_programs
from envace.inference.base import ChatBackend


@dataclass(frozen=True)
class Tau2Report:
    run: BenchmarkRun
    domains: dict[str, dict[str, Any]]  # "domain:split" → status, reason, n_tasks, trials, avg_reward, pass^k
    trials: int

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.run.policy,
            "trials": self.trials,
            "domains": self.domains,
            "metrics": self.run.metrics.to_json(),
        }


def run_tau2(
    policy: ChatBackend,
    subset: str = "telecom",
    *,
    trials: int = 1,
    limit: int | None = None,
    seed: int = 0,
    adapter: Tau2Adapter | None = None,
    concurrency: int = 1,
    max_batch: int | None = None,
    progress: bool = True,
    adapter_kwargs: Mapping[str, Any] | None = None,
    customer: ChatBackend | None = None,
) -> Tau2Report:
    """Evaluate ``policy`` on the τ² ``subset`` (``limit`` tasks per domain) for ``trials`` trials.

    ``customer``: the customer's backend in ``user_seat`` mode (required there, unused otherwise)."""
    adapter = adapter or Tau2Adapter(**dict(adapter_kwargs or {}))
    if adapter.config.mode is Tau2Mode.USER_SEAT and customer is None:
        raise ValueError("τ² mode 'user_seat' needs the customer's backend: run_tau2(..., customer=<ChatBackend>)")
    tasks = with_trials(adapter.tasks(subset, limit=limit, seed=seed), trials)
    seats = {ACTOR: policy, **({CUSTOMER: customer} if customer is not None else {})}
    name = backend_name(policy)
    records = run_programs(
        adapter,
        tasks,
        lambda t: adapter.episode_program(t),
        seats,
        concurrency=concurrency,
        max_batch=max_batch,
        progress=progress,
        desc=f"tau2:{name}",
        policy=name,
    )
    records = [r if r.policy == name else replace(r, policy=name) for r in records]
    run = BenchmarkRun(adapter.name, name, tuple(records), compute_metrics(records))
    return Tau2Report(run, domain_table(subset, adapter, run.records, trials), trials)
