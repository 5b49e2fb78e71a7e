"""Metrics files: what a stage's ``run`` returns, written split in two so that DVC reads numbers only,
and read back whole. The stage harness (``envace.stages.runner``) writes them; reporting reads them.

``metrics/<stage>.json`` holds the stage's headline numbers and booleans (``HEADLINE``), nested by key
as returned (DVC's ``metrics:``: ``dvc metrics show/diff``); ``metrics/<stage>.details.json`` holds
everything else at the same keys (the other numbers, strings, lists such as per-step curves, None; a
DVC ``outs:`` entry with ``cache: false``) and ``produced_by``, the code and CPU that wrote them.
``read_metrics`` merges both back into what ``run`` returned (``merge_metrics``; a round trip).
"""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path
from typing import Any

from envace.reporting.provenance import head_state
from envace.utils.io import read_json, write_json
from envace.utils.machine import cpu_has_bf16, cpu_model

DETAILS_SUFFIX = ".details.json"


PRODUCED_BY = "produced_by"  # details-file key: the commit whose code wrote it (envace.reporting.provenance)


def produced_by(precision: Any = None) -> dict[str, Any]:
    """``{"commit", "code_dirty", "cpu", "cpu_bf16", "precision"}``: the code running now (the report's stale
    check reads it back), the CPU it runs on and the precision the stage resolved (None where it ran no
    model): bf16 numerics differ between instruction sets, so a result names both."""
    commit, dirty = head_state(Path.cwd())
    return {
        "commit": commit,
        "code_dirty": dirty,
        "cpu": cpu_model(),
        "cpu_bf16": cpu_has_bf16(),
        "precision": precision,
    }


def details_path(metrics_path: Path) -> Path:
    """``metrics/<stage>.json`` -> ``metrics/<stage>.details.json`` (the non-numeric part)."""
    path = Path(metrics_path)
    return path.with_name(path.name.removesuffix(".json") + DETAILS_SUFFIX)


def is_metric(value: Any) -> bool:
    """A value DVC shows as a metric: a finite number or a boolean."""
    if isinstance(value, bool):
        return True
    return isinstance(value, (int, float)) and math.isfinite(value)


# The numbers ``dvc metrics show`` lists per stage (glob patterns over the nested key path, one pattern
# segment per level): few, so that the one-row-per-file table of every stage reads on a terminal. A stage
# not named here keeps all its numbers in its metrics file. The other numbers are in the details file,
# at the same keys: ``dvc metrics show/diff --targets metrics/<stage>.details.json`` lists them.
HEADLINE: dict[str, tuple[str, ...]] = {
    "prepare_data": ("n_raw", "n_train", "n_val", "n_rejected"),
    "template_prompts": ("*/rows_kept", "records_filtered"),
    "train": (
        "steps_done",
        "final/reward/mean",
        "final/loss",
        "final/kl",
        "final/fidelity/field_f1",
        "final/tokens_per_s",
    ),
    "evaluate": (
        "n_tasks",
        "success_gain_vs_base",
        "policy.success_rate",
        "base.success_rate",
        "policy.context_overflows",
        "policy.fidelity.field_f1",
    ),
    "rehearsal_sweep": ("cells.*.success_rate",),
}


def headline_for(stage: str) -> tuple[str, ...] | None:
    """The ``HEADLINE`` patterns of a stage id (``evaluate@bfcl`` -> evaluate's), None when it has none."""
    return HEADLINE.get(stage.split("@")[0])


def _matches(path: tuple[str, ...], patterns: tuple[str, ...] | None) -> bool:
    if patterns is None:
        return True
    for pattern in patterns:
        parts = pattern.split(".")
        if len(parts) == len(path) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(path, parts)):
            return True
    return False


def split_metrics(
    metrics: dict[str, Any], headline: tuple[str, ...] | None = None, _path: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(numbers, details)``: every number/boolean at its nested key in ``numbers`` (with ``headline``
    patterns: only those that match one); everything else (strings, lists, None, NaN/inf, empty dicts,
    unmatched numbers) at the same key in ``details``. Sub-dicts holding both appear in both halves, each
    with its own part, so ``merge_metrics(numbers, details) == metrics``."""
    numbers: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for key, value in metrics.items():
        path = (*_path, str(key))
        if isinstance(value, dict) and value:
            sub_numbers, sub_details = split_metrics(value, headline, path)
            if sub_numbers:
                numbers[key] = sub_numbers
            if sub_details:
                details[key] = sub_details
        elif is_metric(value) and _matches(path, headline):
            numbers[key] = value
        else:
            details[key] = value
    return numbers, details


def merge_metrics(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep merge (a new dict): ``extra``'s keys into ``base``, sub-dicts merged key by key."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_metrics(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_metrics(
    metrics_path: Path, metrics: dict[str, Any], headline: tuple[str, ...] | None = None
) -> tuple[Path, Path]:
    """Write the two halves of ``metrics`` (``split_metrics``); returns (numbers path, details path)."""
    numbers, details = split_metrics(metrics, headline)
    details_file = details_path(metrics_path)
    write_json(details_file, {**details, PRODUCED_BY: produced_by(metrics.get("precision"))})
    write_json(metrics_path, numbers)
    return Path(metrics_path), details_file


def read_metrics(metrics_path: Path) -> dict[str, Any]:
    """A stage's metrics as ``run`` returned them: the numbers file merged with its details file (when
    there is one: files written before the split, or by hand, are read as they are)."""
    metrics = read_json(metrics_path)
    details_file = details_path(metrics_path)
    if isinstance(metrics, dict) and details_file.exists():
        details = {k: v for k, v in read_json(details_file).items() if k != PRODUCED_BY}
        metrics = merge_metrics(metrics, details)
    return metrics
