"""Engines named in the registry load on first ``get_engine``: importing ``envace.engines`` loads none."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_engines_loads_no_engine_and_verl_resolves_by_name() -> None:
    seen = _run("""
        import json, sys
        import envace.engines as engines
        before = sorted(m for m in sys.modules if m.startswith("envace.engines.") or m.split(".")[0] == "verl")
        names = engines.available_engines()
        engine = engines.get_engine("verl")
        print(json.dumps({"before": before, "names": names, "name": engine.name,
                          "type": type(engine).__module__ + "." + type(engine).__qualname__,
                          "verl_loaded": "verl" in sys.modules}))
    """)
    assert not [m for m in seen["before"] if m.startswith(("envace.engines.verl", "envace.engines.local", "verl"))]
    assert {"local", "verl"} <= set(seen["names"])
    assert seen["name"] == "verl"
    assert seen["type"] == "envace.engines.verl.engine.VerlEngine"
    assert seen["verl_loaded"] is False  # resolving the engine does not import the verl package itself
