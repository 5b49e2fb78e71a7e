"""GPU checks (marker ``gpu``; deselected by default): run scripts/gpu_smoke.sh and read its report.

``pytest -m gpu tests/gpu`` on a machine with CUDA. ``bare`` and ``organism`` need PyTorch + transformers
only; ``verl`` additionally needs the GPU extra (verl[verl-core,vllm], Ray) and is skipped without vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def run_smoke(mode: str, out: Path, *args: str) -> dict:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), mode, *args],
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=660,
    )
    report_file = out / "report.json"
    log = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert report_file.is_file(), f"no report (exit {result.returncode}):\n{log}"
    report = json.loads(report_file.read_text())
    assert result.returncode == 0 and report["ok"], json.dumps(report, indent=1)[:6000]
    return report


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_bare_local_engine_estimator_and_loss_on_cuda(tmp_path: Path) -> None:
    report = run_smoke("bare", tmp_path)
    assert report["estimator"]["matches_cpu"] and report["local_engine"]["dtype"] == "torch.float32"
    assert report["local_engine"]["precision"] == "bf16" and report["precision"]["auto"] == "bf16"


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_the_organism_trains_on_cuda_through_the_train_stage(tmp_path: Path) -> None:
    report = run_smoke("organism", tmp_path, "--steps", "10")
    assert report["train"]["cuda_max_memory_mib"] > 0 and set(report["train"]["val_success"]) == {"0", "10"}


@pytest.mark.skipif(
    not cuda_available() or importlib.util.find_spec("vllm") is None,
    reason="needs a CUDA device and the GPU extra (vLLM)",
)
def test_verl_engine_trains_both_roles(tmp_path: Path) -> None:
    report = run_smoke("verl", tmp_path)
    assert report["checks"]["act_trained"] and report["checks"]["rehearse_trained"]
    assert report["checks"]["parameters_changed"] and report["checks"]["loss_finite"]
