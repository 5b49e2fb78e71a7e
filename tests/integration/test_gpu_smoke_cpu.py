"""``scripts/gpu_smoke.py bare`` and ``organism`` on the CPU (``--device cpu``): the same code paths the GPU
smoke runs (precision switch, log-prob agreement, SFT warm-up, a rollout batch with both roles, the eval
backend's prefix cache; the organism's train stage with its validation curve), so the script cannot rot
between the rare sessions that have a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def smoke_on_cpu(mode: str, out: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), mode, "--device", "cpu", "--out", str(out)]
    result = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=600, check=False)
    report = json.loads((out / "report.json").read_text())
    assert result.returncode == 0 and report["ok"], json.dumps(report.get("checks"), indent=1) + result.stderr[-3000:]
    return report


def test_bare_smoke_runs_on_cpu(tmp_path: Path) -> None:
    report = smoke_on_cpu("bare", tmp_path)
    assert report["local_engine"]["dtype"] == "torch.float32"  # fp32 master weights under any precision
    assert report["local_engine"]["sft_epochs"] == 3 and report["local_engine"]["finite"]
    rollouts = report["rollouts"]
    assert rollouts["rehearse_outputs"] > 0 and rollouts["by_role"]["REHEARSE"] > 0 and rollouts["rows"] > 0
    assert 0 < rollouts["logprob_diff"] < 0.05 or report["local_engine"]["precision"] == "fp32"
    assert report["eval_backend"]["fp32_same_with_and_without_cache"]
    assert report["eval_backend"]["fp32_prefix_cache_hits"] > 0
    assert report["precision"]["fp32_max_gap"] == 0.0  # the same device: identical fp32 log-probs


def test_organism_smoke_runs_the_train_stage_on_cpu(tmp_path: Path) -> None:
    """One GRPO step of the organism from its committed start, validated before and after on 4 tasks."""
    report = smoke_on_cpu("organism", tmp_path, "--steps", "1", "--val-tasks", "4")
    train = report["train"]
    assert train["steps_done"] == 1 and train["precision"] == "fp32"  # the organism profile pins fp32
    assert set(train["val_success"]) == {"0", "1"} and train["max_weight_change"] > 0
    assert train["final"]["final/val/n"] == 4.0 and train["cuda_max_memory_mib"] is None
    assert "profile=organism" in report["overrides"] and (tmp_path / "organism" / "checkpoints" / "final").is_dir()
