"""Collect the DVC experiments of this repo into one JSON the report stage turns into tables.

``python -m envace.reporting.experiments collect`` runs ``dvc exp show --json`` (DVC 3.x) and writes
``<paths.metrics>/experiments.json``: one entry per row that has metrics — the workspace, the
baseline commit and every experiment ref derived from it (``--all-commits``: from every commit) —
sorted, written atomically (the same refs give the same bytes). Each entry holds

- ``kind`` (workspace | baseline | experiment), ``name``, ``rev``, ``baseline``, ``timestamp``;
- ``params``: the keys that identify a run (``PARAM_KEYS``: profile, algo.name, model.name, ...);
- ``success_rate``: per benchmark (``evaluate_<b>.json``) the trained policy's and the base model's;
- ``train``: ``final_reward`` (``final/reward/mean``), ``steps_done``, ``variant``;
- ``curves``: train.json's ``curves`` object (one value per step, null where not measured) when the
  run wrote one, else the same keys rebuilt from that revision's ``train_steps.csv`` (older runs);
  ``curves_source`` says which, ``null`` when neither exists.

``dvc exp show --json`` keeps only scalar metric values (it drops ``curves``' lists), so curves are
read from each revision itself: ``git show <rev>:<path>`` (metrics/ and plots/ are git-tracked) or
the file on disk for the workspace. Runs are told apart by params, not by name: an experiment run
with ``dvc exp run -S algo=grpo`` (any name) is the grpo row of the ablation table.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from envace.core.curves import CURVE_KEYS
from envace.tracking.params import PARAM_KEYS
from envace.utils.io import write_json

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
OUTPUT_NAME = "experiments.json"
# the columns of a train_steps.csv read as curves: the step and every curve of train.json
STEPS_CSV_COLUMNS = ("step", *CURVE_KEYS)
KIND_ORDER = {"workspace": 0, "baseline": 1, "experiment": 2}
_EVALUATE_FILE = re.compile(r"(?:^|/)evaluate_(?P<bench>[^/]+)\.json$")


class CollectError(RuntimeError):
    """DVC missing, not a DVC repo, or ``dvc exp show`` failed / answered in an unknown shape."""


# ---- running dvc and git ---------------------------------------------------------------------------
def find_dvc() -> str:
    """The ``dvc`` next to this interpreter (the project venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("dvc")
    if beside.exists():
        return str(beside)
    found = shutil.which("dvc")
    if found is None:
        raise CollectError(
            "dvc not found next to this Python or on PATH; run `make install` (or "
            "`pip install dvc`) and activate the venv (`source .venv/bin/activate`)"
        )
    return found


def dvc_exp_show(root: Path, all_commits: bool = False) -> list[dict[str, Any]]:
    """``dvc exp show --json`` in ``root``: a list of rows (workspace first, then baselines)."""
    if not (root / ".dvc").is_dir():
        raise CollectError(
            f"{root} is not a DVC repository (no .dvc/ directory); run from the project root or pass --root"
        )
    cmd = [find_dvc(), "exp", "show", "--json", *(["--all-commits"] if all_commits else [])]
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "DVC_STUDIO_OFFLINE": "true"}
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise CollectError(
            f"`dvc {' '.join(cmd[1:])}` failed in {root} (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-2000:] or proc.stdout.strip()[-2000:]}"
        )
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise CollectError(f"`dvc exp show --json` printed no JSON ({exc.msg}): {proc.stdout[:300]!r}") from exc
    if not isinstance(rows, list):
        raise CollectError(
            f"`dvc exp show --json` gave a {type(rows).__name__}, expected a list of rows "
            "(the DVC 3.x shape); check `dvc version`"
        )
    return rows


def read_revision_file(root: Path, rev: str, relpath: str) -> str | None:
    """A file's text at ``rev`` (the disk for ``workspace``); None when it does not exist there."""
    if rev == "workspace":
        path = root / relpath
        return path.read_text(encoding="utf-8") if path.is_file() else None
    proc = subprocess.run(["git", "show", f"{rev}:./{relpath}"], cwd=root, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


# ---- parsing ---------------------------------------------------------------------------------------
def iter_rows(rows: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], str, str | None]]:
    """``(row, kind, baseline rev)`` for the workspace, each baseline commit and its experiments."""
    for row in rows:
        if row.get("rev") == "workspace":
            yield row, "workspace", None
            continue
        yield row, "baseline", row.get("rev")
        for experiment in row.get("experiments") or []:
            for rev in experiment.get("revs") or []:
                yield rev, "experiment", row.get("rev")


def _dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _params(data: dict[str, Any]) -> dict[str, Any]:
    """All params files of a row merged (params.yaml in this project)."""
    merged: dict[str, Any] = {}
    for _, content in sorted((data.get("params") or {}).items()):
        merged.update((content or {}).get("data") or {})
    return merged


def _scalar_metrics(data: dict[str, Any]) -> tuple[dict[str, dict[str, float]], dict[str, Any] | None]:
    """Per-benchmark success rates and the training summary from a row's (scalar) metrics."""
    success: dict[str, dict[str, float]] = {}
    train = None
    for path, content in sorted((data.get("metrics") or {}).items()):
        values = (content or {}).get("data")
        if not values:
            continue
        match = _EVALUATE_FILE.search(path)
        if match:
            success[match["bench"]] = {
                who: values[who]["success_rate"]
                for who in ("policy", "base")
                if isinstance(values.get(who), dict) and "success_rate" in values[who]
            }
        elif Path(path).name == "train.json":
            train = {
                "final_reward": values.get("final/reward/mean"),
                "real_env_calls": values.get("final/real_env/calls_total"),
                "steps_done": values.get("steps_done"),
                "variant": values.get("variant"),
            }
    return success, train


def _number(text: str | None) -> float | int | None:
    """A CSV cell as a JSON number: empty, NaN, infinite or non-numeric cells are None."""
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() else value


def curves_from_steps_csv(text: str) -> dict[str, list[Any]] | None:
    """``STEPS_CSV_COLUMNS`` of a ``train_steps.csv`` as curves (older runs had no ``curves``)."""
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    columns = [key for key in STEPS_CSV_COLUMNS if key in (reader.fieldnames or [])]
    if not rows or "step" not in columns:
        return None
    return {key: [_number(row[key]) for row in rows] for key in columns}


def read_curves(root: Path, rev: str, params: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """A revision's per-step curves and where they came from (train.json, train_steps.csv or None)."""
    metrics_dir = _dotted(params, "paths.metrics") or "metrics"
    plots_dir = _dotted(params, "paths.plots") or "plots"
    # train.details.json (the runner's non-numeric half, where lists live), else train.json (older runs)
    for name in ("train.details.json", "train.json"):
        text = read_revision_file(root, rev, f"{metrics_dir}/{name}")
        if text:
            try:
                curves = json.loads(text).get("curves")
            except (json.JSONDecodeError, AttributeError):
                curves = None
            if isinstance(curves, dict) and curves.get("step"):
                return curves, "train.json"
    text = read_revision_file(root, rev, f"{plots_dir}/train_steps.csv")
    curves = curves_from_steps_csv(text) if text else None
    return curves, ("train_steps.csv" if curves else None)


def read_variant(root: Path, rev: str, params: dict[str, Any]) -> str | None:
    """train's ``variant`` (a string: in ``train.details.json``, which ``dvc exp show`` does not read)."""
    metrics_dir = _dotted(params, "paths.metrics") or "metrics"
    text = read_revision_file(root, rev, f"{metrics_dir}/train.details.json")
    try:
        variant = json.loads(text).get("variant") if text else None
    except (json.JSONDecodeError, AttributeError):
        variant = None
    return variant if isinstance(variant, str) else None


def parse_row(root: Path, row: dict[str, Any], kind: str, baseline: str | None) -> dict[str, Any] | None:
    """One entry of experiments.json, or None for a row without metrics (queued, failed, empty)."""
    data = row.get("data") or {}
    if row.get("error"):
        logger.warning("skipping %s %s: dvc reported %s", kind, row.get("name") or row.get("rev"), row["error"])
        return None
    success, train = _scalar_metrics(data)
    if not success and train is None:
        return None
    params = _params(data)
    rev = str(row.get("rev"))
    if train is not None and train.get("variant") is None:
        train["variant"] = read_variant(root, rev, params)
    curves, source = read_curves(root, rev, params)
    return {
        "kind": kind,
        "name": row.get("name") or (rev if kind == "workspace" else rev[:7]),
        "rev": rev,
        "baseline": baseline,
        "timestamp": data.get("timestamp"),
        "params": {key: _dotted(params, key) for key in PARAM_KEYS},
        "success_rate": success,
        "train": train,
        "curves": curves,
        "curves_source": source,
    }


def collect(root: Path, all_commits: bool = False) -> dict[str, Any]:
    """Every experiment/commit with metrics, sorted (kind, timestamp, name, rev)."""
    root = Path(root).resolve()
    entries = [
        entry
        for row, kind, baseline in iter_rows(dvc_exp_show(root, all_commits))
        if (entry := parse_row(root, row, kind, baseline)) is not None
    ]
    entries.sort(key=lambda e: (KIND_ORDER[e["kind"]], e["timestamp"] or "", e["name"], e["rev"]))
    return {"schema_version": SCHEMA_VERSION, "source": "dvc exp show --json", "experiments": entries}


def default_output(root: Path) -> Path:
    """``<paths.metrics>/experiments.json`` per the root's params.yaml (``metrics/`` without one)."""
    params = root / "params.yaml"
    metrics_dir = "metrics"
    if params.exists():
        metrics_dir = _dotted(yaml.safe_load(params.read_text(encoding="utf-8")) or {}, "paths.metrics") or metrics_dir
    return root / metrics_dir / OUTPUT_NAME


def main(argv: list[str] | None = None) -> int:
    """``python -m envace.reporting.experiments collect [--root DIR] [--out FILE] [--all-commits]``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m envace.reporting.experiments", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("collect", help="write experiments.json from `dvc exp show --json`")
    cmd.add_argument("--root", type=Path, default=Path.cwd(), help="the DVC repo (default: cwd)")
    cmd.add_argument("--out", type=Path, default=None, help="default: <paths.metrics>/experiments.json")
    cmd.add_argument("--all-commits", action="store_true", help="experiments of every commit, not only HEAD's")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        doc = collect(root, all_commits=args.all_commits)
    except CollectError as exc:
        logger.error("%s", exc)
        return 2
    out = write_json(args.out or default_output(root), doc)
    names = [f"{e['name']} ({e['params']['algo.name']}, {e['params']['model.name']})" for e in doc["experiments"]]
    logger.info("wrote %s: %d entries: %s", out, len(names), ", ".join(names) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
