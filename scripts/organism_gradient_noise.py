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
- the noise scale B_noise = s2 / |G|^2, in units of one step's batch (P prompts x K samples): the mean of b
  steps' gradients has b = B_noise where half of its expected squared length is signal (McCandlish et al.
  2018, "An Empirical Model of Large-Batch Training"); far below it, Adam's steps (whose size does not
  shrink with the signal) are mostly a random walk. With no detectable signal there is no point estimate,
  but a one-sided 95% lower bound from a jackknife over steps, widened for the prompts being drawn without
  replacement within an epoch (envace.reporting.gradient_noise);
- the measured cosine between the means of two disjoint sets of m steps, for m = 1, 2, 4, ..., which the
  estimates predict as |G|^2 / (|G|^2 + s2 / m).

``--domain D`` draws every step's prompts from one tool-world domain's training tasks only (how much a
narrower task distribution shares). ``--fixed-prompts N`` is a control: every step draws the same N prompts
(only fresh samples), so the mean gradient includes what is specific to those prompts, which updates can fit
(the fixed-prompt reward does rise). ``--sft`` is a reference: the gold-target (SFT) gradient at the same
start, over the first ``--steps`` optimiser steps of an SFT epoch (a batch is ``train.sft_batch_streams`` gold
streams).

Every gradient is kept in memory as one float32 vector per step (steps x parameters x 4 bytes): meant for
the organism (1.5M parameters), not for SmolLM2.

Prints a table and writes it as JSON to ``--out`` (default: gradient_noise.json in the run directory).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from envace.reporting.gradient_noise import noise_scale


def restricted_prompts(prompts: Path, scratch: Path, keep: list[str]) -> Path:
    """A prompts folder like ``prompts`` whose kept training task ids are only ``keep`` (symlinks to the rest)."""
    out = scratch / "prompts"
    out.mkdir()
    for item in prompts.iterdir():
        if item.name != "kept_uuids.json":
            (out / item.name).symlink_to(item.resolve())
    kept = json.loads((prompts / "kept_uuids.json").read_text())
    kept["train"] = keep
    (out / "kept_uuids.json").write_text(json.dumps(kept))
    return out


def domain_tasks(prepared: Path, domain: str) -> set[str]:
    """The training task ids of one tool-world domain (from the prepared rows' ``toolworld.domain``)."""
    ids = set()
    with (prepared / "train.jsonl").open() as rows:
        for line in rows:
            row = json.loads(line)
            if (row.get("toolworld") or {}).get("domain") == domain:
                ids.add(row["uuid"])
    return ids


SETTING_KEYS = (
    "prompts_per_step",
    "samples_per_prompt",
    "judge",
    "argument_credit",
    "fixed_prompts",
    "domain",
    "gradient",
    "sft_batch_rows",
    "train_rows",
)


def pooled(outputs: list[Path], parser: argparse.ArgumentParser) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """The step gradients saved by earlier runs (``--grads``), named by their JSON outputs: they must agree on
    the setting (batch, reward, prompts, gradient kind, start model, overrides other than the seed) and have
    different seeds, so that they are independent draws of one policy's step gradient."""
    records = [json.loads(path.read_text()) for path in outputs]

    def setting_of(record: dict[str, Any]) -> dict[str, Any]:
        kept = [o for o in record.get("overrides", []) if not o.startswith("seed=")]
        return {**{k: record.get(k) for k in SETTING_KEYS}, "model": record.get("model"), "overrides": kept}

    first = setting_of(records[0])
    for path, record in zip(outputs, records):
        if setting_of(record) != first:
            parser.error(f"--pool {path}: its setting differs from {outputs[0]}'s: {setting_of(record)} vs {first}")
        if not record.get("grads_file") or record.get("seed") is None:
            parser.error(f"--pool {path}: no saved gradients or seed recorded; re-run it with --grads FILE")
    seeds = [record["seed"] for record in records]
    if len(set(seeds)) != len(seeds):
        parser.error(f"--pool: seeds {seeds} repeat; the same seed draws the same prompts and samples again")
    grads = [g for record in records for g in torch.load(record["grads_file"])]
    setting = {**first, "pooled": [str(p) for p in outputs], "seeds": seeds}
    setting["seconds"] = round(sum(r["seconds"] for r in records), 1)
    return grads, {**setting, "parameters": int(grads[0].numel()), "steps": len(grads)}


class _Enough(Exception):
    """Raised by the recorder once an SFT probe has its steps (the warm-up would go on for an epoch)."""


def step_gradients(
    run: Path, steps: int, overrides: list[str], fixed: int = 0, sft: bool = False, domain: str | None = None
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Run ``steps`` training steps of the run's grpo cell from its start, recording and not applying each
    step's gradient (``fixed`` > 0: on only the first ``fixed`` training prompts; ``domain``: on only that
    domain's training tasks; ``sft``: the first ``steps`` optimiser steps of one SFT epoch on gold targets
    instead, from the same start)."""
    from envace.config.load import load_params, typed_config
    from envace.reporting.provenance import head_state
    from envace.stages import science, train
    from envace.stages.train_setup import config_hash

    os.chdir(run)
    base = load_params(Path("params.yaml"), [])
    cell = science.part_overrides(base, "cell", "grpo", 0)[0]
    scratch = Path(tempfile.mkdtemp(prefix="gradient-noise-", dir="."))
    probe = [
        *cell,
        f"train.steps={0 if sft else steps}",
        *(["train.sft_epochs=1"] if sft else []),
        "train.val_every=0",
        "train.fidelity_every=0",
        "algo.mini_batches=1",
        "algo.ppo_epochs=1",
        # never resume: a checkpoint of the same config (a killed probe, or a gate cell's) would start elsewhere
        "train.resume=false",
        "train.checkpoint_every=0",
        f"paths.checkpoints={scratch}/checkpoints",
        f"paths.metrics={scratch}",
        f"paths.plots={scratch}",
        *overrides,
    ]
    cfg = typed_config(load_params(Path("params.yaml"), probe))
    if fixed or domain:
        kept = json.loads((Path(cfg.paths.prompts) / "kept_uuids.json").read_text())["train"]
        if domain:
            own = domain_tasks(Path(cfg.paths.prepared), domain)
            kept = [task for task in kept if task in own]
            if not kept:
                raise ValueError(f"--domain {domain}: no training task of that domain in {cfg.paths.prepared}")
        if fixed:
            if fixed != cfg.rollout.prompts_per_step:  # more prompts than a step takes: steps of an epoch split them
                raise ValueError(
                    f"--fixed-prompts {fixed}: must equal rollout.prompts_per_step ({cfg.rollout.prompts_per_step})"
                )
            kept = kept[:fixed]
        probe.append(f"paths.prompts={restricted_prompts(Path(cfg.paths.prompts), scratch, kept)}")
        cfg = typed_config(load_params(Path("params.yaml"), probe))
    train_rows = len(train.training_rows(cfg))  # the finite set an epoch draws its prompts from
    grads: list[torch.Tensor] = []
    original = torch.optim.AdamW.step

    def record_instead(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        # the gradient the optimiser would apply (after clipping); the parameters stay the start's
        params = [p for group in self.param_groups for p in group["params"]]
        flat = [torch.zeros(p.numel(), device=p.device) if p.grad is None else p.grad.flatten() for p in params]
        grads.append(torch.cat(flat).float().cpu())
        if sft and len(grads) >= steps:
            raise _Enough

    torch.optim.AdamW.step = record_instead  # type: ignore[method-assign]
    started = time.perf_counter()
    try:
        train.run(cfg)
    except _Enough:
        pass
    finally:
        torch.optim.AdamW.step = original  # type: ignore[method-assign]
        shutil.rmtree(train.WORK_ROOT / config_hash(cfg), ignore_errors=True)  # (an SFT probe stops before it)
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - started
    commit, dirty = head_state(Path(__file__).resolve().parents[1])
    setting = {
        "commit": commit[:7] + ("+dirty" if dirty else ""),  # the code under envace/, conf/, ... (not scripts/)
        "run": str(run),
        "seed": int(cfg.seed),
        "model": str(cfg.model.path),
        "steps": len(grads),
        "prompts_per_step": cfg.rollout.prompts_per_step,
        "samples_per_prompt": cfg.rollout.samples_per_prompt,
        "judge": cfg.judge.name,
        "argument_credit": float(cfg.judge.argument_credit),
        "overrides": overrides,
        "fixed_prompts": fixed,
        "domain": domain,
        "train_rows": train_rows,
        "gradient": "sft" if sft else "grpo",
        "sft_batch_rows": cfg.train.sft_batch_streams if sft else None,
        "seconds": round(seconds, 1),
        "parameters": int(grads[0].numel()) if grads else 0,
    }
    return grads, setting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="a gate run directory (data/organism/runs/NAME)")
    parser.add_argument("--steps", type=int, default=24, help="steps to record (default 24; at least 4)")
    parser.add_argument(
        "--fixed-prompts", type=int, default=0, help="train on only the first N prompts (the control; default: all)"
    )
    parser.add_argument("--domain", default=None, help="train on only this tool-world domain's tasks (e.g. bank)")
    parser.add_argument("--sft", action="store_true", help="SFT gradients on gold targets instead (the reference)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output (default: RUN/gradient_noise.json)")
    parser.add_argument("--grads", type=Path, default=None, help="also save the step gradients (torch.save) here")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=None,
        help="instead of a run: pool the saved gradients of earlier outputs (their JSON files; same setting)",
    )
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.pool:
        if args.out is None or args.run is not None or args.sft or args.fixed_prompts or args.domain or overrides:
            parser.error(
                "--pool: give --out, and no --run, --sft, --fixed-prompts, --domain or overrides (they ran already)"
            )
        grads, setting = pooled(args.pool, parser)
        out = args.out.resolve()
    else:
        if args.run is None or not (args.run / "params.yaml").is_file():
            parser.error(f"--run {args.run}: no params.yaml there; give a directory an organism_calibration gate made")
        if args.steps < 4:
            parser.error(f"--steps {args.steps}: need at least 4 steps to estimate the noise")
        out = (args.out or args.run / "gradient_noise.json").resolve()
        saved = args.grads.resolve() if args.grads is not None else None  # before the run directory is the cwd
        grads, setting = step_gradients(
            args.run.resolve(), args.steps, overrides, args.fixed_prompts, args.sft, args.domain
        )
        if saved is not None:
            torch.save(torch.stack(grads), saved)
            setting["grads_file"] = str(saved)
    sft = setting["gradient"] == "sft"
    per, unit = (setting["sft_batch_rows"], "gold streams") if sft else (setting["prompts_per_step"], "prompts")
    draws = None if setting.get("fixed_prompts") else (int(per), int(setting["train_rows"]))
    result = {**setting, **noise_scale(grads, draws)}
    out.write_text(json.dumps(result, indent=2) + "\n")
    batch = f"{per} {unit}" + ("" if sft else f" x {setting['samples_per_prompt']}")
    scale = result["noise_scale_steps"]
    print(f"{len(grads)} step gradients of {batch} ({setting['parameters']:,} parameters, {setting['seconds']} s)")
    print(f"mean |g|^2 {result['mean_sq_norm']:.3e}  noise s2 {result['noise_var']:.3e}")
    print(f"signal |G|^2 = {result['signal_sq_norm']:.3e} +- {result['signal_se']:.3e} (jackknife SE over steps)")
    if scale is None:
        print("signal not distinguishable from zero: no point estimate of the noise scale")
    else:
        print(f"noise scale: {scale:.1f} steps' worth = {scale * per:.0f} {unit} per update")
    low = result["noise_scale_steps_lower95"]
    if low is not None:
        print(f"noise scale, one-sided 95% lower bound: {low:.1f} steps' worth = {low * per:.0f} {unit} per update")
    print("steps averaged | cosine of two disjoint means: measured  predicted | pairs")
    for row in result["cosines"]:
        print(f"{row['steps_per_mean']:14d} | {row['measured']:+.3f}  {row['predicted']:+.3f} | {row['pairs']}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
