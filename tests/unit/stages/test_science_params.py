"""The science stages' parameter dependencies: a group listed key by key names every key of that group
except the ones the part sets itself, in every profile that runs the matrix.

A key the part overrides cannot change what it computes, so depending on it only makes a finished
matrix stale when the main job tunes its own copy (steps, threads, test-set size). A key missing from the
list is worse: a change to it would leave a stale result marked up to date. Both are caught here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from envace.config.load import compose
from envace.stages.science import part_overrides

ROOT = Path(__file__).resolve().parents[3]
# part: (variant, seed) for part_overrides, and the groups its stage lists key by key
PARTS = {
    "sft": (None, None, ("train", "engine")),
    "sft_eval": (None, None, ("eval",)),
    "cell": ("envace", 0, ("train", "engine", "eval")),
    "testtime_base": ("envace", 0, ("rehearsal",)),
    "testtime": ("envace", 1, ("rehearsal",)),
}


def _stage_params(stage: str) -> list[str]:
    stages = yaml.safe_load((ROOT / "science" / "dvc.yaml").read_text())["stages"]
    return [p for p in stages[stage]["params"] if isinstance(p, str)]


@pytest.mark.parametrize("profile", ["organism", "cpu"])
@pytest.mark.parametrize("part", sorted(PARTS))
def test_group_keys_are_those_the_part_does_not_set(profile: str, part: str) -> None:
    cfg = compose([f"profile={profile}"])
    variant, seed, groups = PARTS[part]
    overridden = {o.split("=", 1)[0] for run in part_overrides(cfg, part, variant, seed) for o in run}
    listed = _stage_params(part)
    for group in groups:
        assert group not in listed, f"science/dvc.yaml stage {part!r} lists the whole {group} group"
        by_key = {p for p in listed if p.startswith(group + ".")}
        expected = {f"{group}.{k}" for k in cfg[group]} - overridden
        assert by_key == expected, (
            f"science/dvc.yaml stage {part!r}: its {group}.* params should be every {group} key the part "
            f"does not override; missing {sorted(expected - by_key)}, extra {sorted(by_key - expected)}"
        )


def test_cell_does_not_depend_on_what_it_overrides() -> None:
    listed = set(_stage_params("cell"))
    for key in ("train.steps", "engine.num_threads", "eval.n_tasks", "train", "engine", "eval"):
        assert key not in listed
    assert {"train.checkpoint_every", "engine.precision", "eval.temperature"} <= listed
    testtime = set(_stage_params("testtime"))
    assert "rehearsal" not in testtime and "rehearsal.n_tasks" not in testtime
    assert "rehearsal.summarizer" in testtime


@pytest.mark.parametrize("profile", ["organism", "cpu", "smoke", "paper"])
def test_the_aggregate_declares_the_details_file_the_writer_writes(profile: str) -> None:
    from envace.reporting.metrics_files import details_path

    s = compose([f"profile={profile}"]).science
    stages = yaml.safe_load((ROOT / "science" / "dvc.yaml").read_text())["stages"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stages["aggregate"]["outs"]]
    declared = {Path(os.path.normpath(o.replace("${science.reports}", str(s.reports)))) for o in outs}
    assert details_path(Path(str(s.json))) in declared
