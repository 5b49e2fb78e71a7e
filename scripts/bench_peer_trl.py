#!/usr/bin/env python
"""Benchmark: our local engine vs TRL's ``GRPOTrainer`` on the same single-turn GRPO work, side by side.

The workload is the peer baseline's (``shared/peer/README.md``): a random-init Llama (seed 0; vocab
512, hidden 128, 4 layers, 4/2 heads, MLP 256, untied head, SDPA, fp32 weights, 722,048 parameters),
a word-level tokenizer, P=8 prompts of exactly 64 tokens × K=4 samples of exactly 64 tokens
(temperature 1, no top-k/top-p, EOS never ends a sample), reward = share of even token ids,
group-normalised advantages, one forward + backward over all 32 rows, grad clip 1.0, one AdamW step
at lr 1e-5, no KL, no reference model, no gradient checkpointing, 6 steps of which the first 2 are
dropped, medians of per-step rates over the rest, 4,096 tokens per step.

Sides, each in its own child process (own peak RSS, own foreign-CPU figure), run back to back:
- ``trl``: TRL's ``GRPOTrainer`` unpatched, stopwatches around its rollout and optimizer step
  (the same windows as the peer script: step = on_step_begin..on_step_end, gen = inside
  ``_generate_and_score_completions``);
- ``ours_fp32``: our engine in fp32: prompt tokenisation, ``BatchedStreams`` (one prefill per prompt,
  cache expanded to its K samples) + the batched sampler, decoding to text, the reward and advantages
  (gen); then ``PolicyUpdater`` — shared-prefix packing, old log-probs from the update forward, LM
  head at the 64 completion positions only — forward, backward, clip, AdamW (train);
- ``ours``: the same with the engine's defaults (``precision=auto``: bf16 autocast, fp32 master weights,
  where the CPU has bf16 matmuls and this model's own forward measures faster in bf16; else fp32).
TRL does not share the prompt prefix: packing computes 2,560 of the 4,096 tokens per step; rates use
the same 4,096-token numerator on both sides (identical *work*, less computation on ours).

Needs the ``bench`` extra: ``pip install -e '.[bench]'`` (TRL, datasets).

    python scripts/bench_peer_trl.py --threads 1
    python scripts/bench_peer_trl.py --threads 2

The last line printed is one JSON object: ``ratio_step_tokens_per_s``, ``ratio_gen``, ``ratio_train``
(ours / trl, default precision) and ``*_fp32`` (ours in fp32), each side's summary with
``foreign_cpu_cores`` (other processes' CPU during the timed steps; trust a run only below 0.1) and
memory (``peak_rss_mb``, ``rss_pre_train_mb``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

from envace.runtime.precision import machine_clock

SPECIALS = ("<pad>", "<eos>", "<unk>")
VOCAB = 512


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", "-P", type=int, default=8)
    p.add_argument("--gens", "-K", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sides", default="trl,ours_fp32,ours")
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="rounds over the sides (interleaved); each figure is the median over rounds",
    )
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


# ---- shared workload -----------------------------------------------------------------------------
def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)} | {f"w{i}": i for i in range(len(SPECIALS), VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_model(tok):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(cfg)


def build_prompts(n: int, length: int) -> list[str]:
    rng = random.Random(1234)
    return [" ".join(f"w{rng.randrange(len(SPECIALS), VOCAB)}" for _ in range(length)) for _ in range(n)]


def even_share(ids) -> float:
    return sum(t % 2 == 0 for t in ids) / max(len(ids), 1)


def rss_now_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def summarise(side: str, records: list[dict], args, clock0, rss_before: float, **extra) -> dict:
    wall, busy, own = (b - a for a, b in zip(clock0, machine_clock()))
    kept = records[args.warmup :]
    rows = args.prompts * args.gens
    tokens = rows * (args.prompt_len + args.completion_len)
    med = lambda key: statistics.median(r[key] for r in kept)
    rate = lambda key: statistics.median(tokens / r[key] for r in kept)
    return {
        "side": side,
        "threads": args.threads,
        "tokens_per_step": tokens,
        "step_s_median": med("step"),
        "gen_s_median": med("gen"),
        "train_s_median": med("train"),
        "step_tokens_per_s_median": rate("step"),
        "gen_tokens_per_s_median": rate("gen"),
        "train_tokens_per_s_median": rate("train"),
        "foreign_cpu_cores": round(max(busy - own, 0.0) / wall, 3),
        "rss_pre_train_mb": round(rss_before, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **extra,
    }


# ---- TRL side ------------------------------------------------------------------------------------
def run_trl(args) -> dict:
    import tempfile

    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = build_tokenizer()
    model = build_model(tok)
    rows = args.prompts * args.gens
    clock: dict[str, float] = {}
    records: list[dict] = []

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            batch = super()._generate_and_score_completions(inputs)
            clock["gen"] = clock.get("gen", 0.0) + time.perf_counter() - t0
            if int(batch["completion_mask"].sum()) != rows * args.completion_len:
                raise SystemExit("trl: a completion ended early; the work is not the agreed one")
            return batch

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock.clear()
            clock["t0"] = time.perf_counter()

        def on_step_end(self, *a, **k):
            step = time.perf_counter() - clock["t0"]
            records.append({"step": step, "gen": clock["gen"], "train": step - clock["gen"]})

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            seed=0,
            bf16=False,
            fp16=False,
            per_device_train_batch_size=rows,
            gradient_accumulation_steps=1,
            num_generations=args.gens,
            num_iterations=1,
            max_completion_length=args.completion_len,
            generation_kwargs={"min_new_tokens": args.completion_len},
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            warmup_steps=0,
            beta=0.0,
            gradient_checkpointing=False,
            max_steps=args.steps,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
        )
        prompts = build_prompts(args.prompts * args.steps, args.prompt_len)
        trainer = Timed(
            model=model,
            args=cfg,
            reward_funcs=lambda completion_ids, **_: [even_share(c) for c in completion_ids],
            processing_class=tok,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            callbacks=[Clock()],
        )
        torch.set_num_threads(args.threads)
        rss, clock0 = rss_now_mb(), machine_clock()
        trainer.train()
        return summarise("trl", records, args, clock0, rss, trl=trl.__version__, precision="fp32")


# ---- our side ------------------------------------------------------------------------------------
def our_rollout(model, tok, prompts: list[str], args, step: int, precision: str):
    """Tokenise, prefill each prompt once, expand to K, sample exactly ``completion_len`` tokens per row."""
    import torch

    from envace.core.records import Role
    from envace.core.seeds import derive_seed
    from envace.runtime.decode import DecodeRequest, OutputKey, decode
    from envace.runtime.kv import BatchedStreams

    ids = [tok(p)["input_ids"] for p in prompts]
    streams = BatchedStreams(model, [("p", i) for i in range(len(ids))], pad_id=tok.pad_token_id, precision=precision)
    streams.append({("p", i): x[:-1] for i, x in enumerate(ids)})
    streams.repeat([[(i, k) for k in range(args.gens)] for i in range(len(ids))])
    requests = [
        DecodeRequest(
            row=(i, k),
            stream=ids[i],
            max_new_tokens=args.completion_len,
            temperature=1.0,
            generator=torch.Generator().manual_seed(derive_seed(0, step, i, k)),
            output_key=OutputKey(i, k, Role.ACT, 0),
        )
        for i in range(len(ids))
        for k in range(args.gens)
    ]
    decode(streams, requests, stop_ids=frozenset())
    texts = [tok.decode(r.tokens) for r in requests]
    if any(len(r.tokens) != args.completion_len for r in requests) or len(texts) != len(requests):
        raise SystemExit("ours: a completion is not exactly completion_len tokens")
    return ids, requests


def our_rows(ids, requests, args):
    """Group-normalised advantages (mean/std over the K samples of a prompt) and one row per sample."""
    import torch

    from envace.core.records import Role
    from envace.engines.local.batching import TrainRow

    rewards = torch.tensor([even_share(r.tokens) for r in requests]).view(len(ids), args.gens)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    rows = []
    for j, r in enumerate(requests):
        prompt = ids[j // args.gens]
        full = torch.tensor(prompt + r.tokens)
        pos = torch.arange(len(prompt) - 1, full.numel() - 1)
        rows.append(
            TrainRow(
                input_ids=full,
                positions=pos,
                targets=full[pos + 1],
                roles=torch.full_like(pos, int(Role.ACT)),
                temperatures=torch.ones(pos.numel()),
                advantages=torch.full((pos.numel(),), float(adv[j])),
                sampling_logprobs=torch.tensor(r.logprobs),
            )
        )
    return rows


def run_ours(args, precision_name: str) -> dict:
    import torch

    from envace.core.records import Role
    from envace.engines.local import OptimConfig
    from envace.engines.local.trainer import PolicyUpdater, Slot, make_optimizer
    from envace.runtime.attention import use_gqa_attention
    from envace.runtime.precision import resolve_precision

    tok = build_tokenizer()
    model = build_model(tok).eval()
    use_gqa_attention(model)
    torch.set_num_threads(args.threads)  # the probe measures at the thread count the run uses
    precision = resolve_precision(precision_name, model=model)
    cfg = OptimConfig(lr=1e-5, grad_clip=1.0, micro_batch_tokens=1 << 20, grad_checkpointing="off")
    slot = Slot("policy", model, frozenset({Role.ACT}), make_optimizer(model, cfg))
    prompts = build_prompts(args.prompts * args.steps, args.prompt_len)
    records = []
    rss, clock0 = rss_now_mb(), machine_clock()
    for step in range(args.steps):
        t0 = time.perf_counter()
        ids, requests = our_rollout(
            model, tok, prompts[step * args.prompts : (step + 1) * args.prompts], args, step, precision
        )
        rows = our_rows(ids, requests, args)
        t1 = time.perf_counter()
        updater = PolicyUpdater(slot, cfg, seed=0, pad_id=tok.pad_token_id, precision=precision)
        updater.prepare(rows)
        updater.update(rows, step)
        t2 = time.perf_counter()
        records.append({"step": t2 - t0, "gen": t1 - t0, "train": t2 - t1})
        print(f"[ours step {step}] gen={t1 - t0:.3f} train={t2 - t1:.3f}", file=sys.stderr, flush=True)
    return summarise("ours", records, args, clock0, rss, precision=precision)


# ---- driver --------------------------------------------------------------------------------------
def median_run(runs: list[dict]) -> dict:
    """One side's figures: the median of every numeric field over its rounds (max for foreign CPU)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in runs]
            out[key] = max(values) if key == "foreign_cpu_cores" else statistics.median(values)
    out["rounds_step_s"] = [r["step_s_median"] for r in runs]
    return out


def main() -> None:
    args = parse_args()
    if args.side:
        os.environ.update(HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false")
        out = run_trl(args) if args.side == "trl" else run_ours(args, "fp32" if args.side == "ours_fp32" else "auto")
        print(json.dumps(out))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for side in args.sides.split(","):
            cmd = [sys.executable, __file__, "--side", side, *sys.argv[1:]]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode:
                sys.stderr.write(done.stderr[-4000:])
                raise SystemExit(f"side {side} failed (exit {done.returncode})")
            runs.setdefault(side, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[side][-1]), flush=True)
    sides = {side: median_run(rs) for side, rs in runs.items()}
    summary: dict = {"threads": args.threads, "repeats": args.repeats, **{f"{k}": v for k, v in sides.items()}}
    if "trl" in sides:
        trl = sides["trl"]
        for name, suffix in (("ours", ""), ("ours_fp32", "_fp32")):
            if name in sides:
                ours = sides[name]
                summary[f"ratio_step_tokens_per_s{suffix}"] = (
                    ours["step_tokens_per_s_median"] / trl["step_tokens_per_s_median"]
                )
                summary[f"ratio_gen{suffix}"] = ours["gen_tokens_per_s_median"] / trl["gen_tokens_per_s_median"]
                summary[f"ratio_train{suffix}"] = ours["train_tokens_per_s_median"] / trl["train_tokens_per_s_median"]
                summary[f"memory_ratio{suffix}"] = (ours["peak_rss_mb"] - ours["rss_pre_train_mb"]) / max(
                    trl["peak_rss_mb"] - trl["rss_pre_train_mb"], 1e-9
                )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
