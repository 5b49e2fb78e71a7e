"""What the science matrix keeps between sittings (envace.stages.science, science/dvc.yaml): a costly part's
only DVC outputs are git-tracked, and the test-time parts find a cell's trained weights in its metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from envace.config.load import compose
from envace.stages.common import MANIFEST
from envace.stages.science import part_overrides
from envace.stages.science_matrix import (
    TRAINED_DIR,
    cell_checkpoints,
    progress_line,
    publish_trained,
    require_trained,
    trained_checkpoints,
)

COSTLY = ("sft_eval", "cell", "testtime", "testtime_base")


def _outs(stage: dict) -> list[tuple[str, dict]]:
    return [next(iter(o.items())) if isinstance(o, dict) else (o, {}) for o in stage.get("outs", [])]


def test_costly_parts_output_only_git_tracked_files(repo_root):
    """A cached output is missing on a fresh clone, which would make DVC re-run a finished cell or sweep."""
    stages = yaml.safe_load((repo_root / "science/dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():  # every part through the runner that publishes and reports progress
        assert stage["cmd"].startswith("python -m envace.stages.science_matrix "), name
        assert "envace/stages/science_matrix.py" in stage["deps"], name
    for name in COSTLY:
        outs = _outs(stages[name])
        assert outs, f"{name} declares no outputs"
        cached = [path for path, opts in outs if opts.get("cache", True)]
        assert not cached, f"science/dvc.yaml:{name} caches {cached}; a fresh clone would re-run it"
    # the test-time parts follow the cells through their git-tracked metrics, not their by-products
    for name in ("testtime", "testtime_base"):
        deps = stages[name]["deps"]
        assert not [d for d in deps if d.startswith("${science.dir}/cells")], deps
        assert [d for d in deps if d.startswith("${science.metrics}/cells/${science.testtime_variant}")], deps
    assert "${science.model_files}" in stages["sft"]["deps"]


def test_later_parts_depend_on_the_sft_model_not_its_manifest(repo_root):
    """The SFT part's directory holds a manifest with the machine's precision record (its CPU model); a
    fresh clone on another CPU re-runs that part, and a dependency on the whole directory would then make
    every finished cell stale. The parts after it depend on the model directory alone."""
    stages = yaml.safe_load((repo_root / "science/dvc.yaml").read_text())["stages"]
    assert "${science.dir}/sft" in [path for path, _ in _outs(stages["sft"])]
    for name in COSTLY:
        on_sft = [d for d in stages[name]["deps"] if d.startswith("${science.dir}/sft")]
        assert on_sft == ["${science.dir}/sft/final"], f"science/dvc.yaml:{name} depends on {on_sft}"


class _Result:
    artifacts = {"policy": "unused"}
    baseline: dict = {}
    steps_done = 0
    final_metrics: dict = {}


def test_export_keeps_the_machine_record_out_of_the_model_directory(tmp_path):
    """What the later science parts hash (``final/``) must not vary with the machine that exported it: the
    precision record (CPU model, bf16 support) goes to the manifest beside it, nowhere under ``final/``."""
    from envace.runtime.precision import precision_record
    from envace.stages.train import export_checkpoint
    from envace.utils.machine import cpu_model

    work = tmp_path / "work"
    (work / "final/policy").mkdir(parents=True)
    (work / "final/policy/model.safetensors").write_bytes(b"weights")
    cfg = compose(["profile=smoke", f"paths.checkpoints={tmp_path / 'ckpt'}"])
    record = precision_record("fp32", "fp32")
    manifest = export_checkpoint(_Result(), work, cfg, "digest", record)
    assert manifest["precision"]["cpu_model"] == cpu_model()
    assert json.loads((tmp_path / "ckpt" / MANIFEST).read_text())["precision"] == record
    machine = cpu_model().encode()
    under_final = sorted((tmp_path / "ckpt/final").rglob("*"))
    assert under_final and not [p for p in under_final if p.is_file() and machine in p.read_bytes()]


def _export(root: Path, *, baseline: bool = False) -> Path:
    """A cell's export: a manifest naming one policy directory, plus optimiser state not to be published."""
    ckpt = root / "checkpoints"
    (ckpt / "final/policy").mkdir(parents=True)
    (ckpt / "final/policy/model.safetensors").write_bytes(b"weights")
    (ckpt / "final/optimizer.pt").write_bytes(b"optimiser state")
    manifest = {"roles": {"act": "final/policy", "rehearse": "final/policy"}, "variant": "envace"}
    if baseline:
        (ckpt / "sft/policy").mkdir(parents=True)
        (ckpt / "sft/policy/model.safetensors").write_bytes(b"sft weights")
        manifest["baseline"] = {"act": "sft/policy", "rehearse": "sft/policy"}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    return ckpt


@pytest.mark.parametrize("baseline", [False, True], ids=["roles", "roles+baseline"])
def test_publish_copies_the_manifest_and_its_models_only(tmp_path, baseline):
    ckpt = _export(tmp_path, baseline=baseline)
    out = tmp_path / "metrics/cells/envace-seed0" / TRAINED_DIR
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("from an earlier run")
    files = publish_trained(ckpt, out)
    expected = [MANIFEST, "final/policy/model.safetensors"] + (["sft/policy/model.safetensors"] if baseline else [])
    assert files == sorted(expected)
    assert not (out / "stale.txt").exists() and not (out / "final/optimizer.pt").exists()


def test_testtime_reads_the_published_weights_when_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose(["profile=organism"])
    s = cfg.science
    name = "envace-seed0"
    (export,) = [o for o in part_overrides(cfg, "testtime", "envace", 0)[0] if o.startswith("paths.checkpoints=")]
    assert export == f"paths.checkpoints={cell_checkpoints(s, name)}"  # the part's own: the cell's export
    assert trained_checkpoints(s, name) == cell_checkpoints(s, name)  # nothing published
    with pytest.raises(FileNotFoundError, match="publish_policy.*Re-run it here"):
        require_trained(trained_checkpoints(s, name), name, s.metrics)
    published = Path(s.metrics) / "cells" / name / TRAINED_DIR
    publish_trained(_export(tmp_path / "elsewhere"), published)
    assert trained_checkpoints(s, name) == str(published)
    require_trained(trained_checkpoints(s, name), name, s.metrics)


def test_progress_line_counts_the_cells_with_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = compose(["profile=organism", "science.variants=[envace,grpo]", "science.seeds=[0,1]"]).science
    tasks = Path(s.metrics) / "cells/grpo-seed1/tasks.json"
    tasks.parent.mkdir(parents=True)
    tasks.write_text(json.dumps({"policy": [{"success": True}, {"success": False}, {"success": False}]}))
    line = progress_line(s, "cell", "grpo", 1, 90.0, 512.4)
    assert (
        line
        == "[science] cell grpo/seed1 done in 1.5 min, peak 512 MiB; test success 0.333 (n=3); cells with results: 1/4"
    )
    assert progress_line(s, "sft", None, None, 6.0, 100.0).startswith("[science] sft done in 0.1 min")
