"""Role-wise GRPO advantages: hand-computed numbers, options, errors, and equivalence with verl's GRPO."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.config.load import compose
from envace.core.advantages import (
    compute_grpo_advantages,
    compute_rolewise_advantages,
    count_output_spans,
    token_advantages,
)
from envace.core.records import Role, Segment, Stream, Trajectory
from envace.engines.base import get_variant
from envace.engines.local.trainer import compute_output_advantages
from envace.engines.verl.advantages import verl_grpo_advantage
from envace.engines.verl.config_builder import loop_settings
from envace.stages.train_setup import local_engine_config

ACT, REH = Role.ACT, Role.REHEARSE


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


# Two prompts. p0: t0 (R=1: 2 ACT, 1 REHEARSE), t1 (R=0: 1 ACT, 2 REHEARSE), t2 (R=0.5: 1 ACT, final reply).
# p1: t3 (R=0.2: 1 ACT, 1 REHEARSE), t4 (R=0.8: 1 ACT). One row per output.
OUTPUTS = [
    ("p0", "t0", ACT, 1.0),
    ("p0", "t0", ACT, 1.0),
    ("p0", "t0", REH, 1.0),
    ("p0", "t1", ACT, 0.0),
    ("p0", "t1", REH, 0.0),
    ("p0", "t1", REH, 0.0),
    ("p0", "t2", ACT, 0.5),
    ("p1", "t3", ACT, 0.2),
    ("p1", "t3", REH, 0.2),
    ("p1", "t4", ACT, 0.8),
]
GROUPS = [o[0] for o in OUTPUTS]
TRAJS = [o[1] for o in OUTPUTS]
ROLES = [o[2] for o in OUTPUTS]
REWARDS = torch.tensor([o[3] for o in OUTPUTS])


def rolewise(**kwargs) -> list[float]:
    return compute_rolewise_advantages(REWARDS, GROUPS, ROLES, **kwargs).tolist()


def test_output_mean_by_hand() -> None:
    # (p0,ACT): μ=(1+1+0+0.5)/4=0.625; (p0,REH): μ=1/3; (p1,ACT): μ=0.5; (p1,REH): singleton → 0
    expected = [0.375, 0.375, 2 / 3, -0.625, -1 / 3, -1 / 3, -0.125, -0.3, 0.0, 0.3]
    assert rolewise() == pytest.approx(expected, abs=1e-6)


def test_trajectory_mean_by_hand() -> None:
    # (p0,ACT): trajectories t0,t1,t2 → μ=0.5; (p0,REH): t0,t1 → μ=0.5; (p1,ACT): μ=0.5;
    # (p1,REH): a single trajectory → 0
    expected = [0.5, 0.5, 0.5, -0.5, -0.5, -0.5, 0.0, -0.3, 0.0, 0.3]
    assert rolewise(baseline="trajectory_mean", trajectory_ids=TRAJS) == pytest.approx(expected, abs=1e-6)


def test_norm_by_std_uses_unbiased_std() -> None:
    s_act = math.sqrt((0.375**2 * 2 + 0.625**2 + 0.125**2) / 3)
    s_reh = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    s_p1 = math.sqrt(2 * 0.3**2 / 1)
    eps = 1e-6
    expected = [
        0.375 / (s_act + eps),
        0.375 / (s_act + eps),
        (2 / 3) / (s_reh + eps),
        -0.625 / (s_act + eps),
        -(1 / 3) / (s_reh + eps),
        -(1 / 3) / (s_reh + eps),
        -0.125 / (s_act + eps),
        -0.3 / (s_p1 + eps),
        0.0,
        0.3 / (s_p1 + eps),
    ]
    assert rolewise(norm_by_std=True) == pytest.approx(expected, abs=1e-5)


def test_norm_by_std_trajectory_mean() -> None:
    s3 = math.sqrt((0.5**2 * 2) / 2)  # {1, 0, 0.5}: deviations .5, -.5, 0 → var = 0.5/2
    s2 = math.sqrt(0.5**2 * 2 / 1)  # {1, 0}
    s_p1 = math.sqrt(2 * 0.3**2)
    got = rolewise(baseline="trajectory_mean", trajectory_ids=TRAJS, norm_by_std=True)
    expected = [0.5 / s3, 0.5 / s3, 0.5 / s2, -0.5 / s3, -0.5 / s2, -0.5 / s2, 0.0, -0.3 / s_p1, 0.0, 0.3 / s_p1]
    assert got == pytest.approx(expected, abs=1e-5)


def test_exclusion_drops_outputs_from_baselines() -> None:
    exclude = [t == "t1" for t in TRAJS]  # t1's judge failed
    # (p0,ACT): {1, 1, 0.5} μ=5/6; (p0,REH): only t0 left → singleton → 0
    expected = [1 / 6, 1 / 6, 0.0, 0.0, 0.0, 0.0, -1 / 3, -0.3, 0.0, 0.3]
    assert rolewise(exclude=exclude) == pytest.approx(expected, abs=1e-6)
    assert rolewise(exclude=torch.tensor(exclude)) == pytest.approx(expected, abs=1e-6)
    got = rolewise(exclude=exclude, baseline="trajectory_mean", trajectory_ids=TRAJS)
    assert got == pytest.approx([0.25, 0.25, 0.0, 0.0, 0.0, 0.0, -0.25, -0.3, 0.0, 0.3], abs=1e-6)


def test_excluded_rewards_may_be_nan() -> None:
    rewards = torch.tensor([1.0, float("nan"), 0.0])
    got = compute_rolewise_advantages(rewards, ["g"] * 3, [ACT] * 3, exclude=[False, True, False])
    assert got.tolist() == pytest.approx([0.5, 0.0, -0.5])
    with pytest.raises(ValueError, match="non-finite"):
        compute_rolewise_advantages(rewards, ["g"] * 3, [ACT] * 3)


def test_singleton_groups_get_zero() -> None:
    got = compute_rolewise_advantages(torch.tensor([0.7, 0.3]), ["a", "b"], [ACT, REH], norm_by_std=True)
    assert got.tolist() == [0.0, 0.0]
    # one trajectory with two outputs of a role: two outputs under output_mean, but one trajectory
    two = compute_rolewise_advantages(
        torch.tensor([0.7, 0.7]), ["a", "a"], [ACT, ACT], baseline="trajectory_mean", trajectory_ids=["t", "t"]
    )
    assert two.tolist() == [0.0, 0.0]


def test_role_inputs_interchangeable() -> None:
    as_ints = compute_rolewise_advantages(REWARDS, GROUPS, [int(r) for r in ROLES])
    as_tensor = compute_rolewise_advantages(REWARDS, GROUPS, torch.tensor([int(r) for r in ROLES]))
    assert torch.equal(as_ints, as_tensor) and as_ints.tolist() == rolewise()


def test_grpo_single_baseline_by_hand() -> None:
    out = compute_grpo_advantages(REWARDS, GROUPS)
    # p0: 7 outputs, μ=3.5/7=0.5; p1: {0.2, 0.2, 0.8} μ=0.4
    assert out.tolist() == pytest.approx([0.5, 0.5, 0.5, -0.5, -0.5, -0.5, 0.0, -0.2, -0.2, 0.4], abs=1e-6)
    traj = compute_grpo_advantages(REWARDS, GROUPS, baseline="trajectory_mean", trajectory_ids=TRAJS)
    assert traj.tolist() == pytest.approx([0.5, 0.5, 0.5, -0.5, -0.5, -0.5, 0.0, -0.3, -0.3, 0.3], abs=1e-6)


def test_dtype_and_empty() -> None:
    assert compute_rolewise_advantages(REWARDS.double(), GROUPS, ROLES).dtype == torch.float64
    assert compute_rolewise_advantages(REWARDS, GROUPS, ROLES).dtype == torch.float32
    assert compute_rolewise_advantages(torch.zeros(0), [], []).shape == (0,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"baseline": "prompt_mean"}, r"valid options: \['output_mean', 'trajectory_mean'\]"),
        ({"baseline": "trajectory_mean"}, "needs trajectory_ids"),
        ({"baseline": "trajectory_mean", "trajectory_ids": ["t"] * 3}, "3 entries for 10 outputs"),
        ({"exclude": [False]}, "exclude has 1 entries"),
    ],
)
def test_option_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rolewise(**kwargs)


def test_input_errors() -> None:
    with pytest.raises(ValueError, match="one per output"):
        compute_rolewise_advantages(REWARDS, GROUPS[:-1], ROLES)
    with pytest.raises(ValueError, match="role id -1"):
        compute_rolewise_advantages(torch.tensor([1.0, 0.0]), ["g", "g"], [0, -1])
    with pytest.raises(ValueError, match="1-D"):
        compute_rolewise_advantages(torch.zeros(2, 2), ["g", "g"], [0, 0])
    with pytest.raises(ValueError, match="different rewards"):
        compute_rolewise_advantages(
            torch.tensor([1.0, 0.0, 1.0]),
            ["g"] * 3,
            [0] * 3,
            baseline="trajectory_mean",
            trajectory_ids=["t", "t", "u"],
        )


def test_token_advantages_and_spans() -> None:
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1]])
    got = token_advantages(torch.tensor([0.5, 2.0, -1.0]), mask)
    assert got.tolist() == [[0.5, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0], [0.0, -1.0, -1.0, -1.0]]
    assert count_output_spans(mask).tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="response_mask must be"):
        token_advantages(torch.zeros(2), mask)


# ---- properties -------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.sampled_from([0, 1]), st.integers(1, 3)),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.floats(0, 1), min_size=12, max_size=12),
)
def test_baselines_centre_every_group(rows: list[tuple[int, int, int, int]], traj_rewards: list[float]) -> None:
    """Within each (group, role): advantages sum to 0 over outputs (output_mean) or trajectories."""
    group_ids = [g for g, _, _, _ in rows]
    traj_ids = [(g, t) for g, t, _, _ in rows]
    roles = [r for _, _, r, _ in rows]
    rewards = torch.tensor([traj_rewards[g * 4 + t] for g, t, _, _ in rows], dtype=torch.float64)
    per_output = compute_rolewise_advantages(rewards, group_ids, roles)
    per_traj = compute_rolewise_advantages(
        rewards, group_ids, roles, baseline="trajectory_mean", trajectory_ids=traj_ids
    )
    members: dict[tuple, list[int]] = defaultdict(list)
    for i, (g, _, r, _) in enumerate(rows):
        members[(g, r)].append(i)
    for idx in members.values():
        assert abs(float(per_output[idx].sum())) < 1e-9
        first_of_traj = {traj_ids[i]: i for i in reversed(idx)}
        assert abs(float(per_traj[list(first_of_traj.values())].sum())) < 1e-9
        if len(first_of_traj) == 1:
            assert per_traj[idx].abs().max() == 0


# ---- equivalence with verl ------------------------------------------------------------------------------
def _verl_batch(group_sizes: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, torch.Tensor]:
    """Outcome rewards on the last generated token; random response lengths."""
    gen = torch.Generator().manual_seed(seed)
    n, length = sum(group_sizes), 7
    lengths = torch.randint(1, length + 1, (n,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    scores = torch.rand(n, generator=gen).round(decimals=1)
    token_rewards = torch.zeros(n, length)
    token_rewards[torch.arange(n), lengths - 1] = scores
    index = np.array([f"uid{g}" for g, size in enumerate(group_sizes) for _ in range(size)], dtype=object)
    return token_rewards, mask, index, scores


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_role_equals_verl_grpo(norm: bool, seed: int) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards, mask, index, scores = _verl_batch([2, 3, 4, 5], seed)
    verl_adv, _ = compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm)
    ours = compute_rolewise_advantages(scores, list(index), [ACT] * len(index), norm_by_std=norm, epsilon=1e-6)
    assert torch.allclose(token_advantages(ours, mask), verl_adv, atol=1e-5)
    assert torch.equal(compute_grpo_advantages(scores, list(index), norm_by_std=norm), ours)


def test_rolewise_equals_verl_grpo_per_role() -> None:
    """Role-wise GRPO = verl's GRPO run on each role's outputs separately (groups of size >= 2)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards, mask, index, scores = _verl_batch([4, 6, 4], seed=3)
    roles = torch.tensor([0, 1] * 7)
    ours = token_advantages(compute_rolewise_advantages(scores, list(index), roles), mask)
    for role in (0, 1):
        rows = (roles == role).nonzero().flatten()
        verl_adv, _ = compute_grpo_outcome_advantage(
            token_rewards[rows], mask[rows], index[rows.numpy()], norm_adv_by_std_in_grpo=False
        )
        assert torch.allclose(ours[rows], verl_adv, atol=1e-6)


def test_singleton_differs_from_verl_by_design() -> None:
    """verl treats a lone output as mean 0 / std 1 (A = R); we give A = 0 (documented deviation)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards = torch.tensor([[0.0, 0.8]])
    mask = torch.ones(1, 2)
    verl_adv, _ = compute_grpo_outcome_advantage(
        token_rewards, mask, np.array(["u"], dtype=object), norm_adv_by_std_in_grpo=False
    )
    assert verl_adv[0].tolist() == pytest.approx([0.8, 0.8])
    assert compute_rolewise_advantages(torch.tensor([0.8]), ["u"], [ACT]).tolist() == [0.0]


# (prompt group, trajectory reward, ACT outputs): in group x the rewarded trajectory holds 5 of the 8 ACT
# outputs, so a mean over outputs gives 0.625 where the mean of the K trajectory rewards is 0.25
TOY_GROUPS = [("x", 0.0, 1), ("x", 0.0, 1), ("x", 0.0, 1), ("x", 1.0, 5), ("y", 0.2, 3), ("y", 0.6, 1), ("y", 1.0, 2)]


def _toy_trajectories() -> list[Trajectory]:
    """One ACT stream per trajectory: a prompt segment, then its ACT outputs (one token each)."""
    return [
        Trajectory(
            prompt_id=group,
            sample_index=i,
            streams=(Stream(Role.ACT, (Segment((0,)), *[Segment((1,), role=ACT)] * n)),),
            reward=reward,
        )
        for i, (group, reward, n) in enumerate(TOY_GROUPS)
    ]


@pytest.mark.parametrize("norm", [False, True])
def test_grpo_baseline_is_trajectory_mean(norm: bool, tmp_path) -> None:
    """The grpo arm as configured (conf/algo/grpo.yaml) is standard GRPO on both engines: verl's GRPO over one
    row per trajectory, broadcast to the trajectory's ACT outputs, however many outputs each trajectory has."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # lazy: verl loads ray

    cfg = compose(["algo=grpo", f"algo.norm_by_std={norm}"])
    counts = torch.tensor([n for _, _, n in TOY_GROUPS])
    index = np.array([g for g, _, _ in TOY_GROUPS], dtype=object)
    token_rewards, mask = torch.tensor([[r] for _, r, _ in TOY_GROUPS]), torch.ones(len(TOY_GROUPS), 1)
    verl_rows, _ = compute_grpo_outcome_advantage(
        token_rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm
    )
    expected = verl_rows[:, 0].repeat_interleave(counts)
    if not norm:  # group x: baseline 0.25, so the rewarded trajectory gets 0.75 and the others -0.25
        assert expected[:8].tolist() == pytest.approx([-0.25] * 3 + [0.75] * 5)

    local = local_engine_config(cfg, tmp_path, None)  # the local engine's path: trainer.compute_output_advantages
    trajectories = _toy_trajectories()
    got = compute_output_advantages(trajectories, index.tolist(), get_variant(local.variant), local.optim)
    torch.testing.assert_close(got.values, expected, atol=1e-5, rtol=0)

    rows, _ = verl_grpo_advantage(  # the verl engine's path: one ACT row per trajectory, its outputs counted
        token_rewards,
        mask,
        index,
        config={"norm_adv_by_std_in_grpo": cfg.algo.norm_by_std},
        trajectory_ids=[f"t{i}" for i in range(len(TOY_GROUPS))],
        outputs_per_row=counts,
        baseline=loop_settings(cfg).baseline,
    )
    torch.testing.assert_close(rows[:, 0], verl_rows[:, 0], atol=1e-5, rtol=0)
