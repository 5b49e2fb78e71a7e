"""Engine interface: registry, variants, EpisodeSpec conversion, built-in verifiable reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.core.records import EpisodeSpec, GoldStep, Role, ToolCall, Trajectory, TrajectoryStatus, Turn
from envace.data.specs import episode_spec_from_task, executor_factory_for, to_episode_spec
from envace.engines import VARIANTS, available_engines, get_engine, get_variant
from envace.envs.toolworld import ToolWorldEnv
from envace.envs.toolworld.reward import toolworld_verifiable_reward

CALL_A = ToolCall("get_weather", {"city": "Paris"})
CALL_B = ToolCall("get_weather", {"city": "Rome"})


def _spec(**kw) -> EpisodeSpec:
    base = {
        "task_id": "t",
        "system_prompt": "sys",
        "user_turns": ("Paris?", "Rome?"),
        "tools": ({"type": "function", "function": {"name": "get_weather"}},),
        "gold": ((GoldStep((CALL_A,), ({"temp": 21},)),), (GoldStep((CALL_B,), ({"temp": 25},)),)),
        "gold_answers": ("21 degrees", "25 degrees"),
        "answer_values": (("21",), ("25",)),
    }
    base.update(kw)
    return EpisodeSpec(**base)


def _traj(turns) -> Trajectory:
    return Trajectory(prompt_id="t", sample_index=0, turns=tuple(turns))


def test_unknown_engine_lists_valid_names():
    with pytest.raises(KeyError) as err:
        get_engine("nope")
    assert "local" in str(err.value)
    assert "local" in available_engines()


def test_get_local_engine_instantiates():
    engine = get_engine("local")
    assert engine.name == "local"


def test_variants_and_unknown_variant():
    assert set(VARIANTS) == {"envace", "grpo", "per_role", "frozen_act", "frozen_rehearse"}
    assert get_variant("frozen_act").trainable_roles == {Role.REHEARSE}
    assert get_variant("frozen_rehearse").trainable_roles == {Role.ACT}
    assert get_variant("grpo").trainable_roles == {Role.ACT} and not get_variant("grpo").rolewise_baseline
    assert get_variant("per_role").separate_models
    with pytest.raises(KeyError, match="envace"):
        get_variant("ppo")


def test_spec_validation():
    spec = _spec()
    assert [[step.responses for step in steps] for steps in spec.gold] == [[({"temp": 21},)], [({"temp": 25},)]]
    with pytest.raises(ValueError, match="one entry per user turn"):
        _spec(gold=((),))
    with pytest.raises(ValueError, match="no user turns"):
        _spec(user_turns=(), gold=())


def test_reward_perfect_partial_and_missing_turns():
    spec = _spec()
    perfect = _traj(
        [
            Turn("", (CALL_A,), ({},), True, 0),
            Turn("It is 21 degrees", user_turn=0),
            Turn("", (CALL_B,), ({},), True, 1),
            Turn("25 now", user_turn=1),
        ]
    )
    out = toolworld_verifiable_reward(spec, perfect)
    assert out.reward == pytest.approx(1.0) and out.status is TrajectoryStatus.OK
    extra = _traj([Turn("", (CALL_A, CALL_B), ({}, {}), True, 0), Turn("21", user_turn=0)])
    # turn 0: calls 1/2 (an extra call costs), answer 1 -> 0.75; turn 1 never reached -> 0
    assert toolworld_verifiable_reward(spec, extra).reward == pytest.approx(0.375)
    assert toolworld_verifiable_reward(spec, _traj([])).reward == 0.0


def test_toolworld_task_conversion_records_real_responses():
    env = ToolWorldEnv()
    task = env.tasks("train")[0]
    spec = episode_spec_from_task(task, env.make_executor(task))
    assert spec.task_id == task.task_id and spec.user_turns == task.user_turns
    assert all(step.responses is not None for steps in spec.gold for step in steps)
    assert spec.answer_values == tuple(tuple(v) for v in task.meta["answer_values"])
    assert to_episode_spec(task).gold[0][0].responses is None  # no executor: responses unknown
    assert to_episode_spec(spec) is spec
    factory = executor_factory_for(env.make_executor, [task])
    assert factory(spec).execute(task.gold_calls[0][0][0]) == spec.gold[0][0].responses[0]
    with pytest.raises(TypeError, match="EpisodeSpec"):
        to_episode_spec(42)


CM2_SAMPLE = Path(__file__).resolve().parents[4] / "shared" / "data" / "cm2" / "checklist_annotated_sample.json"


@pytest.mark.skipif(not CM2_SAMPLE.is_file(), reason="public CM2 sample not present beside the repository")
def test_cm2_row_hook_gives_an_engine_spec():
    row = json.loads(CM2_SAMPLE.read_text())[0]
    spec = to_episode_spec(row)
    assert isinstance(spec, EpisodeSpec) and spec.source == "cm2"
    assert len(spec.user_turns) == len(spec.checklists) >= 1
