"""Does the mean GRPO gradient point anywhere useful? One large-batch step from the start, then validation.

Usage (in a run directory of ``python -m envace.stages.organism_calibration gate``; gradients saved by
``scripts/organism_gradient_noise.py --grads FILE`` at that run's start):

    python scripts/organism_gradient_step.py --run data/organism/runs/NAME --grads a.pt [b.pt ...] \\
        --sizes 0 3e-4 1e-3 3e-3 [--direction adam] [--controls flipped negative random] [--split val] --out step.json

The saved step gradients g_1..g_S (each one GRPO step of P prompts x K samples, recorded and not applied)
are averaged: their mean is one update of S x P x K trajectories, as a large-batch run would take, and the
noise probe says how much of it is signal. The direction d is that mean (``--direction mean``) or Adam's
step with moments from all S steps, mean(g) / sqrt(mean(g^2)) per parameter (``adam``), normalised to a
root-mean-square of 1 per parameter, and the start moves by ``size`` along it: theta' = theta - size * d
(``size`` is the RMS change of a parameter). Each moved policy is evaluated greedily on the run's
``--split`` tasks in the real environment by the ordinary evaluation stage (``science sft_eval``, without the
base comparison), exactly as the gate evaluates; size 0 re-evaluates the start (it must match the gate's SFT
row). Controls at every size (seeded): ``flipped`` (the default), d with random signs, the same change per
parameter in a random direction, which shows what a step of that shape does by itself; ``random``, a Gaussian
direction of the same RMS; ``negative``, -d, which a real signal makes worse.

Writes one row per (direction, size): successes, n, a 95% Wilson interval, success per domain; and prints
a table. Selecting the best size on the same split that reports it flatters it: confirm a chosen size on
the other split (``--split test``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.reporting.gradient_noise import update_direction  # noqa: E402
from envace.reporting.provenance import head_state  # noqa: E402
from envace.stages.organism_calibration import outcome, stage_env  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def step_direction(files: list[Path], kind: str) -> tuple[torch.Tensor, int]:
    """``update_direction`` of the saved step gradients in ``files`` (each a steps x parameters stack) and how
    many steps it averages."""
    steps = torch.cat([torch.load(f) for f in files])
    try:
        return update_direction(steps, kind), int(steps.shape[0])
    except ValueError as exc:
        raise SystemExit(f"--grads {' '.join(map(str, files))}: {exc}") from None


def moved_policy(start: Path, direction: torch.Tensor | None, size: float, out: Path) -> Path:
    """A checkpoint folder (manifest + ``policy``) of the start moved by ``-size * direction``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    params = [p for p in model.parameters() if p.requires_grad]  # the optimiser's order (trainer.make_optimizer)
    if direction is not None:
        flat = parameters_to_vector(params)
        if flat.numel() != direction.numel():
            raise SystemExit(
                f"the gradients have {direction.numel():,} entries, the start {start} has "
                f"{flat.numel():,} trainable parameters: they were recorded at another model"
            )
        with torch.no_grad():
            vector_to_parameters(flat - size * direction, params)
    policy = out / "policy"
    model.save_pretrained(policy)
    for name in TOKENIZER_FILES:
        if (start / name).exists():
            shutil.copy(start / name, policy / name)
    (out / "manifest.json").write_text(json.dumps({"roles": {"act": "policy", "rehearse": "policy"}}))
    return out


def evaluate(run: Path, checkpoints: Path, split: str, work: Path, log: Path) -> dict[str, Any]:
    """The ordinary greedy evaluation of the checkpoint on ``split``, as the gate runs it; its outcome."""
    metrics = work / "metrics"
    args = [
        "sft_eval",
        f"eval.split={split}",
        "eval.compare_base=false",
        "eval.fidelity=false",
        "eval.gold_fidelity_tasks=0",
        f"paths.checkpoints={checkpoints}",
        f"paths.evaluation={work / 'evaluation'}",
        f"paths.metrics={metrics}",
        f"paths.plots={metrics}",
    ]
    with log.open("a") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "envace.stages.science", *args], cwd=run, env=stage_env(), stdout=out, stderr=out
        )
    if proc.returncode:
        raise SystemExit(f"evaluation failed in {run} (exit {proc.returncode}); see {log}")
    return outcome(metrics)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a gate run directory (data/organism/runs/NAME)")
    parser.add_argument("--grads", type=Path, nargs="+", required=True, help="saved step gradients (torch.save)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.0, 3e-4, 1e-3, 3e-3])
    parser.add_argument("--direction", default="mean", choices=["mean", "adam"])
    parser.add_argument("--controls", nargs="*", default=["flipped"], choices=["flipped", "random", "negative"])
    parser.add_argument("--split", default="val", choices=["val", "test"])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random control direction")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import yaml

    run = args.run.resolve()
    params = yaml.safe_load((run / "params.yaml").read_text())
    # the start every grpo cell of the run trains from (science.part_overrides), where the probe recorded
    start = run / params["science"]["dir"] / "sft" / "final" / "policy"
    if not (start / "config.json").is_file():
        raise SystemExit(f"--run {run}: no SFT start at {start}; run its `organism_calibration sft` part first")
    chosen, steps = step_direction([g.resolve() for g in args.grads], args.direction)
    generator = torch.Generator().manual_seed(args.seed)
    directions = {args.direction: chosen}
    if "negative" in args.controls:
        directions["negative"] = -chosen
    if "flipped" in args.controls:  # the same magnitude per parameter, random signs
        signs = torch.randint(0, 2, (chosen.numel(),), generator=generator).float() * 2 - 1
        directions["flipped"] = chosen * signs
    if "random" in args.controls:
        directions["random"] = torch.randn(chosen.numel(), generator=generator)
    commit, dirty = head_state(ROOT)
    out = args.out.resolve()
    log = out.with_suffix(".log")
    rows = []
    for name, direction in directions.items():
        for size in args.sizes:
            if size == 0 and name != args.direction:
                continue  # one evaluation of the start is enough
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="gradient-step-", dir=run) as tmp:
                work = Path(tmp)
                checkpoints = moved_policy(start, None if size == 0 else direction, size, work / "checkpoints")
                result = evaluate(run, checkpoints, args.split, work, log)
            row = {"direction": name, "size": size, **result, "seconds": round(time.perf_counter() - started, 1)}
            rows.append(row)
            print(
                f"{name:8s} size {size:<8g} success {result['successes']}/{result['n']} = {result['success']:.3f} "
                f"[{result['ci95'][0]:.3f}, {result['ci95'][1]:.3f}]  {result['by_domain']}",
                flush=True,
            )
            out.write_text(
                json.dumps(
                    {
                        "commit": commit[:7] + ("+dirty" if dirty else ""),
                        "run": str(run),
                        "start": str(start),
                        "grads": [str(g) for g in args.grads],
                        "steps_averaged": steps,
                        "direction": args.direction,
                        "split": args.split,
                        "seed": args.seed,
                        "rows": rows,
                    },
                    indent=1,
                )
                + "\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
