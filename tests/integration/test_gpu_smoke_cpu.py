"""``scripts/gpu_smoke.py bare`` on the CPU (``--device cpu``): the same code paths the GPU smoke runs
(precision switch, log-prob agreement, SFT warm-up, a rollout batch with both roles, the eval backend's
prefix cache), so the script cannot rot between the rare sessions that have a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bare_smoke_runs_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "bare", "--device", "cpu", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert result.returncode == 0 and report["ok"], json.dumps(report.get("checks"), indent=1) + result.stderr[-3000:]
    assert report["local_engine"]["dtype"] == "torch.float32"  # fp32 master weights under any precision
    assert report["local_engine"]["sft_epochs"] == 3 and report["local_engine"]["finite"]
    rollouts = report["rollouts"]
    assert rollouts["rehearse_outputs"] > 0 and rollouts["by_role"]["REHEARSE"] > 0 and rollouts["rows"] > 0
    assert 0 < rollouts["logprob_diff"] < 0.05 or report["local_engine"]["precision"] == "fp32"
    assert report["eval_backend"]["fp32_same_with_and_without_cache"]
    assert report["eval_backend"]["fp32_prefix_cache_hits"] > 0
    assert report["precision"]["fp32_max_gap"] == 0.0  # the same device: identical fp32 log-probs
