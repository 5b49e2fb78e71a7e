#!/usr/bin/env python
"""Benchmark: the evaluation backend's prompt prefill, padded batch vs row by row, on a real test-time cell.

Runs one private-rehearsal cell (``--n-attempts`` parallel attempts; the same model acts, rehearses,
critiques and summarises) on the first ``--tasks`` tool-world test tasks of the science setting, with
two ``LocalHFBackend``s over the same weights:
- ``padded``: the prefill before commit 6ec1cf8 (``PaddedPrefill`` below): each batch reuses cached
  prefixes, then feeds every row's remaining prompt in one forward padded to the longest of them;
- ``rows``: today's backend: each prompt prefilled alone and stored in the prefix cache before the next
  row, so rows sharing a head (parallel attempts, one domain's tool schemas) encode it once.
Both paths run every repeat, in alternating order, each with a fresh prefix cache of ``--cache-tokens``.
Prints per-path median seconds, prompt tokens fed to the model and reused from the cache, successes,
and ``speedup`` = padded / rows seconds; the last line is one JSON object. In bf16 the two paths may
sample different trajectories (batch shapes change the rounding), so their token counts differ a
little; in fp32 (``--precision fp32``) their outputs are identical (tests/unit/inference/test_local_backend.py).

    python scripts/bench_eval.py --model data/science/sft/final/policy --tasks 8
    python scripts/bench_eval.py --model smollm2 --tasks 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import replace

import torch

from envace.config.load import compose, typed_config
from envace.core.rehearsal import RehearsalMode
from envace.inference.local import LocalHFBackend, seed_prefixes
from envace.models import model_spec_from_string
from envace.rehearsal import evaluate_with_rehearsal
from envace.runtime.precision import cpu_model
from envace.stages.common import data_seed
from envace.stages.rehearsal_sweep import rehearsal_settings
from envace.stages.suites import eval_suite, make_adapter

logger = logging.getLogger("bench_eval")


class PaddedPrefill(LocalHFBackend):
    """The prefill of the backend before row-by-row prefill: one padded forward for the whole batch."""

    def _prefill(self, streams, rows):  # type: ignore[override]
        hits = {i: self.prefix_cache.lookup(r.item.prompt_ids) if self.prefix_cache else None for i, r in rows.items()}
        if any(hit is not None for hit in hits.values()):
            seed_prefixes(streams, [hits[key] for key in streams.keys])
        for i, hit in hits.items():
            if hit is not None:
                rows[i].reused = hit.length
                self.prefix_cache_hits += 1
                self.cached_tokens_reused += hit.length
            self.prompt_tokens_encoded += len(rows[i].item.prompt_ids) - rows[i].reused
        with torch.no_grad():
            return streams.append({i: r.item.prompt_ids[r.reused :] for i, r in rows.items()})


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="data/science/sft/final/policy", help="a model directory or name (smollm2)")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--n-attempts", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--cache-tokens", type=int, default=65536)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    # the science setting's tool world and rehearsal budgets (conf/config.yaml `science:`)
    cfg = typed_config(compose(["profile=cpu", "data.n_train=40", "data.n_val=4", "data.n_test=40", "data.seed=0"]))
    suite = eval_suite(cfg, "toolworld", "rehearsal")
    adapter = make_adapter(cfg, suite)
    tasks = adapter.tasks("test", limit=args.tasks, seed=data_seed(cfg))
    base = rehearsal_settings(cfg)
    settings = replace(base, config=replace(base.config, n_attempts=args.n_attempts, mode=RehearsalMode.parallel))
    first = LocalHFBackend.from_spec(model_spec_from_string(args.model), precision=args.precision)
    paths = {"padded": PaddedPrefill, "rows": LocalHFBackend}
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    last: dict[str, dict[str, float]] = {}
    for repeat in range(args.repeats):
        for name in list(paths) if repeat % 2 == 0 else list(paths)[::-1]:
            backend = paths[name](
                first.model,
                first.tokenizer,
                name=name,
                precision=args.precision,
                prefix_cache_tokens=args.cache_tokens,
            )
            started = time.perf_counter()
            run = evaluate_with_rehearsal(
                adapter, backend, backend, tasks, settings, concurrency=cfg.rehearsal.concurrency, progress=False
            )
            seconds[name].append(time.perf_counter() - started)
            last[name] = {
                "prompt_tokens_encoded": backend.prompt_tokens_encoded,
                "cached_tokens_reused": backend.cached_tokens_reused,
                "successes": sum(bool(r.success) for r in run.records),
            }
            print(f"{name:6s} repeat {repeat}: {seconds[name][-1]:.1f} s  {last[name]}", flush=True)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    result = {
        "cpu": cpu_model(),
        "precision": first.precision,
        "threads": args.threads,
        "tasks": len(tasks),
        "n_attempts": args.n_attempts,
        "cache_tokens": args.cache_tokens,
        "repeats": args.repeats,
        "seconds_median": median,
        **{f"{name}_{key}": value for name, values in last.items() for key, value in values.items()},
        "speedup": median["padded"] / median["rows"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
