"""BFCL result files (bfcl's own on-disk format) and running ``bfcl evaluate`` on them.

A result file holds one JSON object per line, ``{"id": …, "result": …}``, under
``<result_dir>/<model dir>/<section>/BFCL_v4_<category>_result.json`` (``<section>``: ``non_live``,
``live``, ``multi_turn``, ``agentic/memory/<backend>``). ``result`` is the model output: one string for
single-turn entries, a list (turns) of lists (steps) of strings otherwise. We write each generation in
its canonical form (``convert.canonical_text``: the parsed calls re-rendered in the Hermes format after
the visible text), which bfcl's Hermes/Qwen-FC decoder reads back as exactly the calls we scored.

A crashed task is written the way bfcl's own generation writes a crash (``"Error during inference: …"``);
note that bfcl then counts a crashed *irrelevance* entry as correct, while envace counts every crash as
a failure.

``bfcl_evaluate`` runs the stock ``bfcl evaluate`` CLI in a subprocess (``BFCL_PROJECT_ROOT`` pointed at
a scratch folder) under a stock model name whose decoder reads the Hermes format
(``REFERENCE_MODEL``) and reads back bfcl's per-category scores and section CSVs.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from envace.envs.bfcl.categories import CATEGORIES, SINGLE_TURN_KINDS
from envace.envs.bfcl.convert import canonical_text
from envace.envs.bfcl.scoring import parse_output
from envace.envs.bfcl.upstream import bfcl
from envace.evaluation.records import EpisodeRecord

REFERENCE_MODEL = "Qwen/Qwen3-8B-FC"  # a stock bfcl model whose decoder reads Hermes <tool_call> blocks
_CSV_COLUMNS = {  # our summary key → (bfcl csv file, column)
    "non_live": ("data_non_live.csv", "Non-Live Overall Acc"),
    "live": ("data_live.csv", "Live Overall Acc"),
    "multi_turn": ("data_multi_turn.csv", "Multi Turn Overall Acc"),
    "memory": ("data_agentic.csv", "Memory Summary"),
}


def result_entry(
    entry_id: str, category: str, outputs: Sequence[Sequence[str]] | None, error: str | None = None
) -> dict[str, Any]:
    """One line of a bfcl result file for an episode's raw generations (or its crash)."""
    if outputs is None:
        return {"id": entry_id, "result": f"Error during inference: {error or 'no output'}"}
    if CATEGORIES[category].kind in SINGLE_TURN_KINDS:
        text = outputs[0][0] if outputs and outputs[0] else ""
        return {"id": entry_id, "result": canonical_text(parse_output(text))}
    return {"id": entry_id, "result": [[canonical_text(parse_output(t)) for t in turn] for turn in outputs]}


def model_dir_name(model: str) -> str:
    """bfcl's folder name for a registry model name."""
    return model.replace("/", "_")


def write_result_files(records: Iterable[EpisodeRecord], result_dir: Path, model: str = REFERENCE_MODEL) -> list[Path]:
    """Write bfcl result files for ``records`` (BFCL episodes of this package); returns the files."""
    utils = bfcl().utils
    by_file: dict[Path, list[dict[str, Any]]] = {}
    for record in records:
        category = record.info.get("bfcl_category", record.domain)
        outputs = record.info.get("bfcl_outputs")
        entry = result_entry(record.task_id, category, outputs, record.error)
        folder = Path(result_dir) / model_dir_name(model) / utils.get_directory_structure_by_category(category)
        by_file.setdefault(folder / f"{utils.VERSION_PREFIX}_{category}_result.json", []).append(entry)
    for path, entries in by_file.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(e) for e in sorted(entries, key=utils.sort_key)]
        path.write_text("\n".join(lines) + "\n")
    return sorted(by_file)


def _bfcl_cli() -> list[str]:
    script = Path(sys.executable).with_name("bfcl")
    if script.exists():
        return [str(script)]
    found = shutil.which("bfcl")
    if found is None:
        raise FileNotFoundError("the `bfcl` command of bfcl-eval is not installed next to this Python or on PATH")
    return [found]


def bfcl_evaluate(
    result_dir: Path,
    score_dir: Path,
    categories: Sequence[str],
    model: str = REFERENCE_MODEL,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Run ``bfcl evaluate --partial-eval`` on ``result_dir``; per-category accuracies and section numbers.

    Returns ``{"categories": {cat: {"accuracy", "correct_count", "total_count", "failed_ids"}},
    "sections": {key: float}}``
    (section values as fractions, from bfcl's CSVs, where present and not "N/A").
    """
    env = {**os.environ, "BFCL_PROJECT_ROOT": str(Path(score_dir).parent), "DO_NOT_TRACK": "true"}
    command = [
        *_bfcl_cli(),
        "evaluate",
        "--model",
        model,
        "--test-category",
        ",".join(categories),
        "--result-dir",
        str(Path(result_dir).resolve()),
        "--score-dir",
        str(Path(score_dir).resolve()),
        "--partial-eval",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bfcl evaluate failed ({done.returncode}): {done.stderr[-2000:] or done.stdout[-2000:]}")
    return {"categories": _read_scores(Path(score_dir), model), "sections": _read_sections(Path(score_dir))}


def _read_scores(score_dir: Path, model: str) -> dict[str, dict[str, Any]]:
    utils = bfcl().utils
    scores = {}
    for path in (score_dir / model_dir_name(model)).rglob(f"{utils.VERSION_PREFIX}_*_score.json"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        header = dict(lines[0])
        header["failed_ids"] = [entry["id"] for entry in lines[1:] if "id" in entry]
        scores[utils.extract_test_category(path)] = header
    return scores


def _read_sections(score_dir: Path) -> dict[str, float]:
    sections = {}
    for key, (name, column) in _CSV_COLUMNS.items():
        path = score_dir / name
        if not path.exists():
            continue
        rows = list(csv.DictReader(path.read_text().splitlines()))
        value = rows[0].get(column, "N/A") if rows else "N/A"
        if value not in ("N/A", None):
            sections[key] = float(value.rstrip("%")) / 100
    return sections
