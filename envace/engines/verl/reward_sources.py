"""Rewards and tool-response sources as the agent loop builds them inside a Ray worker (no verl import).

Everything here is selected by name from ``LoopSettings`` and cached per worker process (verl creates a
new agent-loop object for every sample, so judges, endpoint clients and chat formatters must not be
rebuilt each time).

- Rewards: ``verifiable`` → ``envace.envs.toolworld.reward.verifiable_reward`` (with ``argument_credit``);
  ``rule`` / ``llm`` / ``composite`` → a checklist judge from ``envace.judges`` (``checklist_reward_fn``).
- Executors (``grpo`` with real responses): rebuilt from the dataset row's raw CM2 row by data source;
  only the embedded tool world is executable.
- Simulator (``grpo`` with simulated responses): an OpenAI-compatible endpoint
  (``envace.inference.openai_client``) serving a frozen simulator model.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from envace.core.records import EpisodeSpec, Trajectory, TrajectoryStatus
from envace.core.reward import RewardOutcome
from envace.engines.verl.settings import EndpointSettings, LoopSettings
from envace.envs.data_sources import DATA_SOURCES, data_source
from envace.envs.toolworld.reward import verifiable_reward
from envace.inference.openai_client import OpenAIChatBackend
from envace.judges import checklist_reward_fn, get_judge
from envace.judges.budget import JudgeFailureBudgetExceeded

logger = logging.getLogger(__name__)

_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def cached(key: tuple, build: Callable[[], Any]) -> Any:
    """``build()`` once per process and key."""
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = build()
        return _CACHE[key]


# ---- rewards --------------------------------------------------------------------------------------
def _verifiable(settings: LoopSettings) -> Callable[..., Any]:
    return verifiable_reward(settings.argument_credit)


def _judge(settings: LoopSettings) -> Callable[..., Any]:
    judge = settings.judge
    return checklist_reward_fn(
        get_judge(
            settings.reward,
            base_url=judge.base_url,
            model=judge.model,
            api_key_env=judge.api_key_env,
            max_retries=judge.max_retries,
            timeout_s=judge.timeout_s,
        )
    )


REWARD_BUILDERS: dict[str, Callable[[LoopSettings], Callable[..., Any]]] = {
    "verifiable": _verifiable,
    "rule": _judge,
    "llm": _judge,
    "composite": _judge,
}


def reward_function(settings: LoopSettings) -> Callable[..., Any]:
    """The (cached) ``RewardFn`` named by ``settings.reward``."""
    if settings.reward not in REWARD_BUILDERS:
        raise ValueError(f"unknown reward/judge {settings.reward!r}; valid: {sorted(REWARD_BUILDERS)}")
    key = ("reward", settings.reward, settings.argument_credit, json.dumps(asdict(settings.judge), sort_keys=True))
    return cached(key, lambda: REWARD_BUILDERS[settings.reward](settings))


def score_trajectory(reward_fn: Callable[..., Any], spec: EpisodeSpec, trajectory: Trajectory) -> RewardOutcome:
    """Call the reward function; an exception is a judge failure (excluded, counted), never a 0 reward."""
    try:
        result = reward_fn(spec, trajectory)
    except JudgeFailureBudgetExceeded:
        raise  # too many judge failures: the run stops (envace.engines.verl.run_failure), not excluding everything
    except Exception as exc:  # noqa: BLE001 - any other judge/scorer crash must not kill the rollout worker
        logger.warning(
            "reward for %s sample %d failed: %s: %s", spec.task_id, trajectory.sample_index, type(exc).__name__, exc
        )
        return RewardOutcome(0.0, TrajectoryStatus.JUDGE_FAILED, {"error": f"{type(exc).__name__}: {exc}"[:500]})
    reward, status, info = result
    return RewardOutcome(float(reward), TrajectoryStatus(status), dict(info or {}))


# ---- executors --------------------------------------------------------------------------------------
def make_executor(source: str, row_json: str | None) -> Any:
    """A fresh real executor for one trajectory, from the dataset row's raw row."""
    build = data_source(source).executor_from_row if source in DATA_SOURCES else None
    if build is None:
        executable = sorted(DATA_SOURCES.items(lambda s: s.executor_from_row is not None))
        raise ValueError(
            f"responses='executor' needs an executable environment; data source {source!r} has none "
            f"(executable: {executable}). Use algo.grpo_responses=simulator with a simulator "
            "endpoint instead"
        )
    if not row_json:
        raise ValueError(
            "responses='executor': the dataset row has no envace_row (raw row); rebuild the verl "
            "dataset with envace.engines.verl.episodes"
        )
    return build(json.loads(row_json))


# ---- simulator --------------------------------------------------------------------------------------
def simulator_backend(endpoint: EndpointSettings) -> Any:
    """The (cached) chat backend of the frozen simulator endpoint."""
    if not endpoint.base_url or not endpoint.model:
        raise ValueError(
            "responses='simulator' needs envace.simulator.base_url and envace.simulator.model "
            "(an OpenAI-compatible endpoint serving the frozen simulator)"
        )

    def build() -> Any:
        return OpenAIChatBackend(
            endpoint.base_url,
            endpoint.model,
            api_key_env=endpoint.api_key_env,
            timeout=endpoint.timeout_s,
            max_retries=endpoint.max_retries,
        )

    return cached(("simulator", json.dumps(asdict(endpoint), sort_keys=True)), build)
