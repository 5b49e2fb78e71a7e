#!/usr/bin/env python
"""Benchmark: one SFT epoch with ``train.sft_batching=shuffled`` vs ``prefix``, on identical rows.

Both arms train a fresh copy of the same model on the same gold rows (the tool world's first ``--tasks``
training tasks of every domain but the held-out one, teacher-forced once), ``--batch-streams`` streams per
optimiser step, one thread, the precision the engine resolves; only which streams share a step differs
(``envace.engines.local.sft.sft_batches``). The arms alternate (ABAB...) ``--repeats`` times in one process
so machine load hits both alike; the last line is one JSON object with each arm's median seconds per epoch,
the speed-up, the CPU model and whether it has bf16 instructions.

    python scripts/bench_sft_batching.py --model data/organism/toolworld_lm --tasks 40 --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, ChatFormatter
from envace.core.records import Role
from envace.data.specs import episode_spec_from_task
from envace.engines.local import RolloutConfig, SFTConfig
from envace.engines.local.config import OptimConfig
from envace.engines.local.sft import gold_trajectories, sft_batches, sft_epoch, sft_rows
from envace.engines.local.trainer import make_optimizer
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.precision import resolve_precision
from envace.utils.machine import cpu_has_bf16, cpu_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="data/organism/toolworld_lm", help="an HF model directory")
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--batch-streams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="path", path=args.model))
    fmt = ChatFormatter(tokenizer)
    env = ToolWorldEnv()
    tasks = env.tasks("train")[: args.tasks]
    specs = [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
    rollout = RolloutConfig(samples_per_prompt=1, max_stream_tokens=1 << 30)
    trajectories = gold_trajectories(specs, model, fmt, rollout, DEFAULT_ROLE_PROMPTS)
    rows = sft_rows(trajectories, [Role.ACT, Role.REHEARSE])
    precision = resolve_precision(args.precision, "cpu", model)
    times: dict[str, list[float]] = {"shuffled": [], "prefix": []}
    losses: dict[str, float] = {}
    for _ in range(args.repeats):
        for arm in times:
            cfg = SFTConfig(lr=1e-3, batch_streams=args.batch_streams, batching=arm)
            trained = copy.deepcopy(model)
            opt = make_optimizer(trained, OptimConfig(), lr=cfg.lr)
            start = time.perf_counter()
            metrics = sft_epoch(
                trained, opt, rows, cfg, epoch=0, seed=0, pad_id=tokenizer.pad_token_id, precision=precision
            )
            times[arm].append(time.perf_counter() - start)
            losses[arm] = round(metrics["sft/loss"], 4)
    medians = {arm: statistics.median(t) for arm, t in times.items()}
    print(
        json.dumps(
            {
                "cpu": cpu_model(),
                "cpu_bf16": cpu_has_bf16(),
                "precision": precision,
                "tasks": len(tasks),
                "rows": len(rows),
                "batch_streams": args.batch_streams,
                "steps": {
                    arm: len(sft_batches(rows, SFTConfig(batch_streams=args.batch_streams, batching=arm), 0))
                    for arm in times
                },
                "median_s": {arm: round(v, 2) for arm, v in medians.items()},
                "runs_s": {arm: [round(v, 2) for v in t] for arm, t in times.items()},
                "epoch_loss": losses,
                "speedup_prefix": round(medians["shuffled"] / medians["prefix"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
