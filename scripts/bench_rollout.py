#!/usr/bin/env python
"""Benchmark: KV-cache-reusing rollouts vs naive full re-encoding, on the same tokens.

Both modes run the same ``RolloutRunner`` on the same tool-world prompts with every output
teacher-forced, so they generate identical streams and do the same logical work:
- ``reuse``: one cache per role and trajectory stream for the whole rollout; each prompt prefilled
  once and expanded to its K samples; only new tokens are ever fed.
- ``naive``: before every generation each stream is re-encoded from scratch (batched, no shared prefill),
  as a stateless generate() call per step would do.
Forced outputs: ``--source gold`` replays the tasks' gold trajectories (multi-turn, both roles);
``--source sampled`` first samples a rollout (with KV reuse) and then forces its outputs in both modes.

Prints per-mode median wall time over ``--repeats`` runs (after one warm-up), fed tokens, forward
passes, generated tokens, and the speed-up (naive / reuse). ``--json PATH`` also writes the numbers.

    python scripts/bench_rollout.py --model tiny
    python scripts/bench_rollout.py --model smollm2 --prompts 2 --samples 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import replace

import torch

from envace.core.prompts import ChatFormatter
from envace.core.records import Role
from envace.data.specs import episode_spec_from_task
from envace.engines.local import ResponseSource, RolloutConfig, RolloutRunner
from envace.engines.local.sft import gold_guide
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.attention import use_gqa_attention
from envace.runtime.decode import DecodeGuide

logger = logging.getLogger("bench_rollout")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--prompts", type=int, default=4, help="tool-world prompts per rollout")
    p.add_argument("--samples", type=int, default=4, help="K rollouts per prompt")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per mode first")
    p.add_argument("--source", choices=["gold", "sampled"], default="gold")
    p.add_argument("--min-turns", type=int, default=2, help="pick tasks with at least this many user turns")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def forced_guide_from(batch, k: int) -> DecodeGuide:
    """Teacher-force the outputs of a recorded rollout (keyed by example, sample, role, index)."""
    outputs: dict[tuple, list[int]] = {}
    for n, traj in enumerate(batch.trajectories):
        counters = {r: 0 for r in Role}
        for role, seg in traj.outputs():
            outputs[(n // k, traj.sample_index, role, counters[role])] = list(seg.token_ids)
            counters[role] += 1
    return DecodeGuide(lambda key: outputs.get((key.example, key.sample, key.role, key.index)), strength=None)


def timed_runs(runner: RolloutRunner, specs, model, repeats: int, warmup: int):
    source = ResponseSource(model=model)
    for _ in range(warmup):
        runner.run(specs, model, source)
    times, batch = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        batch = runner.run(specs, model, source)
        times.append(time.perf_counter() - start)
    return times, batch


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind=args.model))
    use_gqa_attention(model)
    fmt = ChatFormatter(tokenizer)
    env = ToolWorldEnv()
    tasks = [t for t in env.tasks("train") if len(t.user_turns) >= args.min_turns][: args.prompts]
    specs = [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
    cfg = RolloutConfig(
        samples_per_prompt=args.samples,
        max_act_tokens=args.max_new_tokens,
        max_rehearse_tokens=args.max_new_tokens,
        max_steps_per_turn=4,
        max_stream_tokens=8192,
    )
    if args.source == "gold":
        guide = gold_guide(dict(enumerate(specs)), fmt)
    else:
        sampled = RolloutRunner(fmt, cfg).run(specs, model, ResponseSource(model=model), seed=args.seed)
        guide = forced_guide_from(sampled, args.samples)
    results = {}
    streams = {}
    for mode, reuse in (("reuse", True), ("naive", False)):
        runner = RolloutRunner(fmt, replace(cfg, reuse_kv=reuse), guide=guide)
        times, batch = timed_runs(runner, specs, model, args.repeats, args.warmup)
        streams[mode] = [[s.flat()["input_ids"] for s in t.streams] for t in batch.trajectories]
        results[mode] = {
            "median_s": statistics.median(times),
            "times_s": times,
            "fed_tokens": batch.fed_tokens,
            "forwards": batch.forwards,
            "generated_tokens": sum(batch.generated_tokens.values()),
            "stream_tokens": sum(len(x) for t in streams[mode] for x in t),
        }
        logger.info(
            "%-6s median %.3fs  fed %7d tokens  %4d forwards  %5d generated  (runs: %s)",
            mode,
            results[mode]["median_s"],
            batch.fed_tokens,
            batch.forwards,
            results[mode]["generated_tokens"],
            ", ".join(f"{t:.3f}" for t in times),
        )
    if streams["reuse"] != streams["naive"]:
        raise SystemExit("the two modes produced different streams; the comparison is invalid")
    speedup = results["naive"]["median_s"] / results["reuse"]["median_s"]
    results.update(
        {
            "speedup": speedup,
            "model": args.model,
            "prompts": len(specs),
            "samples": args.samples,
            "source": args.source,
            "threads": args.threads,
        }
    )
    logger.info(
        "identical streams: yes; speed-up (naive / reuse): %.2fx; fed-token ratio %.2fx",
        speedup,
        results["naive"]["fed_tokens"] / results["reuse"]["fed_tokens"],
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
