#!/usr/bin/env python
"""Benchmark: one cpu-profile-shaped GRPO step, today's path vs the new defaults, on identical work.

The workload is the cpu profile's: the real tool world (train split), ``--prompts`` prompts × K=
``--samples`` rollouts per step, ACT ≤ 96 and REHEARSE ≤ 64 tokens per output, ≤ 3 steps per turn,
3,072-token streams, envace (both roles trained, one shared policy). To make both paths do exactly
the same work, the parent process first samples every step's rollout once: even samples
replay the gold trajectory, odd samples are the model's own free samples (so groups have reward
variance and realistic lengths); each path then *forces* those tokens (``DecodeGuide``), so it runs
the same forwards over the same streams and scores, packs and trains on the same rows.
With K=4, samples 0 and 2 both replay the gold trajectory, so each prompt's group holds two identical
samples, which the new path's packing encodes once; ``--gold-samples first`` replays gold on sample 0 only
(no identical samples by construction: the cpu pipeline's own rollouts held none in 40).

Paths, each in its own child process (so ``peak_rss_mb`` is that path's own ``ru_maxrss``):
- ``old``: fp32, no prefix sharing (right-padded rows, 4 per micro-batch, logits at the union of
  positions), an extra no-grad forward before the update (today's recompute/health check), no
  gradient checkpointing, glibc's malloc, torch's own float32 GEMM (MKL), and each sample's rollout row
  holding its own copy of the prompt's keys/values;
- ``new``: the engine defaults (precision auto, fp32_linear auto, shared-prefix packing, old log-probs
  from the update's own forward, checkpointing auto, LM head at trained positions only, one copy of a
  prompt's keys/values read by all its samples in the rollout) on the allocator
  a training stage starts on (``ENVACE_ALLOCATOR``, auto: jemalloc where found; ``--allocator`` picks
  another; ``--fp32-linear`` pins the GEMM library);
- ``prompt`` (opt-in, ``--paths old,new,prompt``): ``new`` with one packed segment per row behind the
  shared prefix, as before the packs' tails shared their common starts (``OptimConfig.share_tails``).
Both use the batched sampler (it has no switch). Per-step times come from the engine's own metrics
(``time/rollout``, ``time/update``, ``time/step``); figures are medians over ``--steps`` steps.

    python scripts/bench_step.py --model smollm2 --steps 2
    python scripts/bench_step.py --model tiny --steps 2          # plumbing check, seconds

``--workload PATH`` keeps the sampled workload (or reuses it when the file exists: it must come from
the same ``--model/--steps/--prompts/--samples/--tasks/--seed/--gold-samples``), so that repeated runs
of one path skip the sampling.

``--sft-epochs N`` (N > 0) adds, per path, a child that runs the engine's SFT warm-up alone (the gold
replay, then N epochs over ``--sft-tasks`` train tasks, the cpu profile's 16 by default, 4 rows per
optimiser step) with that path's settings: its ``sft_s`` (replay and epochs) and ``peak_rss_mb``; the
issue's memory target covers SFT as well as the GRPO step.

    python scripts/bench_step.py --model smollm2 --paths new --steps 2 --sft-epochs 1

The last line printed is one JSON object: ``speedup_step``, ``speedup_update``, ``speedup_rollout``,
each path's medians, ``peak_rss_mb``, stream tokens, the precision and allocator it ran on, and the
CPU model; with
``--sft-epochs``, ``sft_<path>`` entries (and ``speedup_sft`` when both paths ran).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from envace.core.prompts import ChatFormatter
from envace.core.records import Role
from envace.data.specs import episode_spec_from_task
from envace.engines.local import LocalEngine, LocalEngineConfig, OptimConfig, RolloutConfig, SFTConfig
from envace.engines.local.engine import step_examples
from envace.engines.local.rollout import ResponseSource, RolloutRunner
from envace.engines.local.sft import gold_targets
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.attention import use_gqa_attention
from envace.runtime.decode import DecodeGuide
from envace.runtime.gemm import FP32_LINEARS
from envace.runtime.precision import cpu_has_bf16, cpu_model, resolve_precision
from envace.utils.malloc import ALLOCATORS, allocator_choice, allocator_env, running_allocator

logger = logging.getLogger("bench_step")

CPU_PROFILE_ROLLOUT = RolloutConfig(
    samples_per_prompt=4, max_steps_per_turn=3, max_act_tokens=96, max_rehearse_tokens=64, max_stream_tokens=3072
)
PATHS = {
    "old": {
        "precision": "fp32",
        "optim": {"share_prefix": False, "micro_batch_streams": 4, "logprob_check": True, "grad_checkpointing": "off"},
        "allocator": "glibc",
        "fp32_linear": "torch",
        "rollout": {"share_prompt_kv": False},
    },
    # None: --allocator (else ENVACE_ALLOCATOR) and --fp32-linear
    "new": {"precision": "auto", "optim": {}, "allocator": None, "fp32_linear": None, "rollout": {}},
    # the new defaults with one packed segment per row behind the shared prefix (no trie over the tails)
    "prompt": {
        "precision": "auto",
        "optim": {"share_tails": False},
        "allocator": None,
        "fp32_linear": None,
        "rollout": {},
    },
}
GOLD_SAMPLES = ("even", "first")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--samples", type=int, default=4, help="K rollouts per prompt")
    p.add_argument("--tasks", type=int, default=8, help="train tasks (the cpu profile's n_train)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--gold-samples",
        choices=GOLD_SAMPLES,
        default="even",
        help="which samples replay the gold trajectory: even (0, 2: two identical samples per prompt) or first",
    )
    p.add_argument("--paths", default="old,new", help=f"comma-separated, of {', '.join(PATHS)}")
    p.add_argument("--sft-epochs", type=int, default=0, help="also time the SFT warm-up per path (0: skip)")
    p.add_argument("--sft-tasks", type=int, default=16, help="train tasks of the SFT warm-up (the cpu profile's)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workload", default=None, help="keep the sampled workload here (reused if the file exists)")
    p.add_argument("--allocator", choices=ALLOCATORS, default=None, help="the new path's (default: ENVACE_ALLOCATOR)")
    p.add_argument("--fp32-linear", choices=FP32_LINEARS, default="auto", help="the new path's engine.fp32_linear")
    p.add_argument("--child-sft", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def rss_mb() -> float:
    """Peak resident memory of this process so far (``ru_maxrss``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_now_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def setup(args: argparse.Namespace):
    torch.set_num_threads(args.threads)
    env = ToolWorldEnv()
    tasks = list(env.tasks("train"))[: args.tasks]
    specs = [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
    return specs, replace(CPU_PROFILE_ROLLOUT, samples_per_prompt=args.samples)


def sample_workload(args: argparse.Namespace, path: Path) -> None:
    """Every step's outputs, sampled once (fp32): gold replays for ``--gold-samples``, free samples for the rest."""
    specs, rollout = setup(args)
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind=args.model))
    use_gqa_attention(model)
    fmt = ChatFormatter(tokenizer)
    gold = {i: gold_targets(s, fmt) for i, s in enumerate(specs)}

    def mixed(key):
        outs = (gold.get(key.example) or {}).get(key.role, [])
        gold_sample = key.sample % 2 == 0 if args.gold_samples == "even" else key.sample == 0
        return outs[key.index] if gold_sample and key.index < len(outs) else None

    runner = RolloutRunner(fmt, rollout, guide=DecodeGuide(mixed), precision=resolve_precision("auto", model=model))
    forced = {}
    for step in range(args.steps):
        idx = step_examples(step, len(specs), args.prompts, args.seed)
        batch = runner.run(
            [specs[i] for i in idx], model, ResponseSource(model=model), seed=args.seed, step=step, examples=idx
        )
        for traj, j in zip(batch.trajectories, range(len(batch.trajectories))):
            counters = {r: 0 for r in Role}
            for role, seg in traj.outputs():
                forced[f"{idx[j // args.samples]}|{traj.sample_index}|{role.name}|{counters[role]}"] = list(
                    seg.token_ids
                )
                counters[role] += 1
    path.write_text(json.dumps(forced))


def path_config(args: argparse.Namespace, rollout: RolloutConfig, **fields) -> LocalEngineConfig:
    """The engine config of path ``args.child`` (its precision and update settings), plus ``fields``."""
    conf = PATHS[args.child]
    return LocalEngineConfig(
        model=ModelSpec(kind=args.model),
        variant="envace",
        seed=args.seed,
        rollout=replace(rollout, **conf["rollout"]),
        optim=OptimConfig(**conf["optim"]),
        precision=conf["precision"],
        fp32_linear=conf["fp32_linear"] or args.fp32_linear,
        progress=False,
        **fields,
    )


def run_sft_child(args: argparse.Namespace) -> dict:
    """The SFT warm-up alone (no GRPO step) with the path's precision and update settings."""
    specs, rollout = setup(argparse.Namespace(**{**vars(args), "tasks": args.sft_tasks}))
    cfg = path_config(args, rollout, steps=0, sft=SFTConfig(epochs=args.sft_epochs))
    before = rss_now_mb()
    t0 = time.perf_counter()
    result = LocalEngine().train(cfg, specs)
    seconds = time.perf_counter() - t0
    last = [h for h in result.history if "sft/loss" in h][-1]
    return {
        "path": args.child,
        "sft_epochs": args.sft_epochs,
        "sft_tasks": len(specs),
        "sft_s": seconds,
        "allocator": running_allocator(),
        "sft_loss_last_epoch": last["sft/loss"],
        "peak_rss_mb": rss_mb(),
        "rss_before_train_mb": before,
    }


def run_child(args: argparse.Namespace) -> dict:
    specs, rollout = setup(args)
    forced = json.loads(Path(args.workload).read_text())
    guide = DecodeGuide(lambda k: forced.get(f"{k.example}|{k.sample}|{k.role.name}|{k.index}"))
    cfg = path_config(args, rollout, steps=args.steps, prompts_per_step=args.prompts)
    before = rss_now_mb()
    engine = LocalEngine(guide=guide)
    result = engine.train(cfg, specs)
    hist = [h for h in result.history if "time/step" in h]
    med = lambda key: statistics.median(h[key] for h in hist)
    return {
        "path": args.child,
        "precision": "bf16" if hist[0].get("engine/bf16") else "fp32",  # what the engine resolved
        "onednn_linear": engine.fp32_linear == "onednn" and engine.precision == "fp32",  # what it resolved
        "allocator": running_allocator(),
        "malloc_conf": os.environ.get("MALLOC_CONF"),
        "step_s": med("time/step"),
        "update_s": med("time/update"),
        "rollout_s": med("time/rollout"),
        "steps_s": [h["time/step"] for h in hist],
        "stream_tokens": med("update/stream_tokens"),
        "encoded_tokens": med("update/encoded_tokens"),  # what the update's forwards encode (packs: shared once)
        "update_tokens_per_s": med("update/tokens_per_s"),
        "reward_mean": med("reward/mean") if "reward/mean" in hist[0] else None,
        "peak_rss_mb": rss_mb(),
        "rss_before_train_mb": before,
    }


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.child:
        print(json.dumps(run_sft_child(args) if args.child_sft else run_child(args)))
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        workload = Path(args.workload or Path(tmp) / "workload.json")
        if workload.is_file():
            logger.info("reusing the workload in %s", workload)
        else:
            logger.info("sampling the workload once (%d steps)", args.steps)
            sample_workload(args, workload)
        paths = args.paths.split(",")
        children = [(n, False) for n in paths] + ([(n, True) for n in paths] if args.sft_epochs > 0 else [])
        for name, sft in children:
            logger.info("path %s%s ...", name, " (SFT warm-up)" if sft else "")
            cmd = [
                sys.executable,
                __file__,
                "--child",
                name,
                "--workload",
                str(workload),
                "--model",
                args.model,
                "--steps",
                str(args.steps),
                "--prompts",
                str(args.prompts),
                "--samples",
                str(args.samples),
                "--tasks",
                str(args.tasks),
                "--threads",
                str(args.threads),
                "--seed",
                str(args.seed),
                "--sft-epochs",
                str(args.sft_epochs),
                "--sft-tasks",
                str(args.sft_tasks),
                "--fp32-linear",
                args.fp32_linear,
            ] + (["--child-sft"] if sft else [])
            allocator = PATHS[name]["allocator"] or args.allocator or allocator_choice()
            env = allocator_env(allocator, {**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            env["MKL_NUM_THREADS"] = str(args.threads)
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            key = f"sft_{name}" if sft else name
            results[key] = json.loads(out.stdout.strip().splitlines()[-1])
            logger.info("%s: %s", key, results[key])
    summary = {
        "model": args.model,
        "steps": args.steps,
        "threads": args.threads,
        "gold_samples": args.gold_samples,
        "cpu": cpu_model(),
        "cpu_bf16": cpu_has_bf16(),
        **{f"{k}": v for k, v in results.items()},
    }
    if {"old", "new"} <= set(results):
        old, new = results["old"], results["new"]
        if old["stream_tokens"] != new["stream_tokens"]:
            raise SystemExit(
                f"paths trained on different streams ({old['stream_tokens']} vs {new['stream_tokens']} "
                "tokens): the comparison is invalid"
            )
        summary.update(
            {
                "speedup_step": old["step_s"] / new["step_s"],
                "speedup_update": old["update_s"] / new["update_s"],
                "speedup_rollout": old["rollout_s"] / new["rollout_s"],
            }
        )
    if {"sft_old", "sft_new"} <= set(results):
        summary["speedup_sft"] = results["sft_old"]["sft_s"] / results["sft_new"]["sft_s"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
