"""The science matrix's runner (the commands of science/dvc.yaml): one part of ``envace.stages.science``, then
what lets the matrix span sittings on different machines, and one progress line.

A costly part's only DVC outputs are its git-tracked metrics (``science.metrics/<part>/``, ``cache: false``);
its bulky by-products (a cell's exported checkpoint and predictions, a sweep's records, under ``science.dir``)
are not outputs, so a fresh clone on another machine finds every finished part up to date and re-runs none of
them (commit each part's files as it lands). A killed cell resumes from its last checkpoint (the train stage's
work directory is keyed by its config hash, ``.envace/train/<hash>``).

The test-time parts need the ``science.testtime_variant`` cells' trained weights. With
``science.publish_policy`` (a small model: the organism's are 5.9 MB) each such cell copies its manifest and
model directories into ``<its metrics>/trained/``, which the test-time parts then read; without it they read
the cell's export, which only the machine that trained it has, and say how to re-create it when it is missing.

Every part adds ``peak_rss_mb`` (the process's peak resident memory) to its ``timing_<part>.json`` and prints
``[science] cell grpo/seed1 done in 11.2 min, peak 812 MiB; test success 0.270 (n=400); cells with results: 7/30``.

    python -m envace.stages.science_matrix cell --variant grpo --seed 1 [key=value ...]
"""

from __future__ import annotations

import logging
import resource
import shutil
import time
from pathlib import Path

from omegaconf import DictConfig

from envace.config.load import PARAMS_FILE, load_params, to_plain
from envace.reporting.science_stats import BASE_REHEARSER_DIR
from envace.stages import science
from envace.stages.common import MANIFEST
from envace.utils.io import read_json, write_json

logger = logging.getLogger(__name__)

TRAINED_DIR = "trained"  # under a cell's metrics directory: its published weights (science.publish_policy)
TESTTIME_PARTS = ("testtime", "testtime_base")


def cell_checkpoints(s: DictConfig, name: str) -> str:
    """Where cell ``name``'s train stage exports its checkpoint (a by-product, not a DVC output)."""
    return f"{s.dir}/cells/{name}/checkpoints"


def trained_checkpoints(s: DictConfig, name: str) -> str:
    """The checkpoint directory the test-time parts read cell ``name``'s trained weights from: the published
    copy in its metrics (``science.publish_policy``) when it is there, else the cell's export."""
    published = f"{s.metrics}/cells/{name}/{TRAINED_DIR}"
    return published if (Path(published) / MANIFEST).is_file() else cell_checkpoints(s, name)


def require_trained(checkpoints: str, name: str, metrics: str) -> None:
    """Refuse a test-time part whose cell's trained weights are not on this machine, saying how to get them."""
    if not (Path(checkpoints) / MANIFEST).is_file():
        raise FileNotFoundError(
            f"science: cell {name} has no trained weights on this machine (neither {metrics}/cells/{name}/"
            f"{TRAINED_DIR}/ nor {checkpoints}/ holds a {MANIFEST}): it was trained elsewhere without "
            "science.publish_policy. Re-run it here (dvc repro --force --single-item "
            "science/dvc.yaml:cell@<its index>; `dvc stage list science/dvc.yaml` names it), then this part"
        )


def publish_trained(checkpoints: Path, out: Path) -> list[str]:
    """Copy the exported checkpoint's manifest and the model directories its roles (and SFT baseline) name,
    not the optimiser state, from ``checkpoints`` into ``out`` (replaced); the files, relative to ``out``."""
    manifest = read_json(checkpoints / MANIFEST)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copy2(checkpoints / MANIFEST, out / MANIFEST)
    for rel in sorted({*manifest["roles"].values(), *manifest.get("baseline", {}).values()}):
        shutil.copytree(checkpoints / rel, out / rel)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def metrics_dir(s: DictConfig, part: str, name: str | None) -> Path | None:
    """Where ``part`` writes its metrics and ``timing_<part>.json`` (None: the aggregate writes none)."""
    by_part = {
        "data": "data",
        "sft": "sft",
        "sft_eval": "sft",
        "cell": f"cells/{name}",
        "testtime": f"testtime/{name}",
        "testtime_base": f"{BASE_REHEARSER_DIR}/testtime/{name}",
    }
    return Path(s.metrics) / by_part[part] if part in by_part else None


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def progress_line(s: DictConfig, part: str, variant: str | None, seed: int | None, seconds: float, peak: float) -> str:
    """One line per finished part: what finished, its wall time and peak memory, a cell's test success, and
    how many of the matrix's cells have results."""
    label = f"{part} {variant}/seed{seed}" if part in ("cell", *TESTTIME_PARTS) else part
    text = f"[science] {label} done in {seconds / 60:.1f} min, peak {peak:.0f} MiB"
    if part == "cell":
        tasks = Path(s.metrics) / "cells" / science.cell_name(str(variant), int(seed or 0)) / "tasks.json"
        rows = read_json(tasks).get("policy", []) if tasks.is_file() else []
        if rows:
            text += f"; test success {sum(bool(r['success']) for r in rows) / len(rows):.3f} (n={len(rows)})"
    expected = [science.cell_name(v, k) for v in to_plain(s.variants) for k in to_plain(s.seeds)]
    done = sum((Path(s.metrics) / "cells" / name / "tasks.json").is_file() for name in expected)
    return f"{text}; cells with results: {done}/{len(expected)}"


def run(part: str, variant: str | None, seed: int | None, extra: list[str]) -> str:
    """Run ``part`` (``envace.stages.science.run_part``) with what it needs from earlier sittings, then record
    its peak memory, publish a testtime_variant cell's weights, and return the progress line."""
    s = load_params(PARAMS_FILE, extra).science
    if part in TESTTIME_PARTS:
        seed = int(to_plain(s.seeds)[0]) if seed is None else seed
        variant = variant or str(s.testtime_variant)
        name = science.cell_name(variant, seed)
        checkpoints = trained_checkpoints(s, name)
        require_trained(checkpoints, name, str(s.metrics))
        extra = [*extra, f"paths.checkpoints={checkpoints}"]  # after the part's own overrides: this one wins
    started = time.perf_counter()
    science.run_part(part, variant, seed, extra)
    seconds = time.perf_counter() - started
    name = science.cell_name(variant, seed) if variant is not None and seed is not None else None
    if part == "cell" and bool(s.publish_policy) and variant == s.testtime_variant:
        assert name is not None
        files = publish_trained(Path(cell_checkpoints(s, name)), Path(s.metrics) / "cells" / name / TRAINED_DIR)
        logger.info(
            "science cell %s: published its trained weights (%d files) for the test-time parts", name, len(files)
        )
    peak = peak_rss_mb()
    out = metrics_dir(s, part, name)
    timing = out / f"timing_{part}.json" if out is not None else None
    if timing is not None and timing.is_file():
        write_json(timing, {**read_json(timing), "peak_rss_mb": peak})
    return progress_line(s, part, variant, seed, seconds, peak)


def main(argv: list[str] | None = None) -> int:
    return science.cli("python -m envace.stages.science_matrix", __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
