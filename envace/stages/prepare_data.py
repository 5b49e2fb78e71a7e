"""Stage ``prepare_data``: raw rows → validated CM2 rows split into train/val, rejects with reasons.

Sources (``data.source``): ``toolworld`` generates the embedded tool world's tasks and exports each as
a CM2-format row (carrying the full task, so later stages can rebuild it); ``cm2`` reads user-supplied
JSON/JSONL files under ``paths.raw_cm2`` and splits the accepted rows by uuid. Every row goes through
``envace.data.cm2`` validation; nothing is dropped silently — rejects are written with their reasons.

Outputs: ``paths.prepared/{train,val}.jsonl``, ``rejects.jsonl``, ``stats.json``;
``paths.plots/prepare_data.png``; ``paths.metrics/prepare_data.json`` (written by the runner).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace.config.load import to_plain
from envace.config.schema import Config
from envace.data.cm2 import dataset_stats, read_cm2_file, reject_counts, split_rows, validate_rows
from envace.envs.toolworld import generate_tasks, to_cm2_row
from envace.reporting.figures import save_figure
from envace.reporting.plots import data_stats_figure
from envace.stages.common import data_seed, toolworld_config
from envace.stages.runner import NULL_TRACKER, Tracker, stage_main
from envace.utils.io import atomic_dir, atomic_path, write_json, write_jsonl

logger = logging.getLogger(__name__)

SPLITS = ("train", "val")


def toolworld_rows(cfg: Config) -> tuple[dict[str, list[Any]], list[Any]]:
    """Rows per split from the tool world generator (its own train/val split); no read rejects."""
    tasks = generate_tasks(toolworld_config(cfg))
    return {split: [to_cm2_row(task, include_state=True) for task in tasks[split]] for split in SPLITS}, []


def cm2_rows(cfg: Config) -> tuple[dict[str, list[Any]], list[Any]]:
    """All rows of every *.json / *.jsonl under paths.raw_cm2 (split later, by uuid)."""
    root = Path(cfg.paths.raw_cm2)
    files = sorted(p for p in root.rglob("*") if p.suffix in (".json", ".jsonl"))
    if not files:
        raise FileNotFoundError(
            f"data.source=cm2 but {root} holds no *.json/*.jsonl; put the CM2 rows there "
            "(see data/raw/cm2/README.md) or use data=toolworld"
        )
    rows: list[Any] = []
    rejects: list[Any] = []
    for path in files:
        got, bad = read_cm2_file(path)
        rows.extend(got)
        rejects.extend(bad)
    return {"all": rows}, rejects


SOURCES: dict[str, Callable[[Config], tuple[dict[str, list[Any]], list[Any]]]] = {
    "toolworld": toolworld_rows,
    "cm2": cm2_rows,
}


def validate_and_split(cfg: Config, raw: dict[str, list[Any]]) -> tuple[dict[str, list[Any]], list[Any]]:
    """Validated rows per split and every reject (CM2 rows are split by uuid after validation)."""
    accepted: dict[str, list[Any]] = {}
    rejects: list[Any] = []
    for split, rows in raw.items():
        # rows read from files carry their file; generated rows are labelled by source and split
        accepted[split], bad = validate_rows(rows, source=f"{cfg.data.source} {split} rows")
        rejects.extend(bad)
    if "all" in accepted:
        train, val = split_rows(accepted.pop("all"), float(cfg.data.val_fraction), data_seed(cfg))
        cap = int(cfg.data.n_train)
        accepted = {"train": list(train[:cap] if cap else train), "val": list(val)}
    return accepted, rejects


def plot_stats(stats: dict[str, Any], path: Path) -> None:
    """Histograms of the training rows' shape statistics (``envace.reporting.plots.data_stats_figure``)."""
    figure = data_stats_figure(stats)
    if isinstance(figure, str):
        logger.warning("prepare_data: %s not drawn: %s", path, figure)
        return
    with atomic_path(path) as tmp:
        save_figure(figure, tmp)


def run(cfg: Config, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    raw, read_rejects = SOURCES[to_plain(cfg.data.source)](cfg)
    splits, rejects = validate_and_split(cfg, raw)
    rejects = read_rejects + rejects
    n_raw = sum(len(rows) for rows in raw.values()) + len(read_rejects)
    counts = reject_counts(rejects)
    stats = {split: dataset_stats(rows).to_json() for split, rows in splits.items()}
    out = Path(cfg.paths.prepared)
    with atomic_dir(out) as tmp:
        write_jsonl(tmp / "rejects.jsonl", (r.to_json() for r in rejects))
        tracker.log_artifact(tmp / "rejects.jsonl", "data")
        if not splits.get("train"):
            raise ValueError(
                f"prepare_data: no training row survived validation ({n_raw} rows, rejects {counts}); "
                "the reasons are in the MLflow artifact data/rejects.jsonl"
            )
        for split, rows in splits.items():
            write_jsonl(tmp / f"{split}.jsonl", rows)
        write_json(tmp / "stats.json", {"splits": stats, "rejects": counts, "n_raw": n_raw})
    plot_path = Path(cfg.paths.plots) / "prepare_data.png"
    plot_stats(stats["train"], plot_path)
    for artifact in (out / "stats.json", plot_path):
        tracker.log_artifact(artifact, "data")
    logger.info(
        "prepare_data: %s accepted, %d rejected %s", {s: len(r) for s, r in splits.items()}, len(rejects), counts
    )
    return {
        "source": to_plain(cfg.data.source),
        "n_raw": n_raw,
        "n_rejected": len(rejects),
        "rejects": counts,
        **{f"n_{split}": len(rows) for split, rows in splits.items()},
        "train_user_turns_mean": stats["train"]["user_turns"]["mean"],
        "train_calls_per_turn_mean": stats["train"]["calls_per_turn"]["mean"],
    }


main = stage_main("prepare_data", run)

if __name__ == "__main__":
    raise SystemExit(main())
