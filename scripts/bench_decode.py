#!/usr/bin/env python
"""Benchmark: one KV-cached decode step, two ways, on identical streams.

``--compare lean`` (default): HF's forward vs ``LeanLlama`` (``BatchedStreams(lean=False/True)``) on
the same model copy: ``--rows`` rows prefilled with ``--context`` random tokens each (row r a little
shorter than row r-1, so the cache has padding holes as in real rollouts), then ``--steps`` appends of
one token per row, where every fifth row skips a step (more holes).

``--compare share``: a rollout's layout, both sides on ``LeanLlama``: ``--groups`` prompts (prompt g
a little shorter than prompt g-1) prefilled once and expanded to ``--rows`` / ``--groups`` samples each
(``repeat``), then the same decode steps. ``copied`` gives every sample row its own copy of the
prompt's keys/values (``share_prefixes=False``), ``shared`` keeps one per prompt
(``kv.SharedPrefix``).

The sides alternate for ``--repeats`` rounds so that a busy neighbour hurts both alike; figures are
medians over rounds of the mean time per decode step. Before timing, one round checks that both sides
return the same logits (fp32: within 1e-4; bf16: within 5% of the largest logit, a coarse guard:
``tests/unit/runtime/test_engine_kv.py`` checks bf16 tightly), so the comparison is between two forwards that
compute the same thing.

    python scripts/bench_decode.py --model smollm2                 # precision auto (bf16 where it pays)
    python scripts/bench_decode.py --model smollm2 --precision fp32
    python scripts/bench_decode.py --model smollm2 --compare share --groups 2
    python scripts/bench_decode.py --model tiny --context 200      # plumbing check, seconds

The last line printed is one JSON object: each side's ``<side>_ms_per_step`` (``hf``/``lean`` or
``copied``/``shared``), ``speedup`` (first side / second), the largest logit difference seen, the
precision, threads and the CPU model.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import torch

from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.attention import use_gqa_attention
from envace.runtime.kv import BatchedStreams
from envace.runtime.precision import cpu_model, resolve_precision

logger = logging.getLogger("bench_decode")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--context", type=int, default=1500, help="prefilled tokens of the longest row")
    p.add_argument("--steps", type=int, default=30, help="timed decode steps per round")
    p.add_argument("--repeats", type=int, default=3, help="rounds per side (alternating)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--compare", choices=sorted(SIDES), default="lean", help="HF vs LeanLlama, or copied vs shared prompts"
    )
    p.add_argument("--groups", type=int, default=2, help="--compare share: prompts (rows must divide evenly)")
    args = p.parse_args()
    if args.compare == "share" and (args.groups < 1 or args.rows % args.groups):
        p.error(f"--rows {args.rows} must be a multiple of --groups {args.groups}")
    return args


# per comparison: its two sides and each side's BatchedStreams options
SIDES = {
    "lean": {"hf": {"lean": False}, "lean": {"lean": True}},
    "share": {"copied": {"lean": True, "share_prefixes": False}, "shared": {"lean": True, "share_prefixes": True}},
}


def one_round(model, args, precision: str, side: str, steps: int) -> tuple[float, list[dict]]:
    """(mean seconds per decode step, every append's logits) for one freshly prefilled set of streams."""
    vocab = model.config.vocab_size
    options = SIDES[args.compare][side]
    prompts_n = args.groups if args.compare == "share" else args.rows
    streams = BatchedStreams(model, list(range(prompts_n)), precision=precision, **options)
    lengths = [max(1, args.context - 37 * r) for r in range(prompts_n)]
    prompts = {
        r: torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(r)).tolist()
        for r, n in enumerate(lengths)
    }
    outputs = [streams.append(prompts)]
    if args.compare == "share":
        per = args.rows // args.groups
        streams.repeat([[g * per + k for k in range(per)] for g in range(args.groups)])
    start = time.perf_counter()
    for i in range(steps):
        outputs.append(streams.append({r: [(r * 7 + i) % vocab] for r in range(args.rows) if (r + i) % 5}))
    return (time.perf_counter() - start) / steps, outputs


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    model, _ = load_model_and_tokenizer(ModelSpec(kind=args.model))
    use_gqa_attention(model)
    precision = resolve_precision(args.precision, model=model)
    first, second = SIDES[args.compare]
    _, a_out = one_round(model, args, precision, first, steps=5)
    _, b_out = one_round(model, args, precision, second, steps=5)
    diff = max(float((a[k] - b[k]).abs().max()) for a, b in zip(a_out, b_out) for k in a)
    tol = 1e-4 if precision == "fp32" else 5e-2 * max(1.0, max(float(a[k].abs().max()) for a in a_out for k in a))
    if diff > tol:
        raise SystemExit(f"{first} and {second} logits differ by {diff:.3g} (> {tol:.3g}): the comparison is invalid")
    times: dict[str, list[float]] = {first: [], second: []}
    for _ in range(args.repeats):
        for side in (first, second):
            seconds, _ = one_round(model, args, precision, side, steps=args.steps)
            times[side].append(seconds)
            logger.info("%s: %.1f ms per decode step", side, seconds * 1e3)
    ms = {side: statistics.median(times[side]) * 1e3 for side in (first, second)}
    print(
        json.dumps(
            {
                "model": args.model,
                "compare": args.compare,
                "precision": precision,
                "rows": args.rows,
                "groups": args.groups if args.compare == "share" else None,
                "context": args.context,
                "threads": args.threads,
                "cpu": cpu_model(),
                **{f"{side}_ms_per_step": v for side, v in ms.items()},
                "speedup": ms[first] / ms[second],
                "rounds_ms": {s: [t * 1e3 for t in v] for s, v in times.items()},
                "max_logit_diff": diff,
            }
        )
    )


if __name__ == "__main__":
    main()
