"""``RolloutBudget``: one declaration of the rollout's temperatures and limits, one check per rule, shared by the
local engine's ``RolloutConfig``, verl's ``LoopSettings`` and the config schema's ``rollout`` section."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import MISSING, OmegaConf

from envace.config.load import CONF_DIR, ConfigError, compose
from envace.config.schema import RolloutSection
from envace.core.records import Role
from envace.core.rollout_budget import BUDGET_FIELDS, RolloutBudget, budget_values
from envace.engines.local.config import RolloutConfig
from envace.engines.verl.settings import LoopSettings


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"act_temperature": -0.1}, "rollout.act_temperature=-0.1"),
        ({"rehearse_temperature": float("nan")}, "rollout.rehearse_temperature=nan"),
        ({"max_steps_per_turn": 0}, "rollout.max_steps_per_turn=0: must be >= 1"),
        ({"max_act_tokens": 0}, "rollout.max_act_tokens=0: must be >= 1"),
        ({"max_rehearse_tokens": -2}, "rollout.max_rehearse_tokens=-2: must be >= 1"),
        ({"max_stream_tokens": 0}, "rollout.max_stream_tokens=0: must be >= 1"),
        ({"rehearse_context_tokens": -1}, "rollout.rehearse_context_tokens=-1: must be >= 0"),
    ],
)
def test_out_of_range_values_fail_with_one_message_everywhere(values: dict, message: str) -> None:
    for cls in (RolloutBudget, RolloutConfig, LoopSettings):
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            cls(**values)
    key, value = next(iter(values.items()))
    if value == value:  # a NaN cannot be written as a Hydra override
        with pytest.raises(ConfigError, match=message):
            compose([f"rollout.{key}={value}"])


def test_greedy_and_no_context_are_allowed() -> None:
    budget = RolloutBudget(act_temperature=0.0, rehearse_temperature=0.0, rehearse_context_tokens=0)
    assert budget.temperature(Role.ACT) == budget.temperature(Role.REHEARSE) == 0.0


def test_role_helpers() -> None:
    budget = RolloutBudget(act_temperature=0.7, rehearse_temperature=0.2, max_act_tokens=9, max_rehearse_tokens=5)
    assert (budget.temperature(Role.ACT), budget.temperature(Role.REHEARSE)) == (0.7, 0.2)
    assert (budget.max_new_tokens(Role.ACT), budget.max_new_tokens(Role.REHEARSE)) == (9, 5)


def test_fields_are_declared_once_with_conf_defaults() -> None:
    """The engines' configs hold the budget's fields with its defaults, which are conf/rollout/default.yaml's
    values; the schema section holds the same fields with no value (MISSING: conf/ is their one home)."""
    defaults = {f.name: f.default for f in dataclasses.fields(RolloutBudget)}
    assert tuple(defaults) == BUDGET_FIELDS
    for cls in (RolloutConfig, LoopSettings):
        declared = {f.name: f.default for f in dataclasses.fields(cls)}
        assert {name: declared[name] for name in BUDGET_FIELDS} == defaults, cls.__name__
    section = {f.name: f.default for f in dataclasses.fields(RolloutSection)}
    assert {name: section[name] for name in BUDGET_FIELDS} == dict.fromkeys(BUDGET_FIELDS, MISSING)
    assert issubclass(RolloutConfig, RolloutBudget) and issubclass(LoopSettings, RolloutBudget)
    assert budget_values(OmegaConf.load(CONF_DIR / "rollout" / "default.yaml")) == defaults


def test_budget_values_reads_mappings_and_objects() -> None:
    cfg = compose(["profile=smoke"])
    from_node = budget_values(cfg.rollout)
    assert list(from_node) == list(BUDGET_FIELDS)
    assert budget_values(RolloutBudget(**from_node)) == from_node
    assert budget_values(dict(cfg.rollout)) == from_node
