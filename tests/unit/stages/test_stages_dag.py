"""dvc.yaml, params.yaml, the stage modules and the Prefect tasks describe one DAG."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from envace.config.load import compose, to_plain
from envace.stages import STAGES

ROOT = Path(__file__).resolve().parents[3]
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
        assert (
            DVC[name].get("cmd", DVC[name].get("do", {}).get("cmd", "")).startswith(f"python -m envace.stages.{name}")
        )
        assert len((ROOT / "envace" / "stages" / f"{name}.py").read_text().splitlines()) <= 200


@pytest.fixture(scope="module")
def package():
    """envace's source files and import graph, read once for every stage."""
    from envace.reporting.science_provenance import read_package

    return read_package(ROOT / "envace")


@pytest.mark.parametrize("name", list(DVC))
def test_each_stage_declares_every_envace_file_its_command_can_import(name, package):
    """DVC re-runs a stage only for the dependencies it lists; a module its command imports but the stage
    does not list (a helper under envace/utils, say) could change its outputs unseen. The closure is static
    (envace.utils.imports): an import inside a function counts, the safe side."""
    from envace.reporting.science_provenance import importable_files, uncovered

    stage = DVC[name].get("do", DVC[name])
    declared = [d for d in stage["deps"] if isinstance(d, str) and d.startswith("envace")]
    files = importable_files(ROOT, stage["cmd"], package)
    assert files, f"stage {name}: its command {stage['cmd']!r} runs no envace module"
    missing = sorted(uncovered(files, declared))
    assert not missing, f"dvc.yaml stage {name}: add to its deps (or a folder holding them): {missing}"


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
    # the committed params.yaml is the organism's: the tool world alone; the cpu profile (SmolLM2) adds a
    # BFCL-v4 subset and τ² telecom solo
    assert PARAMS["profile"] == "organism" and PARAMS["eval"]["benchmarks"] == ["toolworld"]
    cpu = to_plain(compose(["profile=cpu"]))
    assert cpu["eval"]["benchmarks"] == ["toolworld", "bfcl", "tau2"]
    assert cpu["eval"]["suites"]["tau2"]["split"] == "telecom"


def test_every_dvc_stage_has_a_prefect_task():
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
    import inspect

    from flows.pipeline import envace_flow

    assert envace_flow.name == "envace"
    params = inspect.signature(envace_flow.fn).parameters
    assert list(params) == ["overrides", "stages", "timeouts"]
    from flows.pipeline import DEPLOYMENT_CONCURRENCY, DEPLOYMENT_NAME, stage_task

    assert DEPLOYMENT_NAME == "full-pipeline" and "serve()" in (ROOT / "flows" / "serve.py").read_text()
    assert DEPLOYMENT_CONCURRENCY.limit == 1 and DEPLOYMENT_CONCURRENCY.collision_strategy.value == "ENQUEUE"
    from prefect.cache_policies import NO_CACHE

    from tasks.stages import STAGE_TASKS, TIMEOUT_SECONDS

    assert {name for name, t in STAGE_TASKS.items() if t.retries} == {"evaluate", "rehearsal_sweep"}
    assert all(t.cache_policy is NO_CACHE for t in STAGE_TASKS.values())
    assert all(t.timeout_seconds == TIMEOUT_SECONDS[name] > 0 for name, t in STAGE_TASKS.items())
    assert stage_task("evaluate@bfcl", {"evaluate": 60}).timeout_seconds == 60
    assert stage_task("evaluate@bfcl", {"evaluate@bfcl": 90, "evaluate": 60}).timeout_seconds == 90
    with pytest.raises(ValueError, match="positive"):
        stage_task("train", {"train": 0})
    assert stage_task("train", {"evaluate": 60}) is STAGE_TASKS["train"]


def test_every_configurable_benchmark_has_adapter_settings():
    from envace.config.enums import Benchmark
    from envace.stages.suites import BENCHMARK_KWARGS

    assert {b.value for b in Benchmark} == set(BENCHMARK_KWARGS)


def test_every_data_plot_names_its_x_and_y():
    """Stage `plots:` on data files and top-level plot definitions say which columns they draw; image
    entries (PNG paths) have no columns and are the only entries allowed without them."""
    top = yaml.safe_load((ROOT / "dvc.yaml").read_text()).get("plots", [])
    staged = [entry for stage in DVC.values() for entry in stage.get("do", stage).get("plots", [])]
    entries = [(e, {}) if isinstance(e, str) else next(iter(e.items())) for e in [*staged, *top]]
    data = {name: spec for name, spec in entries if not name.endswith(".png")}
    assert {"${paths.plots}/train_steps.csv", "fidelity_over_training", "testtime_success"} <= set(data)
    for name, spec in data.items():
        assert spec.get("x") and spec.get("y"), f"dvc.yaml plot {name} needs an explicit x and y"
    assert data["${paths.plots}/train_steps.csv"]["y"] == "reward/mean"
