"""Run a probe in a fresh interpreter (modules other tests imported cannot hide what it checks): the probe
prints its finding as JSON on the last line of its stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str, timeout: float, what: str = "the probe") -> tuple[Any, str]:
    """(the JSON of ``code``'s last stdout line, its stderr); fails the test when the interpreter fails."""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{what} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
