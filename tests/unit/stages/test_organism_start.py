"""The organism start's record (envace.stages.organism_start): what a build that finds its parts already
finished in the run directory writes (a resumed build, or a re-run after a dependency changed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from envace.stages import organism_calibration as cal
from envace.stages import organism_start


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@pytest.fixture
def finished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory whose data, SFT and validation parts have all finished (their done-files exist)."""
    run = tmp_path / "runs" / "start"
    metrics = run / cal.METRICS
    _write(metrics / "data" / "timing_data.json", {"seconds": {"prepare": 1.5, "template": 0.5}})
    _write(metrics / "sft" / "train.json", {"final/sft/loss": 0.0616, "final/sft/flawed_specs": 3})
    _write(metrics / "sft" / "train.details.json", {"precision": "fp32"})
    _write(metrics / "sft" / "timing_sft.json", {"seconds": {"train": 6951.8}})
    _write(metrics / "sft" / "timing_sft_eval.json", {"seconds": {"evaluate": 18.7}})
    tasks = [{"success": True, "domain": "bank"}, {"success": False, "domain": "shop"}]
    _write(metrics / "sft" / "tasks.json", {"policy": tasks})
    (run / "params.yaml").write_text("science:\n  dir: data/sci\n")
    policy = run / "data" / "sci" / "sft" / "final" / "policy"
    _write(policy / "config.json", {})
    (policy / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(cal, "ROOT", tmp_path)
    monkeypatch.setattr(cal, "prepare", lambda name, overrides: run)
    return run


def test_a_build_that_reuses_finished_parts_records_what_they_cost(tmp_path: Path, finished_run: Path) -> None:
    params = tmp_path / "organism.yaml"
    params.write_text(
        "start:\n  run: start\n  out: out/start\n  record: out/start.json\n  overrides: [science.n_train=10]\n"
    )
    record = organism_start.build(params)
    # the parts' own timing files, not the 0 s this build spent skipping them
    assert record["seconds"] == {"data": 2.0, "sft": 6951.8, "val": 18.7}
    assert record["reused_parts"] == ["data", "sft", "val"]
    assert json.loads((tmp_path / "out" / "start.json").read_text())["seconds"]["sft"] == 6951.8
    assert record["val"]["successes"] == 1 and record["val"]["n"] == 2
    assert record["weights_sha256"] == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}
    assert (tmp_path / "out" / "start" / "config.json").is_file()


def test_part_seconds_sums_the_stages_of_a_part(tmp_path: Path) -> None:
    timing = tmp_path / "timing_sft.json"
    _write(timing, {"part": "sft", "seconds": {"train": 10.25, "evaluate": 2.0}})
    assert organism_start.part_seconds(timing) == 12.25
