"""Local engine with LoRA on the tiny model and the tool world (guided rollouts as in test_local_engine):
only adapter tensors change; kill + resume reproduces the uninterrupted run's adapters bit for bit
(checkpoints hold the adapters only); the merged export loads as a plain HF model with the trained
model's logits, next to peft's adapter directory; per_role with a KL reference adapts both models."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM

from envace.core.records import TrajectoryStatus
from envace.core.reward import RewardOutcome
from envace.data.specs import executor_factory_for
from envace.engines import get_engine
from envace.engines.local import LocalEngineConfig, OptimConfig, RolloutConfig
from envace.engines.local.checkpoint import load_latest
from envace.engines.local.lora import adapter_keys
from envace.engines.lora import LoraSpec
from envace.envs.toolworld.reward import toolworld_verifiable_reward
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)

TINY = ModelSpec(kind="tiny", seed=3)  # the guided_world fixture's model
LORA = LoraSpec(
    rank=4,
    alpha=8,
    target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    dropout=0.0,
)
CFG = LocalEngineConfig(
    model=TINY,
    steps=2,
    prompts_per_step=1,
    seed=5,
    progress=False,
    lora=LORA,
    checkpoint_every=1,
    rollout=RolloutConfig(samples_per_prompt=3, max_act_tokens=80, max_rehearse_tokens=72, max_stream_tokens=2048),
    optim=OptimConfig(lr=1e-2, micro_batch_streams=8),
)


def varied_reward(spec, traj):
    """Verifiable reward plus a deterministic per-trajectory term, so that every group has spread."""
    text = "".join(seg.text for _, seg in traj.outputs())
    jitter = (zlib.crc32(text.encode()) % 11) / 10
    return RewardOutcome(0.5 * toolworld_verifiable_reward(spec, traj).reward + 0.5 * jitter, TrajectoryStatus.OK, {})


def _train(world, cfg):
    engine = get_engine(
        "local",
        reward_fn=varied_reward,
        guide=world["guide"],
        executor_factory=executor_factory_for(world["env"].make_executor, world["tasks"]),
    )
    return engine.train(cfg, world["specs"])


def _adapters(model) -> dict[str, torch.Tensor]:
    keys = adapter_keys(model)
    return {k: v for k, v in model.state_dict().items() if k in keys}


def _base_unchanged(model, initial) -> bool:
    """Every non-adapter tensor equals the initial model's (peft renames ``x.weight`` to ``x.base_layer.weight``)."""
    keys = adapter_keys(model)
    base = {k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if k not in keys}
    return base.keys() == initial.keys() and all(torch.equal(v, initial[k]) for k, v in base.items())


@pytest.fixture(scope="module")
def runs(guided_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    full = _train(guided_world, replace(CFG, output_dir=str(root / "full")))
    killed = _train(guided_world, replace(CFG, output_dir=str(root / "resumed"), stop_after_steps=1))
    resumed = _train(guided_world, replace(CFG, output_dir=str(root / "resumed")))
    return {"root": root, "full": full, "killed": killed, "resumed": resumed}


@pytest.fixture(scope="module")
def initial():
    return load_model_and_tokenizer(TINY)[0].state_dict()


def test_only_adapter_tensors_change(runs, initial):
    model = runs["full"].models["policy"]
    assert _base_unchanged(model, initial)
    lora_b = [v for k, v in _adapters(model).items() if ".lora_B." in k]
    assert len(lora_b) == 2 * 7 and all(v.abs().max() > 0 for v in lora_b)  # B starts at zero
    assert {n for n, p in model.named_parameters() if p.requires_grad} == adapter_keys(model)


def test_kill_and_resume_reproduces_the_adapters_exactly(runs, guided_world):
    assert runs["killed"].steps_done == 1 and runs["resumed"].steps_done == 2
    assert [m["step"] for m in runs["resumed"].history] == [1.0, 2.0]
    a, b = _adapters(runs["full"].models["policy"]), _adapters(runs["resumed"].models["policy"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ckpt = load_latest(runs["root"] / "resumed" / "checkpoints")
    assert set(ckpt.model_state("policy")) == set(a) and ckpt.state["lora"]["rank"] == 4
    with pytest.raises(ValueError, match="algo.lora_"):
        _train(guided_world, replace(CFG, output_dir=str(runs["root"] / "resumed"), lora=replace(LORA, rank=2)))


def test_merged_export_gives_the_trained_logits_and_the_adapter_sits_beside_it(runs):
    final = runs["root"] / "full" / "final"
    assert runs["full"].artifacts == {"policy": str(final / "policy"), "policy-adapter": str(final / "policy-adapter")}
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad():
        trained = runs["full"].models["policy"].eval()(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(final / "policy", dtype=torch.float32).eval()
        assert not adapter_keys(merged)
        base, _ = load_model_and_tokenizer(TINY)
        adapted = peft.PeftModel.from_pretrained(base, final / "policy-adapter").eval()
        assert torch.allclose(merged(input_ids=ids).logits, trained, atol=1e-5, rtol=0)
        assert torch.allclose(adapted(input_ids=ids).logits, trained, atol=1e-5, rtol=0)
    assert json.loads((final / "policy-adapter" / "adapter_config.json").read_text())["r"] == 4


def test_per_role_with_kl_reference_adapts_both_models(guided_world, initial):
    result = _train(
        guided_world,
        replace(CFG, variant="per_role", steps=2, checkpoint_every=0, optim=replace(CFG.optim, kl_coef=0.05)),
    )
    act, rehearse = result.models["act"], result.models["rehearse"]
    assert _base_unchanged(act, initial) and _base_unchanged(rehearse, initial)
    a, r = _adapters(act), _adapters(rehearse)
    assert any(v.abs().max() > 0 for k, v in a.items() if ".lora_B." in k)
    assert any(v.abs().max() > 0 for k, v in r.items() if ".lora_B." in k)
    assert any(not torch.equal(a[k], r[k]) for k in a)
    assert result.history[-1]["act/kl"] > 0 and result.history[-1]["rehearse/kl"] > 0
