"""How much of one GRPO step's gradient is signal: the gradient noise scale of a policy, in prompts per step.

Usage (in a run directory of ``python -m envace.stages.organism_calibration gate``, whose params.yaml, prepared
data and exported start it reuses; extra arguments are config overrides for the training stage):

    python scripts/organism_gradient_noise.py --run data/organism/runs/NAME --steps 24 [--out FILE] \\
        [judge.argument_credit=0.5 ...]

It runs the ordinary training stage of the run's grpo cell (seed 0) for ``--steps`` steps, with one optimiser
step per rollout, but records each step's gradient (after clipping, as the optimiser would see it) instead of
applying it: the policy stays the start, so the step gradients g_1..g_S are independent draws (fresh prompts,
fresh samples) of one random vector with mean G and per-step noise of total variance s2. From them:

- |G|^2 is the mean of g_i . g_j over pairs i != j, and s2 = mean |g_i|^2 - |G|^2;
- the noise scale B_noise = s2 / |G|^2, in units of one step's batch (P prompts x K samples): a batch of
  b steps' worth has expected cosine |G|^2 / (|G|^2 + s2 / b) with the true gradient direction squared, so
  b = B_noise is where half of an update's squared length is signal (McCandlish et al. 2018, "An Empirical
  Model of Large-Batch Training"); far below it, Adam's steps (whose size does not shrink with the signal)
  are mostly a random walk;
- the measured cosine between the means of two disjoint sets of m steps, for m = 1, 2, 4, ..., which the
  estimate above predicts as |G|^2 / (|G|^2 + s2 / m).

``--fixed-prompts N`` is the control: every step draws the same N prompts (only fresh samples), so the
mean gradient includes what is specific to those prompts, which an update can fit (the fixed-prompt reward
does rise); a probe that found no signal there would be broken.

Prints a table and writes it as JSON to ``--out`` (default: gradient_noise.json in the run directory).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from envace.reporting.gradient_noise import noise_scale


def fixed_prompts(prompts: Path, scratch: Path, n: int) -> Path:
    """A prompts folder like ``prompts`` whose kept training rows are only its first ``n`` (every step then
    draws the same ``n`` prompts when the step has ``n``): the control where the signal is not zero."""
    out = scratch / "prompts"
    out.mkdir()
    for item in prompts.iterdir():
        if item.name != "kept_uuids.json":
            (out / item.name).symlink_to(item.resolve())
    kept = json.loads((prompts / "kept_uuids.json").read_text())
    kept["train"] = kept["train"][:n]
    (out / "kept_uuids.json").write_text(json.dumps(kept))
    return out


def step_gradients(
    run: Path, steps: int, overrides: list[str], fixed: int = 0
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Run ``steps`` training steps of the run's grpo cell from its start, recording and not applying each
    step's gradient (``fixed`` > 0: on only the first ``fixed`` training prompts)."""
    from envace.config.load import load_params, typed_config
    from envace.engines.local import trainer
    from envace.stages import science, train

    os.chdir(run)
    base = load_params(Path("params.yaml"), [])
    cell = science.part_overrides(base, "cell", "grpo", 0)[0]
    scratch = Path(tempfile.mkdtemp(prefix="gradient-noise-", dir="."))
    probe = [
        *cell,
        f"train.steps={steps}",
        "train.val_every=0",
        "train.fidelity_every=0",
        "algo.mini_batches=1",
        "algo.ppo_epochs=1",
        f"paths.checkpoints={scratch}/checkpoints",
        f"paths.metrics={scratch}",
        f"paths.plots={scratch}",
        *overrides,
    ]
    if fixed:
        prompts = Path(str(load_params(Path("params.yaml"), probe).paths.prompts))
        probe.append(f"paths.prompts={fixed_prompts(prompts, scratch, fixed)}")
    cfg = typed_config(load_params(Path("params.yaml"), probe))
    grads: list[torch.Tensor] = []
    original = trainer.PolicyUpdater._optimizer_step

    def record_instead(self: Any, rows: Any, stats: Any) -> None:
        params = [p for p in self.slot.model.parameters() if p.requires_grad]

        def capture() -> None:
            grads.append(
                torch.cat(
                    [torch.zeros(p.numel()) if p.grad is None else p.grad.detach().flatten().float() for p in params]
                )
            )

        self.slot.optimizer.step = capture  # the instance attribute shadows AdamW.step for this updater only
        original(self, rows, stats)

    trainer.PolicyUpdater._optimizer_step = record_instead
    started = time.perf_counter()
    try:
        train.run(cfg)
    finally:
        trainer.PolicyUpdater._optimizer_step = original
    seconds = time.perf_counter() - started
    setting = {
        "run": str(run),
        "steps": steps,
        "prompts_per_step": cfg.rollout.prompts_per_step,
        "samples_per_prompt": cfg.rollout.samples_per_prompt,
        "judge": cfg.judge.name,
        "argument_credit": float(getattr(cfg.judge, "argument_credit", 0.0) or 0.0),
        "overrides": overrides,
        "fixed_prompts": fixed,
        "seconds": round(seconds, 1),
        "parameters": int(grads[0].numel()) if grads else 0,
    }
    return grads, setting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a gate run directory (data/organism/runs/NAME)")
    parser.add_argument("--steps", type=int, default=24, help="steps to record (default 24; at least 4)")
    parser.add_argument(
        "--fixed-prompts", type=int, default=0, help="train on only the first N prompts (the control; default: all)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON output (default: RUN/gradient_noise.json)")
    parser.add_argument("--grads", type=Path, default=None, help="also save the step gradients (torch.save) here")
    args, overrides = parser.parse_known_args(argv)
    if args.steps < 4:
        parser.error(f"--steps {args.steps}: need at least 4 steps to estimate the noise")
    if not (args.run / "params.yaml").is_file():
        parser.error(f"--run {args.run}: no params.yaml there; give a directory an organism_calibration gate made")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = (args.out or args.run / "gradient_noise.json").resolve()
    saved = args.grads.resolve() if args.grads is not None else None  # before the run directory becomes the cwd
    grads, setting = step_gradients(args.run.resolve(), args.steps, overrides, args.fixed_prompts)
    if saved is not None:
        torch.save(torch.stack(grads), saved)
    result = {**setting, **noise_scale(grads)}
    out.write_text(json.dumps(result, indent=2) + "\n")
    batch = f"{setting['prompts_per_step']} prompts x {setting['samples_per_prompt']}"
    scale = result["noise_scale_steps"]
    print(f"{len(grads)} step gradients of {batch} ({setting['parameters']:,} parameters, {setting['seconds']} s)")
    print(
        f"mean |g|^2 {result['mean_sq_norm']:.3e}  signal |G|^2 {result['signal_sq_norm']:.3e}  "
        f"noise {result['noise_var']:.3e}"
    )
    per = setting["prompts_per_step"]
    print(f"signal |G|^2 = {result['signal_sq_norm']:.3e} +- {result['signal_se']:.3e} (jackknife SE over steps)")
    if scale is None:
        print("signal not distinguishable from zero: no point estimate of the noise scale")
    else:
        print(f"noise scale: {scale:.1f} steps' worth = {scale * per:.0f} prompts per update")
    low = result["noise_scale_steps_lower95"]
    if low is not None:
        print(f"noise scale, 95% lower bound: {low:.1f} steps' worth = {low * per:.0f} prompts per update")
    print("steps averaged | cosine of two disjoint means: measured  predicted | pairs")
    for row in result["cosines"]:
        print(f"{row['steps_per_mean']:14d} | {row['measured']:+.3f}  {row['predicted']:+.3f} | {row['pairs']}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
