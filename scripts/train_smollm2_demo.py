#!/usr/bin/env python
"""Short real CPU run: SmolLM2-135M-Instruct, SFT warm-up on gold trajectories, then role-wise GRPO.

Uses the embedded tool world (train split), the built-in verifiable reward, the ``local`` engine and
one CPU thread. Logs one line per step (reward, per-role parse-failure rates, advantages, loss,
tokens/s) and writes the full metric history as JSON to ``<output-dir>/history.json``.

    python scripts/train_smollm2_demo.py --steps 4 --output-dir /tmp/envace-smollm2-demo
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from envace.core.records import Role
from envace.data.specs import episode_spec_from_task, executor_factory_for
from envace.engines import get_engine
from envace.engines.local import (
    LocalEngineConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
)
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec

logger = logging.getLogger("train_smollm2_demo")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="envace")
    p.add_argument("--model", default="smollm2", help="ModelSpec kind (smollm2 | tiny)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tasks", type=int, default=16, help="train tasks used (1-turn tasks first)")
    p.add_argument("--max-turns", type=int, default=1)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=5e-5)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-act-tokens", type=int, default=96)
    p.add_argument("--max-rehearse-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="/tmp/envace-smollm2-demo")
    return p.parse_args()


def step_line(step: int, m: dict[str, float]) -> str:
    if "sft/loss" in m:
        return f"sft epoch {int(m['sft/epoch'])}: loss {m['sft/loss']:.3f}"
    parts = [f"step {step}", f"reward {m['reward/mean']:.3f}±{m['reward/std']:.3f}"]
    for role in Role:
        tag = role.name.lower()
        parts.append(
            f"{tag}: outputs {int(m[f'outputs/{tag}'])} parse_fail {m[f'parse_fail/{tag}']:.2f} "
            f"|A| {m.get(f'adv/{tag}/abs_mean', 0.0):.3f}"
        )
    parts.append(f"loss {m.get('loss', 0.0):.4f} kl {m.get('kl', 0.0):.4f} clipfrac {m.get('clipfrac', 0.0):.3f}")
    parts.append(
        f"gen {m['tokens_per_s']:.1f} tok/s, step {m['time/step']:.0f}s "
        f"(rollout {m['time/rollout']:.0f}s, update {m['time/update']:.0f}s)"
    )
    return " | ".join(parts)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    env = ToolWorldEnv()
    tasks = [t for t in env.tasks("train") if len(t.user_turns) <= args.max_turns][: args.tasks]
    specs = [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
    cfg = LocalEngineConfig(
        model=ModelSpec(kind=args.model),
        variant=args.variant,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        seed=args.seed,
        output_dir=args.output_dir,
        resume=False,
        rollout=RolloutConfig(
            samples_per_prompt=args.samples,
            act_temperature=args.temperature,
            rehearse_temperature=args.temperature,
            max_act_tokens=args.max_act_tokens,
            max_rehearse_tokens=args.max_rehearse_tokens,
            max_stream_tokens=4096,
        ),
        optim=OptimConfig(lr=args.lr, micro_batch_streams=2),
        sft=SFTConfig(epochs=args.sft_epochs, lr=args.sft_lr, batch_streams=4),
    )
    engine = get_engine("local", executor_factory=executor_factory_for(env.make_executor, tasks))
    history: list[dict[str, float]] = []

    def log_step(step: int, metrics: dict[str, float]) -> None:
        history.append({"callback_step": step, **metrics})
        logger.info(step_line(step, metrics))

    start = time.perf_counter()
    result = engine.train(cfg, specs, callbacks=[log_step])
    wall = time.perf_counter() - start
    rl = [m for m in history if "reward/mean" in m]
    summary = {
        "wall_s": wall,
        "steps": result.steps_done,
        "reward_trend": [m["reward/mean"] for m in rl],
        "parse_fail_act": [m["parse_fail/act"] for m in rl],
        "parse_fail_rehearse": [m["parse_fail/rehearse"] for m in rl],
        "tokens_per_s": [m["tokens_per_s"] for m in rl],
        "sft_loss": [m["sft/loss"] for m in history if "sft/loss" in m],
        "artifacts": dict(result.artifacts),
    }
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.output_dir) / "history.json").write_text(json.dumps({"summary": summary, "history": history}, indent=1))
    logger.info("done in %.0fs: %s", wall, json.dumps(summary))


if __name__ == "__main__":
    main()
