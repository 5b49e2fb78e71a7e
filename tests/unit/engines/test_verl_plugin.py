"""verl's plugin entry point registers envace's estimators, trainer mode and agent loop (CPU)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import verl  # noqa: F401  (loads the verl.plugins entry points, as every verl process does)

SCRIPT_FRESH_PROCESS = """
import sys
import verl  # loads every verl.plugins entry point
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1 import get_trainer_cls
assert "envace.engines.verl.plugin" in sys.modules
core_algos.get_adv_estimator_fn("envace_rolewise"); core_algos.get_adv_estimator_fn("envace_grpo")
assert get_trainer_cls("envace").__name__ == "EnvacePPOTrainer"
assert "envace_act_rehearse" in _agent_loop_registry
"""

SCRIPT_LIGHT_IMPORTS = """
import sys
import envace.engines.verl, envace.engines.verl.config_builder, envace.engines.verl.launcher
import envace.engines.verl.episodes, envace.engines.verl.episode, envace.engines.verl.rows
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"verl", "ray", "vllm", "transfer_queue"})
assert not heavy, heavy
"""


def plugin_entry_point():
    found = [ep for ep in entry_points(group="verl.plugins") if ep.name == "envace"]
    if not found:
        pytest.fail(
            "no 'envace' entry point in group verl.plugins: reinstall the metadata with "
            "`pip install --no-deps -e .` (pyproject declares it)"
        )
    return found[0]


def test_entry_point_names_the_plugin_module_and_loads() -> None:
    ep = plugin_entry_point()
    assert ep.value == "envace.engines.verl.plugin"
    module = ep.load()  # what verl's __init__ does
    assert module is sys.modules["envace.engines.verl.plugin"]
    assert set(module.REGISTERED) == {
        "estimator 'envace_rolewise'",
        "estimator 'envace_grpo'",
        "trainer mode 'envace'",
        "agent loop 'envace_act_rehearse'",
    }


def test_every_registration_is_found_after_import_verl() -> None:
    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, _agent_loop_registry
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

    from envace.engines.verl.advantages import verl_grpo_advantage, verl_rolewise_advantage
    from envace.engines.verl.agent_loop import ActRehearseAgentLoop

    assert core_algos.get_adv_estimator_fn("envace_rolewise") is verl_rolewise_advantage
    assert core_algos.get_adv_estimator_fn("envace_grpo") is verl_grpo_advantage
    trainer = get_trainer_cls("envace")
    assert issubclass(trainer, PPOTrainerSync) and get_trainer_cls("sync") is PPOTrainerSync
    target = _agent_loop_registry["envace_act_rehearse"]["_target_"]
    assert get_class(target) is ActRehearseAgentLoop and issubclass(ActRehearseAgentLoop, AgentLoopBase)


def test_registration_is_idempotent() -> None:
    from verl.trainer.ppo.v1 import get_trainer_cls

    from envace.engines.verl.plugin import REGISTERED, register_all

    before = get_trainer_cls("envace")
    assert register_all() == REGISTERED
    assert get_trainer_cls("envace") is before


def test_launcher_side_modules_import_neither_verl_nor_ray() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT_LIGHT_IMPORTS], capture_output=True, check=False, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_a_fresh_process_registers_on_import_verl() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT_FRESH_PROCESS], capture_output=True, check=False, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
