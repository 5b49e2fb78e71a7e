"""Training isolation at engine level: rehearsal training never touches the real tool world; grpo does, once
per tool call of its trajectories.

A short local run (tiny random model steered toward gold by the shared guide, tool-world tasks, two steps)
gets a RECORDING executor factory: the real tool-world factory (``executor_factory_for`` over
``ToolWorldEnv.make_executor``) wrapped so that it logs every executor it builds and every call that
reaches one (the real executor still answers). Every variant that rehearses by policy receives that factory
too, so a zero count means the engine did not use it, not that it had none. A reward function around the
real verifiable reward records every trajectory the run produced.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from envace.core.records import ToolCall
from envace.core.unknown_tool import UNKNOWN_TOOL
from envace.data.specs import executor_factory_for
from envace.engines import get_engine
from envace.engines.local import (
    LocalEngineConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
)
from envace.envs.toolworld.reward import toolworld_verifiable_reward
from envace.models import ModelSpec

torch.set_num_threads(1)

BASE = LocalEngineConfig(
    model=ModelSpec(kind="tiny", seed=3),
    steps=2,
    prompts_per_step=2,
    seed=5,
    progress=False,
    rollout=RolloutConfig(samples_per_prompt=2, max_act_tokens=80, max_rehearse_tokens=72, max_stream_tokens=2048),
    optim=OptimConfig(lr=1e-3),
)


class RecordingExecutor:
    """A real executor that logs every call reaching it and the response it gave."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[ToolCall] = []
        self.responses: list[Any] = []

    def execute(self, call: ToolCall) -> Any:
        response = self.inner.execute(call)
        self.calls.append(call)
        self.responses.append(response)
        return response

    def state(self) -> dict[str, Any]:
        return self.inner.state()


class RecordingFactory:
    """The engines' ``factory(spec)`` around the real one; keeps every executor it built, in order."""

    def __init__(self, real) -> None:
        self.real = real
        self.built: list[RecordingExecutor] = []

    def __call__(self, spec) -> RecordingExecutor:
        executor = RecordingExecutor(self.real(spec))
        self.built.append(executor)
        return executor

    @property
    def calls(self) -> int:
        return sum(len(e.calls) for e in self.built)


def _train(world, variant: str, **overrides):
    """(recording factory, trajectories in the order the engine scored them) of one short run."""
    factory = RecordingFactory(executor_factory_for(world["env"].make_executor, world["tasks"]))
    produced = []

    def recording_reward(spec, traj):
        produced.append(traj)
        return toolworld_verifiable_reward(spec, traj)

    engine = get_engine("local", reward_fn=recording_reward, guide=world["guide"], executor_factory=factory)
    engine.train(replace(BASE, variant=variant, **overrides), world["specs"])
    return factory, produced


def _unknown(response) -> bool:
    """The unknown-tool rule's answer: a call naming no tool of the task never reaches the executor
    (``envace.core.unknown_tool``)."""
    return isinstance(response, dict) and (response.get("error") or {}).get("code") == UNKNOWN_TOOL


@pytest.mark.parametrize("variant", ["envace", "per_role", "frozen_act", "frozen_rehearse"])
def test_envace_training_makes_no_real_calls(guided_world, variant) -> None:
    # envace also runs the SFT warm-up (its REHEARSE targets are recorded responses, not live calls)
    extra = {"sft": SFTConfig(epochs=1)} if variant == "envace" else {}
    factory, produced = _train(guided_world, variant, **extra)
    assert len(produced) == BASE.steps * BASE.prompts_per_step * BASE.rollout.samples_per_prompt
    assert factory.built == [] and factory.calls == 0
    # every REHEARSE output answers a call ACT made, one that grpo would have sent to the real tool world
    answered = sum(traj.info["outputs"]["REHEARSE"] for traj in produced)
    assert answered > 0, "REHEARSE never answered a call: the check would be vacuous"
    assert all(turn.rehearsed for traj in produced for turn in traj.turns if turn.tool_calls)


def test_grpo_training_makes_one_real_call_per_tool_call(guided_world) -> None:
    factory, produced = _train(guided_world, "grpo")
    assert len(produced) == BASE.steps * BASE.prompts_per_step * BASE.rollout.samples_per_prompt
    assert len(factory.built) == len(produced)  # one fresh executor per trajectory
    assert factory.calls == sum(traj.info["real_env_calls"] for traj in produced) > 0  # the sample-efficiency count
    for executor, traj in zip(factory.built, produced):  # built and scored in the same (episode) order
        known = [(c, r) for turn in traj.turns for c, r in zip(turn.tool_calls, turn.responses) if not _unknown(r)]
        assert executor.calls == [c for c, _ in known]
        assert executor.responses == [r for _, r in known]
        assert not any(turn.rehearsed for turn in traj.turns if turn.tool_calls)
