"""The verl config builder on the typed ``Config`` gives the overrides the dict-based builder gave.

``tests/fixtures/verl/overrides_before_typed_config.json`` holds, for six composed configs, the ``main_ppo``
overrides that ``build_overrides`` produced before it took the typed config (generated with that code and
frozen; the simulator env vars unset). The agent-loop settings (``+envace.*``) now list the rollout budget's
fields first (``LoopSettings`` subclasses ``RolloutBudget``), so that block is compared as a set; every other
override, and the order of all of them outside that block, must be the same. One value was changed in the
fixture on purpose since: the grpo cases' ``+envace.baseline`` is ``trajectory_mean`` (standard GRPO); and three
settings were added: ``+envace.max_tool_response_length`` / ``tool_response_truncate_side`` (null / middle) and
``+envace.argument_credit`` (0.0, the verifiable reward's near-miss credit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envace.config.load import compose, typed_config
from envace.engines.verl.config_builder import build_overrides, engine_option, loop_settings

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "verl" / "overrides_before_typed_config.json"
FROZEN = json.loads(FIXTURE.read_text())
SETTINGS = "+envace."


def build(cfg) -> list[str]:
    return build_overrides(
        cfg,
        train_files=["/run/data/train.parquet"],
        val_files=["/run/data/val.parquet"],
        output_dir="/run",
        model_path="/models/policy",
        env_vars={"MLFLOW_TRACKING_URI": "sqlite:////runs/mlflow.db"},
    )


def split(overrides: list[str]) -> tuple[list[str], set[str]]:
    return [o for o in overrides if not o.startswith(SETTINGS)], {o for o in overrides if o.startswith(SETTINGS)}


@pytest.mark.parametrize("case", sorted(FROZEN))
def test_overrides_equal_the_frozen_ones(case: str, monkeypatch) -> None:
    monkeypatch.delenv("ENVACE_SIMULATOR_URL", raising=False)
    monkeypatch.delenv("ENVACE_SIMULATOR_MODEL", raising=False)
    composed = compose(FROZEN[case]["compose"])
    expected = FROZEN[case]["overrides"]
    for given in (composed, typed_config(composed), OmegaConf.to_container(composed, resolve=True)):
        got = build(given)
        assert len(got) == len(expected)
        assert split(got) == split(expected)


def test_null_verl_options_take_conf_engine_verl_yaml(monkeypatch) -> None:
    """engine=local leaves the verl-only options null: they read as conf/engine/verl.yaml's values."""
    local, verl = typed_config(compose([])), typed_config(compose(["engine=verl"]))
    assert local.engine.val_every is None and verl.engine.val_every == -1
    for name in ("rollout_name", "tensor_parallel", "gpu_memory_utilization", "agent_workers", "chat_template"):
        assert engine_option(local.engine, name) == getattr(verl.engine, name) is not None
    assert engine_option(local.engine, "val_every") == -1
    assert engine_option(local.engine, "max_token_len_per_gpu") is None  # null: 2 x rollout.max_stream_tokens


def test_simulator_endpoint_falls_back_to_env_vars(monkeypatch) -> None:
    monkeypatch.setenv("ENVACE_SIMULATOR_URL", "http://sim:9/v1")
    monkeypatch.setenv("ENVACE_SIMULATOR_MODEL", "frozen")
    settings = loop_settings(compose(["profile=smoke", "algo=grpo", "algo.grpo_responses=simulator"]))
    assert (settings.simulator.base_url, settings.simulator.model) == ("http://sim:9/v1", "frozen")
    given = loop_settings(
        compose(["algo=grpo", "engine.simulator.base_url=http://other/v1", "engine.simulator.model=m"])
    )
    assert (given.simulator.base_url, given.simulator.model) == ("http://other/v1", "m")
