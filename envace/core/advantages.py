"""Role-wise GRPO advantages (docs/method.md §7) and the single-baseline GRPO of the ``grpo`` variant.

What it computes. For instruction x, K trajectories are sampled. Every *output* y (one ACT
generation, or one REHEARSE generation answering one tool call) inherits the scalar reward R of its
trajectory. Outputs are grouped by (prompt group x, role r) and

    G_{x,r} = { outputs of role r across the K rollouts of x },   μ_{x,r} = mean_{y' ∈ G_{x,r}} R(y')
    A(y)    = R(y) − μ_{x, role(y)}                                       (paper, role-wise GRPO)

optionally divided by (σ_{x,r} + ε). The advantage is constant over the generated tokens of y
(``token_advantages`` broadcasts it). ``compute_grpo_advantages`` is the same with one baseline per
prompt group, whatever the role; the ``grpo`` ablation (only ACT trains) calls it with
``baseline="trajectory_mean"`` (conf/algo/grpo.yaml): μ_x = the mean of the K trajectory rewards of x,
which is standard GRPO (verl's ``compute_grpo_outcome_advantage`` on one row per trajectory).

Deliberate choices and deviations (each tested in tests/unit/core/test_advantages.py):
- Singleton group → A = 0. A (group, role) with a single member has no baseline; the reference
  implementation (and verl's ``compute_grpo_outcome_advantage``, which uses mean 0 / std 1) gives
  A = R there, i.e. an uncentred reward that pushes up whatever a lone output did. We give 0.
- ``baseline="output_mean"`` (default; the envace variants' setting) is the paper's formula as the
  reference computes it (docs/method.md §7): μ over outputs (rows), so a trajectory with many calls weighs more in
  its role's baseline. It is *not* standard GRPO: with rewards 0, 0, 0, 1 where the rewarded trajectory
  holds 5 of the 8 outputs, μ = 0.625 instead of GRPO's 0.25.
  ``baseline="trajectory_mean"`` counts each trajectory once per (group, role): μ is the mean reward
  of the trajectories that produced at least one output of that role; it needs ``trajectory_ids``.
  Under trajectory_mean "singleton" means a single such trajectory.
- ``norm_by_std`` defaults to False (as the reference; Dr. GRPO style). When True we divide by
  (σ + ε) with σ the *unbiased* (n−1) standard deviation over the baseline's members, exactly as
  verl's GRPO does (``torch.std``), so a single-role batch matches verl on groups of size ≥ 2.
- ``exclude``: outputs whose trajectory has no valid reward (judge failure, docs/method.md §5) get A = 0 and
  are not counted in any baseline. (Dropping them from the loss — zeroing their response mask — is
  the trainer's job; a zero advantage alone still lets KL and token-mean denominators see them.)
- Padding or duplication for batch shapes must happen *after* this function: padded rows would
  otherwise enter the baselines.

verl integration lives with the verl engine: ``envace.engines.verl.advantages`` wraps these functions in
verl's estimator signature and registers them (``envace_rolewise``, ``envace_grpo``) from the plugin entry
point. This module imports torch and envace.core only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from envace.core.records import Role

OUTPUT_MEAN = "output_mean"
TRAJECTORY_MEAN = "trajectory_mean"
# keys the verl estimator looks up in verl's batch / non_tensor_batch when not passed as kwargs

_VALID_ROLES = frozenset(int(r) for r in Role)


# ---- baseline members ("units") -----------------------------------------------------------------
def _output_units(
    keys: list[Hashable | None], rewards: torch.Tensor, trajectory_ids: Sequence[Hashable] | None
) -> tuple[list[Hashable | None], torch.Tensor, list[int]]:
    """Every included output is one member of its (group, role) baseline."""
    return keys, rewards, list(range(len(keys)))


def _trajectory_units(
    keys: list[Hashable | None], rewards: torch.Tensor, trajectory_ids: Sequence[Hashable] | None
) -> tuple[list[Hashable | None], torch.Tensor, list[int]]:
    """Each trajectory is one member of each (group, role) baseline it has outputs in.

    Returns (unit keys, unit rewards (U,), unit index of every output (N,), -1 when excluded).
    """
    if trajectory_ids is None:
        raise ValueError(
            f"baseline={TRAJECTORY_MEAN!r} needs trajectory_ids (one id per output); pass them, "
            f"or use baseline={OUTPUT_MEAN!r}"
        )
    if len(trajectory_ids) != len(keys):
        raise ValueError(f"trajectory_ids has {len(trajectory_ids)} entries for {len(keys)} outputs")
    unit_of: dict[tuple[Hashable, Hashable], int] = {}
    unit_keys: list[Hashable | None] = []
    unit_rewards: list[float] = []
    output_unit: list[int] = []
    reward_list = rewards.tolist()
    for i, key in enumerate(keys):
        if key is None:
            output_unit.append(-1)
            continue
        uid = (key, trajectory_ids[i])
        reward = reward_list[i]
        if uid not in unit_of:
            unit_of[uid] = len(unit_keys)
            unit_keys.append(key)
            unit_rewards.append(reward)
        elif unit_rewards[unit_of[uid]] != reward:
            raise ValueError(
                f"outputs of trajectory {trajectory_ids[i]!r} (group/role {key!r}) carry different rewards "
                f"({unit_rewards[unit_of[uid]]} vs {reward} at output {i}); every output must inherit its "
                "trajectory's reward"
            )
        output_unit.append(unit_of[uid])
    return unit_keys, torch.tensor(unit_rewards, dtype=rewards.dtype), output_unit


_BASELINES: dict[str, Callable[..., tuple[list[Hashable | None], torch.Tensor, list[int]]]] = {
    OUTPUT_MEAN: _output_units,
    TRAJECTORY_MEAN: _trajectory_units,
}


def _group_stats(
    unit_keys: list[Hashable | None], unit_rewards: torch.Tensor
) -> tuple[dict[Hashable, int], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per baseline key: (key → slot, mean (G,), unbiased std (G,), member count (G,))."""
    slot: dict[Hashable, int] = {}
    index = []
    for key in unit_keys:
        if key is not None:
            index.append(slot.setdefault(key, len(slot)))
    rows = torch.tensor([k is not None for k in unit_keys], dtype=torch.bool)
    values, idx = unit_rewards[rows], torch.tensor(index, dtype=torch.long)
    n_groups = len(slot)
    count = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, idx, torch.ones_like(values))
    mean = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, idx, values) / count.clamp(min=1)
    sq_dev = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, idx, (values - mean[idx]) ** 2)
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
    return slot, mean, std, count


def _validate(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable],
    roles: Sequence[Any],
    exclude: Sequence[bool] | torch.Tensor | None,
) -> tuple[list[int], list[bool]]:
    """Check shapes/values; return (role ids, excluded flags), one per output."""
    n = rewards.shape[0]
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one per output), got shape {tuple(rewards.shape)}")
    if len(group_ids) != n or len(roles) != n:
        raise ValueError(f"{n} rewards but {len(group_ids)} group ids and {len(roles)} roles; give one per output")
    role_ids = [int(r) for r in (roles.tolist() if isinstance(roles, torch.Tensor) else roles)]
    bad = [i for i, r in enumerate(role_ids) if r not in _VALID_ROLES]
    if bad:
        raise ValueError(
            f"outputs {bad[:5]} have role id {role_ids[bad[0]]}; valid: { {r.name: int(r) for r in Role} }"
        )
    if exclude is None:
        excluded = [False] * n
    else:
        excluded = [bool(e) for e in (exclude.tolist() if isinstance(exclude, torch.Tensor) else exclude)]
        if len(excluded) != n:
            raise ValueError(f"exclude has {len(excluded)} entries for {n} outputs")
    finite = torch.isfinite(rewards).tolist()
    nan = [i for i in range(n) if not excluded[i] and not finite[i]]
    if nan:
        raise ValueError(f"outputs {nan[:5]} have non-finite rewards; mark failed trajectories with exclude=")
    return role_ids, excluded


def compute_rolewise_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable],
    roles: Sequence[Role | int] | torch.Tensor,
    *,
    baseline: str = OUTPUT_MEAN,
    norm_by_std: bool = False,
    trajectory_ids: Sequence[Hashable] | None = None,
    exclude: Sequence[bool] | torch.Tensor | None = None,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """Role-wise GRPO advantage of every output (docs/method.md §7): A = R − μ_{group, role} [/ (σ + ε)].

    Args:
        rewards: (N,) trajectory reward inherited by each output.
        group_ids: N hashable prompt-group ids (the K rollouts of one instruction share one).
        roles: N ``Role`` values (or their int ids) — the role that generated each output.
        baseline: ``"output_mean"`` (μ over outputs) or ``"trajectory_mean"`` (μ over trajectories).
        norm_by_std: divide by (unbiased σ + epsilon) of the same members.
        trajectory_ids: N trajectory ids; required for ``"trajectory_mean"``.
        exclude: (N,) bool; True → A = 0 and not counted in baselines (e.g. judge failed).
    Returns:
        (N,) float advantages (float32 unless ``rewards`` is float64). Singleton baselines give 0.
    """
    if baseline not in _BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; valid options: {sorted(_BASELINES)}")
    rewards = torch.as_tensor(rewards).detach()
    device, rewards = rewards.device, rewards.cpu()
    rewards = rewards.double() if rewards.dtype == torch.float64 else rewards.float()
    role_ids, excluded = _validate(rewards, group_ids, roles, exclude)
    keys: list[Hashable | None] = [None if excluded[i] else (group_ids[i], role_ids[i]) for i in range(len(role_ids))]
    unit_keys, unit_rewards, output_unit = _BASELINES[baseline](keys, rewards, trajectory_ids)
    if all(k is None for k in unit_keys):
        return torch.zeros_like(rewards).to(device)
    slot, mean, std, count = _group_stats(unit_keys, unit_rewards)
    out_slot = torch.tensor([-1 if k is None else slot[k] for k in keys], dtype=torch.long)
    safe_slot = out_slot.clamp(min=0)
    centred = unit_rewards[torch.tensor(output_unit, dtype=torch.long).clamp(min=0)] - mean[safe_slot]
    if norm_by_std:
        centred = centred / (std[safe_slot] + epsilon)
    has_baseline = (out_slot >= 0) & (count[safe_slot] >= 2)  # excluded or singleton -> 0
    return torch.where(has_baseline, centred, torch.zeros_like(centred)).to(device)


def compute_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = False,
    baseline: str = OUTPUT_MEAN,
    trajectory_ids: Sequence[Hashable] | None = None,
    exclude: Sequence[bool] | torch.Tensor | None = None,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """Standard GRPO: one baseline per prompt group over all outputs (or trajectories), any role.

    Same conventions as ``compute_rolewise_advantages`` (singleton → 0, unbiased σ). (N,) → (N,).
    """
    roles = [int(Role.ACT)] * len(group_ids)
    return compute_rolewise_advantages(
        rewards,
        group_ids,
        roles,
        baseline=baseline,
        norm_by_std=norm_by_std,
        trajectory_ids=trajectory_ids,
        exclude=exclude,
        epsilon=epsilon,
    )


def token_advantages(output_advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-output advantages (N,) over generated tokens: (N, L) = A[:, None] * mask."""
    if response_mask.dim() != 2 or response_mask.shape[0] != output_advantages.shape[0]:
        raise ValueError(
            f"response_mask must be (N, L) with N={output_advantages.shape[0]}, got {tuple(response_mask.shape)}"
        )
    dtype = output_advantages.dtype if output_advantages.is_floating_point() else torch.float32
    return output_advantages.to(dtype).unsqueeze(-1) * response_mask.to(output_advantages.device, dtype)


def count_output_spans(response_mask: torch.Tensor) -> torch.Tensor:
    """Number of generated outputs per row = maximal runs of mask 1. (bs, L) → (bs,) long.

    Use it as ``outputs_per_row`` when one row packs a whole role stream (several outputs separated by
    observation/scaffold tokens), so that ``output_mean`` still weighs every output once.
    """
    mask = response_mask.to(torch.bool)
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    return starts.sum(dim=-1)
