"""verl registry integration (CPU): envace_rolewise / envace_grpo behave like the direct functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos

from envace.core.advantages import (
    compute_grpo_advantages,
    compute_rolewise_advantages,
    count_output_spans,
    token_advantages,
)
from envace.core.records import NO_ROLE
from envace.engines.verl.advantages import register_with_verl, verl_grpo_advantage, verl_rolewise_advantage
from envace.engines.verl.rows import ROLE_IDS_KEY


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def batch() -> dict:
    """6 rows, 2 prompt groups, mixed roles; rewards on the last generated token, role ids on generated tokens."""
    mask = torch.tensor(
        [
            [1, 1, 1, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 1],
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
        ],
        dtype=torch.float32,
    )
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.4, 0.6, 0.6])
    roles = [0, 1, 0, 0, 0, 1]
    token_rewards = torch.zeros_like(mask)
    last = mask.sum(-1).long() - 1
    token_rewards[torch.arange(6), last] = rewards
    role_ids = torch.where(mask.bool(), torch.tensor(roles)[:, None].expand_as(mask), torch.tensor(NO_ROLE))
    index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    return {
        "token_level_rewards": token_rewards,
        "response_mask": mask,
        "index": index,
        "role_ids": role_ids,
        "rewards": rewards,
        "roles": roles,
        "trajs": ["a0", "a0", "a1", "b0", "b1", "b1"],
    }


def test_register_is_idempotent_and_resolvable() -> None:
    first = register_with_verl()
    second = register_with_verl()
    assert first == second
    assert core_algos.get_adv_estimator_fn("envace_rolewise") is verl_rolewise_advantage
    assert core_algos.get_adv_estimator_fn("envace_grpo") is verl_grpo_advantage
    with pytest.raises(ValueError, match="already been registered"):
        core_algos.register_adv_est("envace_rolewise")(lambda **kw: None)
    assert core_algos.get_adv_estimator_fn("envace_rolewise") is verl_rolewise_advantage


def test_registered_estimator_matches_direct_call(batch: dict) -> None:
    from verl.trainer.config import AlgoConfig

    register_with_verl()
    fn = core_algos.get_adv_estimator_fn("envace_rolewise")
    config = AlgoConfig(adv_estimator="envace_rolewise", norm_adv_by_std_in_grpo=False)
    # the kwargs verl's compute_advantage passes, plus the role ids envace adds
    adv, returns = fn(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        index=batch["index"],
        config=config,
        role_ids=batch["role_ids"],
    )
    direct = compute_rolewise_advantages(batch["rewards"], list(batch["index"]), batch["roles"])
    # (a,ACT): {1, 0} μ=.5; (a,REH): singleton; (b,ACT): {.4, .6} μ=.5; (b,REH): singleton
    assert direct.tolist() == pytest.approx([0.5, 0.0, -0.5, -0.1, 0.1, 0.0], abs=1e-6)
    assert torch.allclose(adv, token_advantages(direct, batch["response_mask"]))
    assert adv is returns and adv.shape == batch["response_mask"].shape


def test_config_and_kwargs_select_options(batch: dict) -> None:
    from verl.trainer.config import AlgoConfig

    common = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"],
        "index": batch["index"],
        "role_ids": batch["role_ids"],
    }
    normed, _ = verl_rolewise_advantage(config=AlgoConfig(norm_adv_by_std_in_grpo=True), **common)
    direct = compute_rolewise_advantages(batch["rewards"], list(batch["index"]), batch["roles"], norm_by_std=True)
    assert torch.allclose(normed, token_advantages(direct, batch["response_mask"]))
    by_traj, _ = verl_rolewise_advantage(
        baseline="trajectory_mean", trajectory_ids=batch["trajs"], norm_adv_by_std_in_grpo=False, **common
    )
    direct = compute_rolewise_advantages(
        batch["rewards"],
        list(batch["index"]),
        batch["roles"],
        baseline="trajectory_mean",
        trajectory_ids=batch["trajs"],
    )
    assert torch.allclose(by_traj, token_advantages(direct, batch["response_mask"]))


def test_batch_dict_fallbacks_and_exclusion(batch: dict) -> None:
    exclude = torch.tensor([False, False, True, False, False, False])
    adv, _ = verl_rolewise_advantage(
        batch["token_level_rewards"],
        batch["response_mask"],
        config=None,
        batch={ROLE_IDS_KEY: batch["role_ids"], "exclude_from_loss": exclude},
        non_tensor_batch={"uid": batch["index"]},
    )
    direct = compute_rolewise_advantages(batch["rewards"], list(batch["index"]), batch["roles"], exclude=exclude)
    assert torch.allclose(adv, token_advantages(direct, batch["response_mask"]))
    assert adv[:3].abs().sum() == 0  # group a's ACT baseline lost its second member


def test_empty_rows_are_excluded(batch: dict) -> None:
    mask = batch["response_mask"].clone()
    mask[2] = 0  # a padding row: no generated tokens
    adv, _ = verl_rolewise_advantage(batch["token_level_rewards"], mask, batch["index"], role_ids=batch["role_ids"])
    assert adv[0].abs().sum() == 0 and adv[2].abs().sum() == 0  # (a,ACT) became a singleton


def test_packed_rows_count_every_output() -> None:
    """A row holding a whole stream of 2 outputs weighs like 2 one-output rows under output_mean."""
    packed_mask = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float32)
    counts = count_output_spans(packed_mask)
    assert counts.tolist() == [2, 1]
    token_rewards = torch.zeros(2, 5)
    token_rewards[0, 4], token_rewards[1, 1] = 1.0, 0.0
    role_ids = torch.zeros(2, 5, dtype=torch.long)
    index = np.array(["g", "g"], dtype=object)
    adv, _ = verl_rolewise_advantage(token_rewards, packed_mask, index, role_ids=role_ids, outputs_per_row=counts)
    # outputs {1, 1, 0}: μ = 2/3
    assert adv[0, 0].item() == pytest.approx(1 / 3) and adv[1, 0].item() == pytest.approx(-2 / 3)
    unpacked, _ = verl_rolewise_advantage(token_rewards, packed_mask, index, role_ids=role_ids)
    assert unpacked[0, 0].item() == pytest.approx(0.5)


def test_grpo_estimator_ignores_roles(batch: dict) -> None:
    adv, _ = verl_grpo_advantage(
        batch["token_level_rewards"], batch["response_mask"], batch["index"], role_ids=batch["role_ids"]
    )
    direct = compute_grpo_advantages(batch["rewards"], list(batch["index"]))
    assert torch.allclose(adv, token_advantages(direct, batch["response_mask"]))


def test_actionable_errors(batch: dict) -> None:
    common = {"token_level_rewards": batch["token_level_rewards"], "response_mask": batch["response_mask"]}
    with pytest.raises(ValueError, match="role_ids"):
        verl_rolewise_advantage(index=batch["index"], **common)
    with pytest.raises(ValueError, match="group ids missing"):
        verl_rolewise_advantage(role_ids=batch["role_ids"], **common)
    mixed = batch["role_ids"].clone()
    mixed[0, 0] = 1
    with pytest.raises(ValueError, match=r"rows \[0\] mix roles"):
        verl_rolewise_advantage(index=batch["index"], role_ids=mixed, **common)
