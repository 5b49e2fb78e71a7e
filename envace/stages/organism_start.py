"""The organism's SFT start, built by the pipeline: ``science/organism/dvc.yaml:start``.

Every organism run trains from this start (``profile=organism`` names it as ``model.path``): the random-init
organism (``data/organism/toolworld_lm``, the ``build`` stage) after the SFT warm-up that
``science/organism/organism.yaml`` ``start.overrides`` describes, on top of ``profile=organism`` (one cosine
schedule over the generated training tasks, with the planted demonstrator flaw of docs/method.md §11).

It runs the ordinary science parts in ``data/organism/runs/<start.run>/`` (as ``organism_calibration sft``
does: ``data``, ``sft``, then the start on the real-environment VALIDATION split), so a killed build resumes
from its last SFT epoch checkpoint. It then copies the start's policy directory (weights, tokenizer, chat
template: what ``save_pretrained`` wrote) into ``start.out``, a git-tracked DVC output (``cache: false``, a
few MB) so the start survives a fresh clone and a new machine, and writes ``start.json`` beside it: the
settings, validation success (overall and per domain, 95% Wilson interval), the SFT loss, wall seconds, the
CPU, the threads and the SHA-256 of the weights.

    python -m envace.stages.organism_start [--params science/organism/organism.yaml]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from envace.runtime.precision import cpu_model
from envace.stages import organism_calibration as cal
from envace.stages.runner import EXIT_USAGE, _failure, configure_logging
from envace.utils.telemetry import telemetry_off

logger = logging.getLogger(__name__)

PARAMS = Path("science/organism/organism.yaml")
REQUIRED = ("run", "out", "record", "overrides")


def settings(params: Path) -> dict[str, Any]:
    """The ``start:`` block of ``params``, checked: every key of ``REQUIRED`` present, overrides ``key=value``."""
    if not params.is_file():
        raise FileNotFoundError(f"organism start: no params file {params}; run from the repository root")
    block = OmegaConf.to_container(OmegaConf.load(params)).get("start")
    if not isinstance(block, dict):
        raise ValueError(f"organism start: {params} has no `start:` mapping; add one with keys {', '.join(REQUIRED)}")
    missing = [key for key in REQUIRED if key not in block]
    if missing:
        raise ValueError(f"organism start: {params} `start:` lacks {', '.join(missing)}")
    bad = [o for o in block["overrides"] if not isinstance(o, str) or "=" not in o]
    if bad:
        raise ValueError(f"organism start: {params} `start.overrides` entries must be key=value strings, not {bad}")
    return block


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def part_seconds(timing: Path) -> float:
    """The seconds a science part's timing file records (the sum over the stages it ran)."""
    return float(sum(json.loads(timing.read_text())["seconds"].values()))


def publish(policy: Path, out: Path) -> list[str]:
    """Copy the policy directory ``policy`` to ``out`` (replacing it); the files copied."""
    if not (policy / "config.json").is_file():
        raise FileNotFoundError(f"organism start: {policy} holds no saved model (config.json); the SFT did not finish")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(policy, out)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def build(params: Path = PARAMS) -> dict[str, Any]:
    block = settings(params)
    overrides = [str(o) for o in block["overrides"]]
    run = cal.prepare(str(block["run"]), overrides)
    metrics = run / cal.METRICS
    wall = {
        "data": cal.part(run, ["data"], metrics / "data", "data"),
        "sft": cal.part(run, ["sft"], metrics / "sft" / "train.json", "sft"),
        "val": cal.part(run, ["sft_eval", *cal.VAL_EVAL], metrics / "sft" / "tasks.json", "sft_eval"),
    }
    # what each part cost when it ran, from its timing file: a build that finds a part already done in the
    # run directory (a resumed or repeated build) reuses it in 0 s and must not record that as its cost
    timings = {"data": metrics / "data" / "timing_data.json", "sft": metrics / "sft" / "timing_sft.json"}
    timings["val"] = metrics / "sft" / "timing_sft_eval.json"
    seconds = {k: part_seconds(path) if path.is_file() else wall[k] for k, path in timings.items()}
    science_dir = OmegaConf.load(run / "params.yaml").science.dir
    out = cal.ROOT / str(block["out"])
    files = publish(run / science_dir / "sft" / "final" / "policy", out)
    weights = [f for f in files if f.endswith(".safetensors")]
    sft_details = json.loads((metrics / "sft" / "train.details.json").read_text())
    record = {
        "out": str(block["out"]),
        "overrides": overrides,
        "val": cal.outcome(metrics / "sft"),
        "sft_loss": cal.sft_loss(metrics / "sft" / "train.json"),
        "sft_flawed_specs": json.loads((metrics / "sft" / "train.json").read_text()).get("final/sft/flawed_specs"),
        "precision": sft_details.get("precision"),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "reused_parts": sorted(k for k, v in wall.items() if v == 0.0),
        "cpu": cpu_model(),
        "files": files,
        "weights_sha256": {f: sha256(out / f) for f in weights},
        "commit": cal.commit(),
    }
    (cal.ROOT / str(block["record"])).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    val = record["val"]
    logger.info(
        "organism start: %d/%d validation tasks (%.1f%%, 95%% CI [%.3f, %.3f]) -> %s",
        val["successes"],
        val["n"],
        100 * val["success"],
        *val["ci95"],
        out,
    )
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envace.stages.organism_start", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--params", type=Path, default=PARAMS, help="the file with the `start:` block")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    telemetry_off()
    configure_logging()
    started = time.perf_counter()
    try:
        build(args.params)
    except (Exception, KeyboardInterrupt) as exc:
        return _failure("organism start", exc)
    logger.info("organism start: built in %.0f s", time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
