"""verl's side of the role-wise estimator: envace.core.advantages in verl's advantage-estimator signature.

``verl_rolewise_advantage`` (registered as ``envace_rolewise``) and ``verl_grpo_advantage``
(``envace_grpo``) take verl's batch tensors (``token_level_rewards``, ``response_mask``, ``index`` = the
rows' ``uid``) and the per-token role ids the agent loop stores, resolve them to one reward, group, role
and exclusion flag per row, and call ``envace.core.advantages.compute_rolewise_advantages``.
``register_with_verl`` puts both in verl's registry; the plugin entry point (``plugin.py``) calls it in
every process that imports verl. Importing this module does not import verl.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envace.core.advantages import OUTPUT_MEAN, compute_rolewise_advantages, token_advantages
from envace.core.records import NO_ROLE, Role
from envace.engines.verl.rows import ROLE_IDS_KEY  # (bs, response_length) int, a Role per token, NO_ROLE off-mask

logger = logging.getLogger(__name__)

VERL_ROLEWISE_NAME = "envace_rolewise"
VERL_GRPO_NAME = "envace_grpo"
TRAJECTORY_ID_KEY = "trajectory_id"  # (bs,) hashable, one id per trajectory
EXCLUDE_KEY = "exclude_from_loss"  # (bs,) bool
BASELINE_CONFIG_KEY = "rolewise_baseline"  # optional key in verl's algorithm config


def _lookup(container: Any, key: str) -> Any:
    """container[key] for dicts, TensorDicts and verl configs; None when absent."""
    if container is None:
        return None
    try:
        return container[key]
    except (KeyError, TypeError, AttributeError):
        return None


def _row_roles(role_ids: Any, response_mask: torch.Tensor) -> tuple[list[int], list[bool]]:
    """Role of every row and whether it has no generated token. role_ids: (bs, L) per token or (bs,).

    Raises ValueError when a row's generated tokens carry more than one role (or NO_ROLE).
    """
    mask = response_mask.to(torch.bool).cpu()
    empty = (~mask.any(dim=-1)).tolist()
    ids = torch.as_tensor(role_ids).cpu().long()
    if ids.dim() == 1:
        return [int(r) if not e else int(Role.ACT) for r, e in zip(ids.tolist(), empty)], empty
    if ids.shape != mask.shape:
        raise ValueError(f"role_ids shape {tuple(ids.shape)} must equal response_mask shape {tuple(mask.shape)}")
    big = torch.iinfo(torch.long).max
    low = torch.where(mask, ids, torch.full_like(ids, big)).min(dim=-1).values
    high = torch.where(mask, ids, torch.full_like(ids, -big)).max(dim=-1).values
    mixed = [i for i, e in enumerate(empty) if not e and (low[i] != high[i] or int(low[i]) == NO_ROLE)]
    if mixed:
        raise ValueError(
            f"rows {mixed[:5]} mix roles (or carry NO_ROLE) on generated tokens; each row must hold outputs of "
            "exactly one role (one role stream or one output per row)"
        )
    return [int(Role.ACT) if e else int(low[i]) for i, e in enumerate(empty)], empty


@dataclass(frozen=True)
class _Rows:
    """verl batch rows resolved to per-row inputs (bs = number of rows)."""

    rewards: torch.Tensor  # (bs,) sum of token_level_rewards
    groups: list[Hashable]
    roles: list[int]
    excluded: list[bool]
    trajectory_ids: list[Hashable] | None
    counts: list[int]  # outputs packed in each row (>= 1)


def _resolve_rows(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    *,
    need_roles: bool,
    role_ids: Any,
    trajectory_ids: Any,
    exclude: Any,
    outputs_per_row: Any,
    batch: Any,
    non_tensor_batch: Any,
) -> _Rows:
    """Gather group ids, roles, exclusions and trajectory ids from kwargs, else from verl's batch dicts."""
    index = index if index is not None else _lookup(non_tensor_batch, "uid")
    if index is None:
        raise ValueError("envace advantage: per-row group ids missing; pass index= (verl's non_tensor_batch['uid'])")
    role_ids = role_ids if role_ids is not None else _lookup(batch, ROLE_IDS_KEY)
    if role_ids is None and need_roles:
        raise ValueError(
            f"{VERL_ROLEWISE_NAME}: pass role_ids= (bs, L) per-token role ids, or put them in "
            f"batch[{ROLE_IDS_KEY!r}]; role ids are {[f'{r.name}={int(r)}' for r in Role]}"
        )
    if role_ids is None:
        role_ids = torch.full(response_mask.shape[:1], int(Role.ACT))
    roles, empty = _row_roles(role_ids, response_mask)
    trajectory_ids = trajectory_ids if trajectory_ids is not None else _lookup(non_tensor_batch, TRAJECTORY_ID_KEY)
    exclude = exclude if exclude is not None else _lookup(batch, EXCLUDE_KEY)
    flags = [False] * len(roles) if exclude is None else [bool(x) for x in torch.as_tensor(exclude).tolist()]
    counts = outputs_per_row if outputs_per_row is not None else _lookup(batch, "outputs_per_row")
    counts = [1] * len(roles) if counts is None else [max(1, int(c)) for c in torch.as_tensor(counts).tolist()]
    if not (len(index) == len(flags) == len(counts) == len(roles)):
        raise ValueError(
            f"{len(roles)} rows but {len(index)} group ids, {len(flags)} exclude flags and {len(counts)} output counts"
        )
    return _Rows(
        rewards=token_level_rewards.detach().sum(dim=-1).cpu(),
        groups=list(index),
        roles=roles,
        excluded=[f or e for f, e in zip(flags, empty)],  # rows with no generated token are not outputs
        trajectory_ids=None if trajectory_ids is None else list(trajectory_ids),
        counts=counts,
    )


def _row_advantages(rows: _Rows, *, baseline: str, norm_by_std: bool, epsilon: float) -> torch.Tensor:
    """Per-row advantage (bs,): each row stands for ``counts[row]`` outputs in the baselines."""
    expand = [row for row, c in enumerate(rows.counts) for _ in range(c)]
    first = torch.tensor([0] + rows.counts[:-1], dtype=torch.long).cumsum(0)  # first copy of each row
    per_output = compute_rolewise_advantages(
        rows.rewards[expand],
        [rows.groups[r] for r in expand],
        [rows.roles[r] for r in expand],
        baseline=baseline,
        norm_by_std=norm_by_std,
        trajectory_ids=None if rows.trajectory_ids is None else [rows.trajectory_ids[r] for r in expand],
        exclude=[rows.excluded[r] for r in expand],
        epsilon=epsilon,
    )
    return per_output[first]


def _settings(config: Any, baseline: str | None, norm_adv_by_std_in_grpo: bool | None) -> tuple[str, bool]:
    """Explicit kwargs win; else verl's algorithm config (``rolewise_baseline``, ``norm_adv_by_std_in_grpo``)."""
    chosen = baseline or _lookup(config, BASELINE_CONFIG_KEY) or OUTPUT_MEAN
    norm = norm_adv_by_std_in_grpo
    if norm is None:
        norm = bool(_lookup(config, "norm_adv_by_std_in_grpo") or False)
    return str(chosen), bool(norm)


def verl_rolewise_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | None = None,
    config: Any = None,
    *,
    role_ids: Any = None,
    trajectory_ids: Sequence[Hashable] | None = None,
    exclude: Any = None,
    outputs_per_row: Any = None,
    baseline: str | None = None,
    norm_adv_by_std_in_grpo: bool | None = None,
    epsilon: float = 1e-6,
    batch: Any = None,
    non_tensor_batch: Any = None,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl-signature role-wise GRPO estimator (registered as ``envace_rolewise``).

    Args:
        token_level_rewards: (bs, L); a row's reward is its sum (verl's outcome convention).
        response_mask: (bs, L) 1 on generated tokens.
        index: (bs,) group ids (verl passes ``non_tensor_batch["uid"]``).
        config: verl algorithm config; read: ``norm_adv_by_std_in_grpo`` (verl's default is True — set it
            False as docs/method.md §7 does) and optional ``rolewise_baseline``. Explicit kwargs win.
        role_ids: (bs, L) Role id per token (NO_ROLE off-mask) or (bs,) per row; else ``batch[ROLE_IDS_KEY]``.
        trajectory_ids: (bs,) for ``trajectory_mean``; else ``non_tensor_batch["trajectory_id"]``.
        exclude: (bs,) bool; else ``batch["exclude_from_loss"]``. Rows with an all-zero mask are excluded.
        outputs_per_row: (bs,) outputs packed per row (see ``count_output_spans``); default 1.
    Returns:
        (advantages, returns), both (bs, L) float32 = row advantage * response_mask.
    """
    rows = _resolve_rows(
        token_level_rewards,
        response_mask,
        index,
        need_roles=True,
        role_ids=role_ids,
        trajectory_ids=trajectory_ids,
        exclude=exclude,
        outputs_per_row=outputs_per_row,
        batch=batch,
        non_tensor_batch=non_tensor_batch,
    )
    chosen, norm = _settings(config, baseline, norm_adv_by_std_in_grpo)
    per_row = _row_advantages(rows, baseline=chosen, norm_by_std=norm, epsilon=epsilon)
    advantages = token_advantages(per_row.float(), response_mask.cpu()).to(token_level_rewards.device)
    return advantages, advantages


def verl_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Hashable] | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl-signature single-baseline GRPO with envace conventions (registered as ``envace_grpo``).

    Same arguments as ``verl_rolewise_advantage``; roles are ignored (one baseline per group).
    """
    kwargs["role_ids"] = torch.full(response_mask.shape[:1], int(Role.ACT))  # one role = one baseline
    return verl_rolewise_advantage(token_level_rewards, response_mask, index, config, **kwargs)


def register_with_verl() -> dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """Register ``envace_rolewise`` and ``envace_grpo`` in verl's advantage-estimator registry.

    Idempotent (verl's ``register_adv_est`` accepts re-registering the same function); raises verl's
    ValueError if another function already holds one of the names. Imports verl (≈ 6–10 s cold, and
    verl's package import loads ray). Returns {name: function}.
    """
    # lazy: importing verl loads ray (seconds); the estimators themselves need only torch
    from verl.trainer.ppo import core_algos

    estimators = {VERL_ROLEWISE_NAME: verl_rolewise_advantage, VERL_GRPO_NAME: verl_grpo_advantage}
    for name, fn in estimators.items():
        core_algos.register_adv_est(name)(fn)
    logger.debug("registered verl advantage estimators %s", sorted(estimators))
    return estimators
