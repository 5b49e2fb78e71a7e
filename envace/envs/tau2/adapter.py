"""τ²-Bench as an envace benchmark: ``get_benchmark("tau2", config=Tau2Config(...))`` → ``Tau2Adapter``.

* ``tasks(subset, limit, seed)`` — ``subset``: ``telecom``, ``airline:test``, ``all`` … (see
  ``config.parse_subset``); ``limit`` applies per domain (deterministic crc32 sample). Domains that
  cannot run in the configured mode are skipped and listed in ``skipped`` with the reason.
* ``episode_program`` — one tau2 simulation (``episode.simulate``) scored by tau2's evaluator; the
  record keeps the whole ``SimulationRun`` (``info["tau2_simulation"]``) so ``score`` re-evaluates it.
* ``real_executor`` — a fresh ``Tau2Executor`` on the task's initial state. ``executor_wrapper`` wraps
  the executor of every episode; all of the episode's real tool calls (agent and customer) go through it.
* trials — ``task.meta["trial"]`` enters the generation seeds (extension; see ``runner`` for pass^k).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any

import envace.envs.tau2.episode as ep
from envace.core.env import Executor, Task
from envace.core.seeds import derive_seed
from envace.envs.tau2.config import Tau2Config, Tau2Mode, Tau2NotRunnable, parse_subset
from envace.envs.tau2.executor import EnvironmentProxy, Tau2Executor
from envace.envs.tau2.oracle import Tau2Oracle
from envace.envs.tau2.upstream import tau2
from envace.evaluation.base import BenchmarkAdapter, sample_tasks
from envace.evaluation.episode import TurnHook, trial_of
from envace.evaluation.programs import GenerationLedger, Program
from envace.evaluation.records import EpisodeRecord

logger = logging.getLogger(__name__)

ExecutorWrapper = Callable[[Executor], Executor]


def _tau2_bridge() -> tuple[ModuleType, ModuleType]:
    """``envace.envs.tau2.agent`` and ``envace.envs.tau2.data``, imported on first use."""
    # lazy: both subclass tau2's classes at import time, which loads tau2 and litellm (seconds)
    import envace.envs.tau2.agent as agent
    import envace.envs.tau2.data as data

    return agent, data


def tau2_task_of(task: Task) -> Any:
    """The tau2 task behind an envace task."""
    inner = task.meta.get("tau2_task")
    if inner is None:
        raise KeyError(
            f"task {task.task_id!r} is not a τ² task (no meta['tau2_task']); build it with Tau2Adapter.tasks"
        )
    return inner


def pass_hat_ks(records: Sequence[EpisodeRecord], trials: int) -> dict[str, float]:
    """``{"pass^k": value}`` for k = 1..trials over the tasks of ``records``."""
    successes: dict[str, list[bool]] = {}
    for r in records:
        successes.setdefault(r.task_id, []).append(bool(r.success))
    out = {}
    for k in range(1, trials + 1):
        values = [tau2().metrics.pass_hat_k(len(s), sum(s), k) for s in successes.values() if len(s) >= k]
        out[f"pass^{k}"] = sum(values) / len(values) if values else 0.0
    return out


def domain_table(
    subset: str, adapter: Tau2Adapter, records: Sequence[EpisodeRecord], trials: int
) -> dict[str, dict[str, Any]]:
    """Status and metrics per ``domain:split`` of the subset."""
    table: dict[str, dict[str, Any]] = {}
    for domain, split in parse_subset(subset):
        key = f"{domain}:{split}"
        if key in adapter.skipped:
            table[key] = {"status": "not_runnable", "reason": adapter.skipped[key]}
            continue
        mine = [r for r in records if r.domain == domain and r.split == split]
        rewards = [r.score for r in mine]
        table[key] = {
            "status": "ran",
            "mode": adapter.config.mode.value,
            "n_tasks": len({r.task_id for r in mine}),
            "trials": trials,
            "crashed": sum(r.crashed for r in mine),
            "avg_reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "success_rate": sum(r.success for r in mine) / len(mine) if mine else 0.0,
            **pass_hat_ks(mine, trials),
        }
    return table


class Tau2Adapter(BenchmarkAdapter):
    """See the module docstring. Keyword arguments other than ``config``/``executor_wrapper`` build a
    ``Tau2Config`` (``mode``, ``user_base_url``, ``user_model`` …)."""

    name = "tau2"

    def __init__(
        self, config: Tau2Config | None = None, *, executor_wrapper: ExecutorWrapper | None = None, **config_kwargs: Any
    ) -> None:
        if config is not None and config_kwargs:
            raise ValueError(f"Tau2Adapter: config given, so {sorted(config_kwargs)} cannot configure it")
        self.config = config or Tau2Config(**config_kwargs)
        self.executor_wrapper = executor_wrapper
        self.skipped: dict[str, str] = {}

    def tasks(self, subset: str = "test", limit: int | None = None, seed: int = 0) -> list[Task]:
        _, data = _tau2_bridge()
        out: list[Task] = []
        for domain, split in parse_subset(subset):
            reason = self.config.unavailable(domain)
            if reason:
                self.skipped[f"{domain}:{split}"] = reason
                logger.warning("τ² %s:%s skipped: %s", domain, split, reason)
                continue
            inner = [
                t
                for t in data.load_tau2_tasks(domain, split)
                if self.config.mode is not Tau2Mode.SOLO or data.solo_valid(t)
            ]
            chosen = sample_tasks(inner, limit, seed, task_id=lambda t, d=domain: f"{d}:{t.id}")
            out.extend(data.to_task(t, domain, split, self.config.mode) for t in chosen)
        return out

    def real_executor(self, task: Task) -> Executor:
        _, data = _tau2_bridge()
        inner = tau2_task_of(task)
        environment = data.make_environment(task.domain, Tau2Mode(task.meta["tau2_mode"]) is Tau2Mode.SOLO)
        state = inner.initial_state
        environment.set_state(
            initialization_data=state.initialization_data if state else None,
            initialization_actions=state.initialization_actions if state else None,
            message_history=list(state.message_history or []) if state else [],
        )
        raw = Tau2Executor(environment)
        return self.executor_wrapper(raw) if self.executor_wrapper else raw

    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        agent_module, data = _tau2_bridge()
        start = time.perf_counter()
        ledger = ledger if ledger is not None else GenerationLedger()
        mode = Tau2Mode(task.meta["tau2_mode"])
        config = replace(self.config, mode=mode)
        reason = config.unavailable(task.domain)
        if reason:
            raise Tau2NotRunnable(reason)
        inner, solo, trial = tau2_task_of(task), mode is Tau2Mode.SOLO, trial_of(task)
        environment = data.make_environment(task.domain, solo)
        raw = Tau2Executor(environment)
        executor = self.executor_wrapper(raw) if self.executor_wrapper else raw
        ledger.count_real_execution()
        agent = data.make_agent(task.domain, mode, inner)
        user = agent_module.make_user(config, inner, data.user_tools(environment))
        orch = tau2().orchestrator.Orchestrator(
            domain=task.domain,
            agent=agent,
            user=user,
            environment=EnvironmentProxy(environment, executor),
            task=inner,
            max_steps=self.config.max_steps,
            max_errors=self.config.max_errors,
            seed=derive_seed(self.config.seed, task.task_id, trial, "customer"),
            solo_mode=solo,
        )
        stats = yield from ep.simulate(orch, agent, self.config, ledger, (task.task_id, trial), turn_hook)
        simulation = ep.finish(orch, stats, time.perf_counter() - start)
        simulation.trial = trial
        reward = ep.evaluate(simulation, inner, task.domain, solo)
        simulation.reward_info = reward
        return self._record(task, simulation, stats, raw, ledger, start)

    def _record(
        self, task: Task, simulation: Any, stats: Any, raw: Any, ledger: GenerationLedger, start: float
    ) -> EpisodeRecord:
        turns, answers = ep.trajectory_turns(simulation.messages)
        reward = float(simulation.reward_info.reward)
        agent_calls = sum(len(t.tool_calls) for t in turns)
        info = {
            "tau2_domain": task.domain,
            "tau2_task_id": simulation.task_id,
            "mode": task.meta["tau2_mode"],
            "trial": trial_of(task),
            "termination_reason": str(simulation.termination_reason.value),
            "customer_calls": raw.calls_made - agent_calls,
            "tau2_simulation": simulation.model_dump(mode="json"),
        }
        return EpisodeRecord(
            benchmark=self.name,
            task_id=task.task_id,
            domain=task.domain,
            split=task.split,
            held_out=bool(task.meta.get("held_out", False)),
            score=reward,
            success=bool(tau2().metrics.is_successful(reward)),
            final_answers=tuple(answers),
            turns=tuple(turns),
            termination=ep.termination_of(info["termination_reason"], stats),
            act_generations=stats.generations,
            parse_failures=stats.parse_failures,
            parse_error_codes=tuple(stats.codes),
            real_calls=agent_calls,
            final_state=raw.state(),
            costs=ledger.to_json(),
            wall_s=time.perf_counter() - start,
            info=info,
        )

    def score(self, task: Task, record: EpisodeRecord) -> float:
        data = record.info.get("tau2_simulation")
        if record.crashed or data is None:
            return 0.0
        simulation = tau2().simulation.SimulationRun.model_validate(data)
        solo = Tau2Mode(record.info.get("mode", "solo")) is Tau2Mode.SOLO
        return float(ep.evaluate(simulation, tau2_task_of(task), task.domain, solo).reward)

    def oracle(self, tasks: Sequence[Task]) -> Any:
        return Tau2Oracle(tasks)

    def summarize(self, subset: str, records: Sequence[EpisodeRecord]) -> dict[str, Any]:
        per_task: dict[str, int] = {}
        for r in records:
            per_task[r.task_id] = per_task.get(r.task_id, 0) + 1
        trials = max(per_task.values(), default=1)
        return {"trials": trials, "domains": domain_table(subset, self, records, trials)}
