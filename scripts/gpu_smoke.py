"""GPU smoke checks for envace (run through scripts/gpu_smoke.sh; < 10 minutes on one GPU, no network).

Modes:
  verl  A tiny model is built locally (random init, then a short SFT warm-up on gold tool-world
        trajectories so that it emits tool calls and REHEARSE answers), saved with save_pretrained,
        and trained for a few steps by verl (engine=verl: our agent loop, trainer mode and estimator,
        vLLM rollouts, FSDP actor) on tool-world prompts. Checks: verl exits 0, every step's actor loss
        is finite, both roles had trainable tokens with non-zero advantages, parameters changed.
  bare  A GPU machine with PyTorch + transformers only (no vLLM/Ray/verl): the local engine on CUDA in
        bf16 (SFT warm-up, rollouts and — when verl's core_algos is importable — RL steps), the
        role-wise estimator and the policy loss on CUDA tensors, compared with CPU results. What could
        not run (verl absent) is detected and reported, not failed.
  organism  The model organism (issue 46; its committed start science/organism/start, 5.7 MB, so nothing
        to download) trained on the device by the pipeline's own stage code: prepare_data and
        template_prompts for the tool world, then stage train (envace.stages.train.run, the local engine,
        role-wise GRPO) for --steps steps (default 10: a CPU core takes ~33 s a step, and the GPU speed of a
        model this small is not measured yet; 30 is the main job's) with the real-environment validation
        curve every 10 steps, all under the organism profile, no MLflow. Checks the plumbing (every step
        logged, finite losses, weights changed, the model was on the device, validation at step 0 and at
        the last step)
        and records what a CPU run records (validation success per step, seconds per step) beside the
        committed CPU run's curve (metrics/train.details.json), without judging the learning: one run of
        100 validation tasks is not a test of it.

Writes ``report.json`` in --out and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("gpu_smoke")
TINY = {"kind": "tiny", "tiny_hidden": 256, "tiny_heads": 4, "tiny_layers": 2}  # head_dim 64: vLLM kernels


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def toolworld_specs(n_train: int, seed: int = 0) -> tuple[list[Any], list[dict]]:
    from envace.engines.verl.episodes import spec_from_row
    from envace.envs.toolworld import generate_tasks, to_cm2_row

    tasks = generate_tasks(seed=seed, n_train=n_train, n_val=0, n_test=0)["train"]
    rows = [to_cm2_row(t, include_state=True) for t in tasks]
    return [spec_from_row(r, "toolworld") for r in rows], rows


def build_tiny_model_dir(out: Path, specs: list[Any], *, sft_epochs: int, device: str, dtype: str = "float32") -> Path:
    """Random tiny model, SFT warm-up on the gold trajectories of ``specs``, saved as an HF directory."""
    from envace.engines.local.config import LocalEngineConfig, RolloutConfig, SFTConfig
    from envace.engines.local.engine import LocalEngine
    from envace.models import ModelSpec

    config = LocalEngineConfig(
        model=ModelSpec(dtype=dtype, **TINY),
        steps=0,
        device=device,
        output_dir=str(out),
        progress=False,
        rollout=RolloutConfig(max_act_tokens=128, max_rehearse_tokens=128, max_stream_tokens=2048),
        sft=SFTConfig(epochs=sft_epochs, lr=2e-3, batch_streams=8),
    )
    result = LocalEngine().train(config, specs)
    sft = [h for h in result.history if "sft/epoch" in h]
    last = {k: round(v, 4) for k, v in (sft[-1] if sft else {}).items()}
    logger.info("tiny model: %d SFT epochs, last %s", len(sft), last)
    return Path(result.artifacts["policy"])


# ---- mode organism ------------------------------------------------------------------------------
ORGANISM_PATHS = ("prepared", "prompts", "checkpoints", "evaluation", "rehearsal", "metrics", "plots", "reports")
LOSS_COLUMNS = ("loss", "loss/act", "loss/rehearse", "pg_loss")  # per RL step in the train stage's train_steps.csv


def _points(curves: dict[str, list[Any]], key: str) -> dict[int, float]:
    """``{step: value}`` of one training curve (``envace.core.curves``), the steps it was measured at."""
    return {int(s): v for s, v in zip(curves.get("step", []), curves.get(key, [])) if v is not None}


def organism_overrides(out: Path, steps: int, device: str, precision: str | None, val_tasks: int) -> list[str]:
    """The organism profile with every output under ``out``, on ``device``, ``steps`` GRPO steps."""
    every = max(1, min(10, steps))
    overrides = [
        "profile=organism",
        f"engine.device={device}",
        f"train.steps={steps}",
        f"train.val_every={every}",
        f"train.fidelity_every={every}",
        f"train.val_tasks={val_tasks}",
        f"train.checkpoint_every={steps + 1}",  # a smoke run is not resumed
        *(f"paths.{name}={out / 'organism' / name}" for name in ORGANISM_PATHS),
    ]
    return overrides + ([f"engine.precision={precision}", f"eval.precision={precision}"] if precision else [])


def run_organism(
    out: Path, steps: int, device: str = "cuda", precision: str | None = None, val_tasks: int = 0
) -> dict[str, Any]:
    import csv
    import shutil

    import torch
    from safetensors.torch import load_file

    from envace.config.load import compose, typed_config
    from envace.stages import prepare_data, template_prompts, train
    from envace.stages.train_setup import config_hash

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("organism mode needs CUDA (torch.cuda.is_available() is False); --device cpu runs on the CPU")
    overrides = organism_overrides(out, steps, device, precision, val_tasks)
    cfg = typed_config(compose(overrides))
    report: dict[str, Any] = {"device": device, "overrides": overrides, "torch": torch.__version__}
    report["device_name"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    # a smoke run starts from the committed start: never resume a killed run's checkpoints (the resume
    # directory is keyed by the config, not by the output paths)
    shutil.rmtree(train.WORK_ROOT / config_hash(cfg), ignore_errors=True)
    started = time.time()
    prepare_data.run(cfg)
    template_prompts.run(cfg)
    report["data_seconds"] = round(time.time() - started, 1)
    _write_report(out, {"mode": "organism", **report, "state": "training (killed if nothing follows)", "ok": False})
    started = time.time()
    result = train.run(cfg)
    seconds = time.time() - started
    curves = result["curves"]
    points = _points(curves, "val/success")
    with open(Path(cfg.paths.plots) / "train_steps.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(float(r["step"])) > 0]  # RL steps (step 0: the probe)
    losses = [float(r[k]) for r in rows for k in r if k in LOSS_COLUMNS and r[k] not in ("", None)]
    start = load_file(str(Path(cfg.model.path) / "model.safetensors"))
    final = load_file(str(Path(cfg.paths.checkpoints) / "final" / "policy" / "model.safetensors"))
    reference = Path("metrics/train.details.json")
    cpu = json.loads(reference.read_text())["curves"] if reference.exists() else {}
    report["train"] = {
        "steps_done": result["steps_done"],
        "precision": result["precision"],
        "seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / max(1, result["steps_done"]), 2),
        "val_success": points,
        "val_gain_last": round(points[max(points)] - points[0], 4) if 0 in points else None,
        "fidelity_exact_match": _points(curves, "fidelity/exact_match"),
        "final": {k: v for k, v in result.items() if k.startswith("final/") and isinstance(v, float)},
        "max_weight_change": max(float((final[k].float() - start[k].float()).abs().max()) for k in start),
        "cuda_max_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if device == "cuda" else None,
    }
    report["cpu_reference"] = {
        "what": f"{reference}: the committed main job (make pipeline) on a CPU, same profile",
        "val_success": _points(cpu, "val/success"),
    }
    report["checks"] = {
        "organism_every_step_logged": sorted(int(float(r["step"])) for r in rows) == list(range(1, steps + 1)),
        "organism_losses_finite": bool(losses) and all(math.isfinite(v) for v in losses),
        "organism_weights_changed": report["train"]["max_weight_change"] > 0,
        "organism_validated_at_start_and_end": {0, steps} <= set(points),
        "organism_on_device": device == "cpu" or (report["train"]["cuda_max_memory_mib"] or 0) > 0,
    }
    return {**report, "state": "finished"}


def _write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))


# ---- mode verl ------------------------------------------------------------------------------------
def verl_config(model_dir: Path, steps: int) -> Any:
    from envace.config.load import compose, typed_config

    cfg = compose(
        [
            "profile=smoke",
            "engine=verl",
            "engine.n_gpus_per_node=1",
            "engine.nnodes=1",
            "model.kind=path",
            f"model.path={model_dir}",
            f"train.steps={steps}",
            "train.checkpoint_every=0",
            "rollout.prompts_per_step=4",
            "rollout.samples_per_prompt=4",
            "rollout.max_act_tokens=128",
            "rollout.max_rehearse_tokens=128",
            "rollout.max_stream_tokens=2048",
            "rollout.max_prompt_tokens=1536",
            "rollout.max_steps_per_turn=2",
            "algo.lr=1e-4",
            "tracking=none",
        ]
    )
    return typed_config(cfg)


def run_verl(out: Path, steps: int, dry_run: bool = False) -> dict[str, Any]:
    import os
    import subprocess

    from envace.engines.verl.config_builder import compose_verl_config
    from envace.engines.verl.episodes import dataset_record, write_dataset
    from envace.engines.verl.launcher import plan_launch

    specs, rows = toolworld_specs(16)
    model_dir = build_tiny_model_dir(
        out / "warmup", specs, sft_epochs=1 if dry_run else 20, device="cpu" if dry_run else "cuda"
    )
    files = {"train": out / "data" / "train.parquet", "val": out / "data" / "val.parquet"}
    records = [dataset_record(s, i, "train", "toolworld", r) for i, (s, r) in enumerate(zip(specs, rows))]
    write_dataset(files["train"], records)
    write_dataset(files["val"], records[:4])
    extra = [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.agent.num_workers=2",
    ]
    # without flash_attn, plan_launch switches the actor to sdpa attention (envace.engines.verl.attention_impl)
    plan = plan_launch(verl_config(model_dir, steps), output_dir=out / "run", files=files, extra_overrides=extra)
    (out / "run" / "metrics").mkdir(parents=True, exist_ok=True)
    (out / "run" / "command.sh").write_text(plan.shell() + "\n")
    logger.info("verl command: %s", plan.shell())
    if dry_run:  # CPU check of everything before the launch
        compose_verl_config(plan.overrides)
        return {"dry_run": True, "command": plan.shell(), "checks": {"verl_config_composes": True}}
    started = time.time()
    code = subprocess.run(plan.command, env={**os.environ, **plan.env_vars}, check=False).returncode
    report: dict[str, Any] = {"verl_returncode": code, "verl_seconds": round(time.time() - started, 1)}
    if code == 0:
        report.update(check_verl_run(out / "run", model_dir, steps))
    return report


def check_verl_run(run: Path, initial: Path, steps: int) -> dict[str, Any]:
    from envace.engines.verl.engine import latest_hf_weights, read_step_metrics

    metrics = read_step_metrics(run / "metrics")
    losses = {s: v for s, m in metrics.items() for k, v in m.items() if k in ("actor/pg_loss", "actor/loss")}
    trained = {
        role: any(
            m.get(f"envace/{role}/tokens", 0) > 0 and m.get(f"envace/{role}/adv_abs_mean", 0) > 0
            for m in metrics.values()
        )
        for role in ("act", "rehearse")
    }
    final = latest_hf_weights(run)
    delta = max_weight_change(initial, final) if final else None
    checks = {
        "all_steps_logged": sorted(metrics) == list(range(1, steps + 1)),
        "loss_finite": bool(losses) and all(math.isfinite(v) for v in losses.values()),
        "act_trained": trained["act"],
        "rehearse_trained": trained["rehearse"],
        "parameters_changed": delta is not None and delta > 0,
    }
    per_step = {
        s: {
            k: m[k]
            for k in sorted(m)
            if k.startswith("envace/") or k in ("actor/pg_loss", "critic/score/mean", "response_length/mean")
        }
        for s, m in metrics.items()
    }
    return {"checks": checks, "max_weight_change": delta, "steps": per_step}


def max_weight_change(before: Path, after: Path) -> float:
    from safetensors.torch import load_file

    def tensors(path: Path) -> dict:
        out: dict = {}
        for file in sorted(path.glob("*.safetensors")):
            out.update(load_file(str(file)))
        return out

    a, b = tensors(before), tensors(after)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"no common weights between {before} and {after}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in common)


# ---- mode bare --------------------------------------------------------------------------------------
def run_bare(out: Path, steps: int, device: str = "cuda") -> dict[str, Any]:
    import torch

    report: dict[str, Any] = {
        "cuda": torch.cuda.is_available(),
        "torch": torch.__version__,
        "device": device,
        "found": {m: available(m) for m in ("verl", "vllm", "ray", "transformers")},
    }
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bare mode needs CUDA (torch.cuda.is_available() is False)")
    report["device_name"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    report["estimator"] = estimator_on(device)
    has_verl = available("verl") and _core_algos_importable()
    report["loss"] = loss_on(device) if has_verl else "skipped: verl.trainer.ppo.core_algos not importable"
    report["precision"] = precision_on(device)
    engine, specs, report["local_engine"] = local_engine_on(device, out, steps if has_verl else 0)
    report["rollouts"] = rollouts_on(engine, specs)
    report["eval_backend"] = eval_backend_on(engine)
    checks = {
        "estimator_matches_cpu": report["estimator"]["matches_cpu"],
        "auto_precision_is_bf16": report["precision"]["auto"] == "bf16" or device == "cpu",
        "fp32_logprobs_match_cpu": report["precision"]["fp32_matches_cpu"],
        "bf16_logprobs_within_tolerance": report["precision"]["bf16_within_tolerance"],
        "local_engine_finite": report["local_engine"]["finite"],
        "local_engine_parameters_changed": report["local_engine"]["parameters_changed"],
        "local_engine_master_weights_fp32": report["local_engine"]["dtype"] == "torch.float32",
        "rollouts_generated_both_roles": min(report["rollouts"]["by_role"].values()) > 0,
        "rollout_logprob_diff_small": report["rollouts"]["logprob_diff"] < ROLLOUT_GAP_TOL,
        "eval_prefix_cache_exact_fp32": report["eval_backend"]["fp32_same_with_and_without_cache"],
    }
    if has_verl:
        checks["loss_matches_cpu"] = report["loss"]["matches_cpu"]
    report["checks"] = checks
    return report


def _core_algos_importable() -> bool:
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - report any reason
        logger.warning("verl core_algos not importable: %s", exc)
        return False
    return True


def estimator_on(device: str) -> dict[str, Any]:
    import torch

    from envace.core.advantages import compute_rolewise_advantages, token_advantages

    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(64, generator=gen)
    groups = [i // 16 for i in range(64)]
    roles = [int(torch.randint(0, 2, (1,), generator=gen)) for _ in range(64)]
    mask = (torch.rand(64, 32, generator=gen) > 0.3).float()
    cpu = token_advantages(compute_rolewise_advantages(rewards, groups, roles), mask)
    gpu = token_advantages(compute_rolewise_advantages(rewards.to(device), groups, roles), mask.to(device))
    return {"device": str(gpu.device), "matches_cpu": bool(torch.allclose(gpu.cpu(), cpu, atol=1e-6))}


def loss_on(device: str) -> dict[str, Any]:
    import torch

    from envace.engines.losses import compute_policy_loss

    gen = torch.Generator().manual_seed(1)
    shape = (8, 24)
    logp = (torch.randn(shape, generator=gen) * 0.1 - 2).requires_grad_()
    old, ref = logp.detach() + 0.05 * torch.randn(shape, generator=gen), logp.detach() - 0.02
    adv, mask = torch.randn(shape, generator=gen), (torch.rand(shape, generator=gen) > 0.2).float()
    cpu = compute_policy_loss(logp, old, adv, mask, kl_coef=1e-4, ref_log_probs=ref)
    cpu.loss.backward()
    logp_gpu = logp.detach().to(device).requires_grad_()
    gpu = compute_policy_loss(
        logp_gpu, old.to(device), adv.to(device), mask.to(device), kl_coef=1e-4, ref_log_probs=ref.to(device)
    )
    gpu.loss.backward()
    same = torch.allclose(gpu.loss.detach().cpu(), cpu.loss.detach(), atol=1e-5)
    same_grad = torch.allclose(logp_gpu.grad.cpu(), logp.grad, atol=1e-6)
    return {"loss": float(gpu.loss), "matches_cpu": bool(same and same_grad and math.isfinite(float(gpu.loss)))}


# bf16 autocast vs fp32 per-token log-probs on the tiny model (the CPU unit test's bounds,
# tests/unit/engines/test_engine_packing.py); and the mean |sampling - training| log-prob gap of one rollout batch
BF16_MEAN_TOL, BF16_MAX_TOL, FP32_DEVICE_TOL, ROLLOUT_GAP_TOL = 0.02, 0.1, 1e-3, 0.05


def _token_logprobs(model: Any, ids: Any, precision: str, device: str) -> Any:
    import torch

    from envace.runtime.precision import autocast

    with torch.no_grad(), autocast(precision, device):
        logits = model(input_ids=ids.to(device)).logits.float()
    return logits[:, :-1].log_softmax(-1).gather(-1, ids.to(device)[:, 1:, None])[..., 0].cpu()


def precision_on(device: str) -> dict[str, Any]:
    """``auto`` resolves on ``device``; fp32 and bf16-autocast log-probs there vs fp32 on the CPU."""
    import copy

    import torch

    from envace.models import ModelSpec, load_model_and_tokenizer
    from envace.runtime.precision import resolve_precision

    auto = resolve_precision("auto", device)
    model = load_model_and_tokenizer(ModelSpec(dtype="float32", **TINY))[0].eval()
    ids = torch.randint(0, model.config.vocab_size, (4, 256), generator=torch.Generator().manual_seed(0))
    cpu = _token_logprobs(model, ids, "fp32", "cpu")
    on_device = copy.deepcopy(model).to(device)
    fp32_gap = (_token_logprobs(on_device, ids, "fp32", device) - cpu).abs()
    bf16_gap = (_token_logprobs(on_device, ids, "bf16", device) - cpu).abs()
    return {
        "auto": auto,
        "fp32_max_gap": float(fp32_gap.max()),
        "bf16_mean_gap": float(bf16_gap.mean()),
        "bf16_max_gap": float(bf16_gap.max()),
        "fp32_matches_cpu": float(fp32_gap.max()) < FP32_DEVICE_TOL,
        "bf16_within_tolerance": float(bf16_gap.mean()) < BF16_MEAN_TOL and float(bf16_gap.max()) < BF16_MAX_TOL,
    }


def local_engine_on(device: str, out: Path, steps: int) -> tuple[Any, list[Any], dict[str, Any]]:
    """SFT warm-up (and RL steps where verl's loss is importable) on ``device``: fp32 master weights,
    ``precision: auto`` (bf16 autocast on a CUDA device that supports it), as the cpu profile runs."""
    from envace.engines.local.config import LocalEngineConfig, OptimConfig, RolloutConfig, SFTConfig
    from envace.engines.local.engine import LocalEngine
    from envace.models import ModelSpec, load_model_and_tokenizer

    specs, _ = toolworld_specs(8)
    spec = ModelSpec(dtype="float32", **TINY)
    before = {k: v.float().clone() for k, v in load_model_and_tokenizer(spec)[0].state_dict().items()}
    config = LocalEngineConfig(
        model=spec,
        steps=steps,
        prompts_per_step=2,
        device=device,
        precision="auto",
        progress=False,
        output_dir=str(out / "local"),
        optim=OptimConfig(lr=1e-3),
        rollout=RolloutConfig(samples_per_prompt=4, max_act_tokens=96, max_rehearse_tokens=96, max_stream_tokens=2048),
        sft=SFTConfig(epochs=3, lr=2e-3),
    )
    started = time.time()
    engine = LocalEngine()
    result = engine.train(config, specs)
    after = {k: v.float().cpu() for k, v in result.models["policy"].state_dict().items()}
    delta = max(float((after[k] - before[k]).abs().max()) for k in before)
    values = [v for h in result.history for v in h.values() if isinstance(v, float)]
    return (
        engine,
        specs,
        {
            "precision": engine.precision,
            "rl_steps": result.steps_done,
            "sft_epochs": sum("sft/epoch" in h for h in result.history),
            "dtype": str(next(result.models["policy"].parameters()).dtype),
            "seconds": round(time.time() - started, 1),
            "finite": all(math.isfinite(v) for v in values),
            "parameters_changed": delta > 0,
            "last": {k: v for k, v in (result.history[-1] if result.history else {}).items() if "loss" in k},
        },
    )


def rollouts_on(engine: Any, specs: list[Any]) -> dict[str, Any]:
    """One rollout batch of the SFT'd policy on its device (2 prompts x K=4, ACT and REHEARSE by the policy,
    KV-cached decoding, batched sampling) and the mean |sampling - training-forward| log-prob gap of its
    rows (the engine's opt-in ``logprob_check`` forward), without verl."""
    from envace.core.records import Role
    from envace.engines.local.batching import build_rows
    from envace.engines.local.config import OptimConfig, RolloutConfig
    from envace.engines.local.rollout import DecodeGuide, ResponseSource, RolloutRunner
    from envace.engines.local.sft import gold_targets
    from envace.engines.local.trainer import PolicyUpdater

    policy = engine.models["policy"]
    rollout = RolloutConfig(samples_per_prompt=4, max_act_tokens=96, max_rehearse_tokens=96, max_stream_tokens=2048)
    # ACT replays the gold calls (a tiny model rarely emits a parseable one), so REHEARSE decodes for real
    gold = [gold_targets(spec, engine.formatter) for spec in specs[:2]]

    def act_gold(key: Any) -> Any:
        outs = (gold[key.example] or {}).get(key.role, []) if key.role == Role.ACT else []
        return outs[key.index] if key.index < len(outs) else None

    runner = RolloutRunner(
        engine.formatter, rollout, engine.role_prompts, DecodeGuide(act_gold), precision=engine.precision
    )
    started = time.time()
    batch = runner.run(specs[:2], policy, ResponseSource(model=policy, trainable=True), seed=0, step=0)
    seconds = time.time() - started
    n_outputs = sum(len(s.outputs()) for t in batch.trajectories for s in t.streams)
    temps = {r: rollout.temperature(r) for r in Role}
    rows = build_rows(batch.trajectories, [0.0] * n_outputs, frozenset(Role), temps)
    slot = engine.slots["policy"]
    updater = PolicyUpdater(slot, OptimConfig(logprob_check=True), 0, engine.pad_id, policy.device, engine.precision)
    diff = updater.prepare(rows)
    return {
        "trajectories": len(batch.trajectories),
        "generated_tokens": int(sum(batch.generated_tokens.values())),
        "by_role": {r.name: int(n) for r, n in batch.generated_tokens.items()},
        "rows": len(rows),
        "rehearse_outputs": sum(1 for t in batch.trajectories for r, _ in t.outputs() if r == Role.REHEARSE),
        "seconds": round(seconds, 1),
        "logprob_diff": float(diff) if diff is not None else float("nan"),
    }


def eval_backend_on(engine: Any) -> dict[str, Any]:
    """The evaluation backend on the policy's device: three turns of two conversations (one with tools),
    greedy and sampled, with and without the prefix KV cache, in fp32 (must be identical) and under
    ``auto`` precision (reported: bf16 kernels may round a cached prefix differently from a fresh one)."""
    from envace.inference.base import ChatRequest
    from envace.inference.local import LocalHFBackend

    model, tok = engine.models["policy"], engine.formatter.tokenizer
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    users = ("The user wants to know the weather in Paris tomorrow.", "Then book a hotel.", "Anything else?")

    def conversation(backend: LocalHFBackend, temperature: float) -> list[tuple[str, int]]:
        chats: list[list[dict]] = [[{"role": "system", "content": "You help with travel."}] for _ in range(2)]
        outputs = []
        for text in users:
            requests = []
            for c, messages in enumerate(chats):
                messages.append({"role": "user", "content": text})
                requests.append(
                    ChatRequest(
                        messages=tuple(messages),
                        tools=tools if c == 0 else None,
                        temperature=temperature,
                        seed=c,
                        max_new_tokens=24,
                    )
                )
            for messages, out in zip(chats, backend.generate(requests)):
                messages.append({"role": "assistant", "content": out.text})
                outputs.append((out.text, out.completion_tokens))
        return outputs

    report: dict[str, Any] = {}
    for precision in ("fp32", "auto"):
        same, hits = [], 0
        for temperature in (0.0, 0.8):
            cached = LocalHFBackend(model, tok, precision=precision)
            fresh = LocalHFBackend(model, tok, precision=precision, prefix_cache_tokens=0)
            same.append(conversation(cached, temperature) == conversation(fresh, temperature))
            hits += cached.prefix_cache_hits
        name = "fp32" if precision == "fp32" else f"auto_{cached.precision}"
        report[f"{name}_same_with_and_without_cache"] = all(same)
        report[f"{name}_prefix_cache_hits"] = hits
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["verl", "bare", "organism"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=None, help="RL steps (verl, bare: 3; organism: 10)")
    parser.add_argument("--dry-run", action="store_true", help="verl mode: prepare on CPU and stop before launching")
    parser.add_argument("--device", default="cuda", help="bare, organism: 'cpu' runs the same code without a GPU")
    parser.add_argument("--precision", default=None, help="organism: fp32 (the profile's), bf16 or auto")
    parser.add_argument("--val-tasks", type=int, default=0, help="organism: validation tasks per point (0: all 100)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(1 if args.dry_run or args.device == "cpu" else 4)
    args.out.mkdir(parents=True, exist_ok=True)  # torch threads set above
    steps = args.steps if args.steps is not None else (10 if args.mode == "organism" else 3)
    if args.mode == "verl":
        report = {"mode": args.mode, **run_verl(args.out, steps, dry_run=args.dry_run)}
    elif args.mode == "organism":
        report = {"mode": args.mode, **run_organism(args.out, steps, args.device, args.precision, args.val_tasks)}
    else:
        report = {"mode": args.mode, **run_bare(args.out, steps, args.device)}
    checks = report.get("checks", {})
    report["ok"] = bool(checks) and all(checks.values()) and report.get("verl_returncode", 0) == 0
    _write_report(args.out, report)
    logger.info("report: %s", json.dumps(report, default=str)[:4000])
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
