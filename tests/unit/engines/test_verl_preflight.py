"""Checks before a verl launch (envace.engines.verl.preflight and check_supported), on CPU: each refusal or
warning names the numbers and the key to change, and the memory estimate's parts are exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envace.config.load import compose
from envace.engines.verl.config_builder import VerlConfigError
from envace.engines.verl.launcher import plan_launch
from envace.engines.verl.preflight import GIB, ModelShape, estimate_actor_memory, memory_warning

QWEN3_8B = {  # the sizes of Qwen3-8B's config.json the estimate reads
    "vocab_size": 151936,
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": False,
}


def paper_cfg(tmp_path: Path, *overrides: str) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(QWEN3_8B))
    cfg = compose(["profile=paper", "engine=verl", f"model.path={model}", "tracking=none", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def plan(tmp_path: Path, *overrides: str):
    return plan_launch(paper_cfg(tmp_path, *overrides), output_dir=tmp_path / "run", dry_run=True)


def test_update_rows_must_split_over_the_data_parallel_ranks(tmp_path: Path) -> None:
    plan(tmp_path)  # paper: 16 prompts x 2 rows x 4 samples = 128 rows over 2 x 8 GPUs
    with pytest.raises(VerlConfigError) as refused:
        plan(tmp_path, "engine.nnodes=1", "engine.n_gpus_per_node=6")
    message = str(refused.value)
    assert "ppo_mini_batch_size 32 × rollout.n 4 = 128" in message and "6 data-parallel ranks" in message
    assert "rollout.prompts_per_step" in message and "engine.n_gpus_per_node" in message


def test_a_micro_batch_must_hold_the_longest_row(tmp_path: Path) -> None:
    with pytest.raises(VerlConfigError) as refused:
        plan(tmp_path, "engine.max_token_len_per_gpu=16384")
    message = str(refused.value)
    assert "=16384 (engine.max_token_len_per_gpu) is below the longest row, max_model_len=20480" in message
    assert "engine.max_token_len_per_gpu" in message


def test_memory_estimate_parts_are_exact(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    shape = ModelShape.from_model_dir(tmp_path)
    assert shape.parameters == 8_190_427_136  # Qwen3-8B: 8.19 B (norms left out)
    estimate = estimate_actor_memory(40960, shape, gpus=16, lora=False, checkpointing=True, fused_cross_entropy=True)
    assert estimate.logits == 40960 * 151936 * 4 == 24_893_194_240  # ~25 GB of logits alone
    assert estimate.activations == 36 * 40960 * 4096 * 2 + 2 * 40960 * (6 * 4096 + 4 * 12288) * 2
    assert estimate.model_states == 8_190_427_136  # 16 bytes a parameter over 16 GPUs
    assert round(estimate.total / GIB, 1) == 53.3
    unfused = estimate_actor_memory(40960, shape, gpus=16, lora=False, checkpointing=True, fused_cross_entropy=False)
    assert unfused.logits == 40960 * 151936 * 6
    lora = estimate_actor_memory(40960, shape, gpus=16, lora=True, checkpointing=False, fused_cross_entropy=True)
    assert lora.model_states == 8_190_427_136 // 4 and lora.activations == 36 * 40960 * (6 * 4096 + 4 * 12288) * 2
    assert ModelShape.from_model_dir(tmp_path / "absent") is None


def test_memory_warning_names_the_numbers_and_the_keys(tmp_path: Path) -> None:
    from envace.engines.verl.config_builder import compose_verl_config

    one_node = plan(tmp_path, "engine.nnodes=1", "engine.n_gpus_per_node=4")  # model states over 4 GPUs
    warning = next(note for note in one_node.notes if note.startswith("warning:"))
    assert "40960 tokens per micro-batch" in warning and "vocabulary 151936" in warning
    assert "engine.gpu_memory_gib=80" in warning and "80.0 GiB" in warning
    for key in ("engine.max_token_len_per_gpu", "engine.n_gpus_per_node", "algo.lora_rank"):
        assert key in warning
    vc = compose_verl_config(plan(tmp_path).overrides)  # the paper's 2 x 8 GPUs
    assert memory_warning(vc, 80 * GIB, "an H100", fused_cross_entropy=True) is None  # 53.3 of 80 GiB
    assert "model states 7.6" in memory_warning(vc, 40 * GIB, "an A100-40GB", fused_cross_entropy=True)


def test_grpo_on_cm2_needs_a_simulator_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVACE_SIMULATOR_URL", raising=False)
    monkeypatch.delenv("ENVACE_SIMULATOR_MODEL", raising=False)
    with pytest.raises(VerlConfigError, match="has no executable environment") as executor:
        plan(tmp_path, "algo=grpo", "algo.grpo_responses=executor")
    assert "data.source=cm2" in str(executor.value) and "algo.grpo_responses=simulator" in str(executor.value)
    with pytest.raises(VerlConfigError, match="none is set") as simulator:
        plan(tmp_path, "algo=grpo", "algo.grpo_responses=simulator")
    assert "engine.simulator.base_url" in str(simulator.value) and "engine.simulator.model" in str(simulator.value)
    given = ("algo=grpo", "algo.grpo_responses=simulator", "engine.simulator.base_url=http://sim/v1")
    plan(tmp_path, *given, "engine.simulator.model=frozen")
