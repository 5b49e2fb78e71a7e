"""The metrics files DVC reads (issue 14): the rehearsal grid's cells keyed by a stable name, the report
reading back what the stages returned (numbers + details merged, cells as rows), and `make help`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envace.config.load import compose, typed_config
from envace.reporting import metrics_files
from envace.reporting.sweep_layout import cell_name, cells_list, keyed_cells
from envace.reporting.tables import testtime_table as build_testtime_table
from envace.stages import runner
from envace.stages.report import load_metrics

ROOT = Path(__file__).resolve().parents[3]


def _row(n, mode, rehearser, rate):
    return {
        "benchmark": "toolworld",
        "cell": f"n{n}-{mode}-{rehearser}",
        "n_attempts": n,
        "mode": mode,
        "rehearser": rehearser,
        "scope": "turn",
        "scope_label": "turn",
        "success_rate": rate,
        "mean_score": rate,
        "gain_vs_none": rate - 0.25,
        "cost/rehearsal_wall_s": 1.5 * n,
    }


ROWS = [_row(0, "none", "none", 0.25)] + [
    _row(n, m, r, 0.5) for n in (1, 2) for m in ("parallel", "sequential") for r in ("trained", "base")
]


def test_cells_are_keyed_by_a_stable_name_and_come_back_in_grid_order():
    keyed = keyed_cells(ROWS)
    assert list(keyed)[:2] == ["toolworld/none/n0/none", "toolworld/parallel/n1/trained"]
    assert cell_name(ROWS[-1]) == "toolworld/sequential/n2/base" and len(keyed) == len(ROWS)
    assert cells_list(dict(sorted(keyed.items()))) == ROWS  # the file's sorted keys, back in grid order
    assert cells_list(ROWS) is ROWS
    flipped = cells_list(keyed, modes=["sequential", "parallel"], rehearsers=["base", "trained"])
    assert [(c["mode"], c["rehearser"]) for c in flipped[1:3]] == [("sequential", "base"), ("sequential", "trained")]
    with pytest.raises(ValueError, match="two cells named"):
        keyed_cells([ROWS[0], dict(ROWS[0])])


def test_dvc_sees_every_cell_and_the_report_reads_the_rows_it_read_before(tmp_path, paths_under):
    metrics = {"benchmarks": ["toolworld"], "n_tasks": {"toolworld": 4}, "cells": keyed_cells(ROWS)}
    runner.execute(
        "rehearsal_sweep",
        lambda cfg, tracker: metrics,
        compose(["profile=smoke", "tracking=none", *paths_under(tmp_path)]),
        tmp_path / "metrics" / "rehearsal_sweep.json",
    )
    on_disk = json.loads((tmp_path / "metrics" / "rehearsal_sweep.json").read_text())
    assert set(on_disk) == {"cells"}  # headline: one success rate per cell, nothing else
    assert on_disk["cells"]["toolworld/parallel/n2/trained"] == {"success_rate": 0.5}
    details = json.loads((tmp_path / "metrics" / "rehearsal_sweep.details.json").read_text())
    assert details["benchmarks"] == ["toolworld"] and details["cells"]["toolworld/none/n0/none"]["mode"] == "none"
    cfg = compose(["profile=smoke", "tracking=none", "eval.benchmarks=[toolworld]", *paths_under(tmp_path)])
    loaded = load_metrics(typed_config(cfg))["rehearsal_sweep"]
    assert loaded["cells"] == ROWS and loaded["n_tasks"] == {"toolworld": 4}
    expected = build_testtime_table({"rehearsal_sweep": {**metrics, "cells": ROWS}})  # the list form, as before
    assert build_testtime_table({"rehearsal_sweep": loaded}).to_dict("records") == expected.to_dict("records")


def test_load_metrics_merges_each_stage_with_its_details(tmp_path, paths_under):
    train = {
        "steps_done": 2,
        "final/reward/mean": 0.5,
        "final/time/step": 3.0,
        "variant": "envace",
        "curves": {"step": [0, 1], "reward/mean": [None, 0.5]},
    }
    evaluate = {
        "benchmark": "toolworld",
        "n_tasks": 4,
        "policy": {"success_rate": 0.5, "status_info": {"s": "ran"}},
        "base": {"success_rate": 0.25, "transfer": None},
    }
    root = tmp_path / "metrics"
    metrics_files.write_metrics(root / "train.json", train, metrics_files.headline_for("train"))
    metrics_files.write_metrics(
        root / "evaluate_toolworld.json", evaluate, metrics_files.headline_for("evaluate@toolworld")
    )
    assert "variant" not in json.loads((root / "train.json").read_text())
    cfg = compose(["profile=smoke", "tracking=none", "eval.benchmarks=[toolworld]", *paths_under(tmp_path)])
    assert load_metrics(typed_config(cfg)) == {"train": train, "evaluate_toolworld": evaluate}


def test_make_help_shows_expanded_values():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    # a clean environment: under `make test VENV=...` (CI) the parent make's variables reach us via MAKEFLAGS
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VENV", "PROFILE")}
    out = subprocess.run([make, "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True, env=env).stdout
    assert "$(" not in out
    assert "(.venv)" in out and "on the organism profile" in out and "127.0.0.1:4200" in out
    out = subprocess.run(
        [make, "-s", "help", "VENV=/opt/venv", "PROFILE=smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert "(/opt/venv)" in out and "on the smoke profile" in out


# ---- issue 45: `dvc metrics show` reads headline numbers only ----------------------------------------
METRICS_KEY_BUDGET = 64  # flattened keys per declared metrics file: a few dozen headline numbers
SHOW_LINE_BUDGET = 4000  # characters per line of `dvc metrics show` (one column per key, over all files)


def _declared_metrics() -> list[tuple[object, Path]]:
    """(stage, path) of every ``metrics:`` entry of dvc.yaml and science/dvc.yaml, as DVC resolves them."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        return [(stage, Path(out.fs_path)) for stage in repo.index.stages for out in stage.outs if out.metric]


def _flat_keys(tree) -> int:
    return sum(_flat_keys(v) for v in tree.values()) if isinstance(tree, dict) and tree else 1


def test_metrics_files_key_budget():
    declared = _declared_metrics()
    # the matrix of the committed params.yaml's profile (the organism's: science/organism/science.json)
    science_json = ROOT / yaml.safe_load((ROOT / "params.yaml").read_text())["science"]["json"]
    assert science_json in {p for _, p in declared}
    for stage, path in declared:
        assert path.exists(), f"{path} is declared as metrics by {stage.addressing} but is not committed"
        n = _flat_keys(json.loads(path.read_text()))
        assert n <= METRICS_KEY_BUDGET, f"{path.relative_to(ROOT)}: {n} keys; move the detail to its details file"
        # the rest sits beside it, a plain output of the same stage (DVC reads it only when named)
        details = metrics_files.details_path(path)
        assert details in {Path(o.fs_path) for o in stage.outs if not o.metric}, f"{stage.addressing}: {details}"
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("dvc")), "metrics", "show"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    widest = max(len(line) for line in shown.stdout.splitlines())
    assert widest <= SHOW_LINE_BUDGET, f"`dvc metrics show` prints lines of {widest} characters"


def test_the_science_headline_keeps_the_aggregate_and_the_details_keep_the_rest():
    """The aggregate's writer on the committed matrix: the headline within budget, nothing lost."""
    from envace.reporting.science import HEADLINE

    full = metrics_files.read_metrics(ROOT / "science" / "science.json")
    numbers, details = metrics_files.split_metrics(full, HEADLINE)
    assert 0 < _flat_keys(numbers) <= METRICS_KEY_BUDGET
    envace = full["aggregate"]["variants"]["envace"]["all"]["mean"]
    assert numbers["aggregate"]["variants"]["envace"]["all"]["mean"] == envace
    assert "tasks" in details["envace/seed0"] and metrics_files.merge_metrics(numbers, details) == full
