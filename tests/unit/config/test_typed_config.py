"""``typed_config``: the composed config as the schema's ``Config`` dataclasses, converted once by the stage
runner. What the plumbing derives from it (plain values for MLflow and preflight, the train stage's work
directory hash) is what it derived from the composed ``DictConfig``."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from envace.config.enums import EngineName
from envace.config.load import compose, flatten, to_plain, typed_config
from envace.config.schema import Config
from envace.inference.preflight import stage_endpoints
from envace.stages.train_setup import config_hash

COMPOSITIONS = [
    [],
    ["profile=paper"],
    ["profile=smoke", "judge=composite", "algo=grpo", "data.seed=5"],
    ["engine=verl", "algo=grpo", "algo.grpo_responses=simulator", "engine.simulator.base_url=http://sim:1/v1"],
    [
        "eval.benchmark=vitabench",
        "eval.benchmarks=[vitabench]",
        "rehearsal.benchmarks=[vitabench]",
        "eval.suites.vitabench.user_base_url=http://user:2/v1",
    ],
]


@pytest.mark.parametrize("overrides", COMPOSITIONS, ids=lambda o: " ".join(o) or "default")
def test_typed_config_reads_as_the_composed_one(overrides: list[str]) -> None:
    composed = compose(overrides)
    typed = typed_config(composed)
    assert isinstance(typed, Config) and typed_config(typed) is typed
    assert to_plain(typed) == to_plain(composed) and flatten(typed) == flatten(composed)
    assert config_hash(typed) == config_hash(composed)
    for stage in ("train", "evaluate", "rehearsal_sweep"):
        assert stage_endpoints(typed, stage) == stage_endpoints(composed, stage)
    plain = OmegaConf.to_container(composed, resolve=True)
    assert typed_config(plain) == typed


def test_enumerated_values_are_enum_members() -> None:
    typed = typed_config(compose(["engine=verl"]))
    assert typed.engine.name is EngineName.verl and to_plain(typed.engine)["name"] == "verl"


def test_a_new_key_at_its_default_keeps_older_runs_checkpoint_hash(monkeypatch):
    """judge.argument_credit came after runs existed: at 0 it is left out of the hash (a run begun before it
    resumes), set it changes the hash (another run)."""
    from envace.stages import train_setup

    default = typed_config(compose([]))
    keyed = config_hash(default)
    assert config_hash(typed_config(compose(["judge.argument_credit=0.5"]))) != keyed
    monkeypatch.setattr(train_setup, "HASH_NEUTRAL_DEFAULTS", {})
    assert config_hash(default) != keyed  # so the default was indeed left out
