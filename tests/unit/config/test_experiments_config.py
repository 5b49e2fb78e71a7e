"""Every ``conf/experiment/*.yaml`` file composed with the real config: what it would evaluate, what its
test-time sweep would run on, and whether the train stage would launch it or refuse it before launch.

The paper's tables: main = BFCL-v4, τ²-Bench, VitaBench and FinMCP-Bench; test-time = τ²-Bench and BFCL
multi-turn; ablation and scale = τ²-Bench.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.config.enums import EngineName
from envace.config.load import compose, to_plain, typed_config
from envace.engines.verl.config_builder import VerlConfigError, check_supported
from envace.envs.bfcl.categories import CATEGORIES, GROUPS, resolve_categories
from envace.envs.tau2.config import DOMAINS, parse_subset
from envace.stages.suites import eval_suite

CONF = Path(__file__).resolve().parents[3] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
MAIN_BENCHMARKS = {"bfcl", "tau2", "vitabench", "finmcp"}
TESTTIME_BENCHMARKS = {"tau2", "bfcl"}
SIMULATOR_KEYS = ("engine.simulator.base_url", "engine.simulator.model", "engine.simulator.api_key_env")
# experiments the train stage refuses before launch, and what the refusal must name
REFUSED = {"ablation_grpo": SIMULATOR_KEYS, "ablation_per_role": ("engine=local",)}


@pytest.fixture(autouse=True)
def _no_simulator_env(monkeypatch):
    """The simulator's env-var fallbacks would hide a missing endpoint."""
    monkeypatch.delenv("ENVACE_SIMULATOR_URL", raising=False)
    monkeypatch.delenv("ENVACE_SIMULATOR_MODEL", raising=False)


def experiment(name: str, *overrides: str):
    return typed_config(compose([f"experiment={name}", *overrides]))


def evaluated(cfg) -> dict[str, object]:
    """benchmark -> the resolved suite each ``evaluate@<benchmark>`` stage runs."""
    return {b: eval_suite(cfg, b) for b in to_plain(cfg.eval.benchmarks)}


def swept(cfg) -> dict[str, object]:
    """benchmark -> the resolved suite the rehearsal sweep runs."""
    return {b: eval_suite(cfg, b, "rehearsal") for b in to_plain(cfg.rehearsal.benchmarks)}


def launch_refusal(cfg) -> str | None:
    """The pre-launch refusal of the train stage's engine (verl's ``check_supported``), None when it launches."""
    if cfg.engine.name is not EngineName.verl:
        return None
    try:
        check_supported(cfg)
    except VerlConfigError as exc:
        return str(exc)
    return None


def assert_tau2_standard(suite) -> None:
    """All three τ² domains with the customer played by a user-simulator LLM (the benchmark's standard mode)."""
    assert {domain for domain, _ in parse_subset(suite.split)} == set(DOMAINS)
    assert suite.options.get("mode") == "user_llm"


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n.startswith("main_")])
def test_main_rows_evaluate_the_four_paper_benchmarks(name):
    suites = evaluated(experiment(name))
    assert set(suites) == MAIN_BENCHMARKS
    assert resolve_categories(suites["bfcl"].split) == list(CATEGORIES)  # BFCL-v4: every category
    assert_tau2_standard(suites["tau2"])
    assert suites["vitabench"].options.get("data_path") and suites["finmcp"].options.get("data_path")


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n.startswith("testtime_")])
def test_testtime_rows_sweep_tau2_and_bfcl_multi_turn(name):
    cfg = experiment(name)
    for suites in (swept(cfg), evaluated(cfg)):  # the sweep and the evaluation run on the same tasks
        assert set(suites) == TESTTIME_BENCHMARKS
        assert resolve_categories(suites["bfcl"].split) == list(GROUPS["multi_turn"])
        assert_tau2_standard(suites["tau2"])


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n.startswith(("ablation_", "scale_"))])
def test_ablation_and_scale_rows_evaluate_tau2(name):
    suites = evaluated(experiment(name))
    assert set(suites) == {"tau2"}
    assert_tau2_standard(suites["tau2"])


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_launches_or_is_refused_before_launch_naming_the_keys(name):
    refusal = launch_refusal(experiment(name))
    if name not in REFUSED:
        assert refusal is None, f"{name} is refused: {refusal}"
        return
    assert refusal is not None, f"{name} would launch and fail later"
    for key in REFUSED[name]:
        assert key in refusal


def test_grpo_on_cm2_launches_once_the_simulator_endpoint_is_set():
    cfg = experiment(
        "ablation_grpo",
        "engine.simulator.base_url=http://simulator:8000/v1",
        "engine.simulator.model=Qwen3-8B",
    )
    assert launch_refusal(cfg) is None


def test_grpo_with_real_responses_on_cm2_is_refused_naming_the_fix():
    refusal = launch_refusal(experiment("ablation_grpo", "algo.grpo_responses=executor"))
    assert refusal is not None
    assert "algo.grpo_responses=simulator" in refusal and all(key in refusal for key in SIMULATOR_KEYS)
