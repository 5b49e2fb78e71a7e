"""dvc.yaml, params.yaml, the stage modules and the Prefect tasks describe one DAG."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from envace.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def _get(tree, dotted):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_every_stage_module_is_a_dvc_stage_and_runnable():
    assert list(DVC) == list(STAGES)
    for name in STAGES:
        module = importlib.import_module(f"envace.stages.{name}")
        assert callable(module.run) and callable(module.main)
        assert DVC[name].get("cmd", DVC[name].get("do", {}).get("cmd", "")).startswith(f"python -m envace.stages.{name}")
        assert len((ROOT / "envace" / "stages" / f"{name}.py").read_text().splitlines()) <= 200


@pytest.mark.parametrize("name", list(DVC))
def test_declared_params_exist_and_paths_come_from_params(name):
    stage = DVC[name].get("do", DVC[name])
    for key in stage.get("params", []):
        _get(PARAMS, key)  # KeyError names a param dvc.yaml declares but params.yaml lacks
    for section in ("outs", "metrics", "plots"):
        for entry in stage.get(section, []):
            path = entry if isinstance(entry, str) else next(iter(entry))
            assert path.startswith("${paths."), f"{name}.{section}: {path} should come from paths.*"
    assert f"envace/stages/{name}.py" in stage["deps"] and "envace/stages/runner.py" in stage["deps"]


def test_evaluate_runs_once_per_benchmark():
    assert DVC["evaluate"]["foreach"] == "${eval.benchmarks}"
    assert "eval.benchmark=${item}" in DVC["evaluate"]["do"]["cmd"]
    # the committed params.yaml is the cpu profile: the tool world, a BFCL-v4 subset and τ² telecom solo
    assert PARAMS["eval"]["benchmarks"] == ["toolworld", "bfcl", "tau2"]
    assert PARAMS["eval"]["suites"]["tau2"]["split"] == "telecom"


def test_every_dvc_stage_has_a_prefect_task():
    pytest.importorskip("prefect")
    from tasks.stages import STAGE_TASKS

    assert set(STAGE_TASKS) == set(DVC)
    from flows.pipeline import select_stages

    order = ["prepare_data", "template_prompts", "train", "evaluate@toolworld", "rehearsal_sweep", "report"]
    assert select_stages(order, None) == order
    assert select_stages(order, ["evaluate", "report"]) == ["evaluate@toolworld", "report"]
    with pytest.raises(ValueError, match="unknown stages"):
        select_stages(order, ["nope"])
    with pytest.raises(ValueError, match="no Prefect task"):
        select_stages([*order, "extra"], None)


def test_the_flow_is_named_envace_and_served_as_full_pipeline():
    pytest.importorskip("prefect")
    import inspect

    from flows.pipeline import envace_flow

    assert envace_flow.name == "envace"
    params = inspect.signature(envace_flow.fn).parameters
    assert list(params) == ["overrides", "stages"]
    assert 'serve(name="full-pipeline")' in (ROOT / "flows" / "serve.py").read_text()
    from prefect.cache_policies import NO_CACHE

    from tasks.stages import STAGE_TASKS

    assert {name for name, t in STAGE_TASKS.items() if t.retries} == {"evaluate", "rehearsal_sweep"}
    assert all(t.cache_policy is NO_CACHE for t in STAGE_TASKS.values())


def test_every_configurable_benchmark_has_adapter_settings():
    from envace.config import Benchmark
    from envace.stages.suites import BENCHMARK_KWARGS

    assert {b.value for b in Benchmark} == set(BENCHMARK_KWARGS)
