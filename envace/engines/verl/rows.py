"""The row contract between the agent loop and the trainer (torch only, no verl import).

How the two role streams map onto verl's batch. verl's v1 agent loop may return a *list* of outputs per
sample (one batch row each, keyed ``{uid}_{session}_{index}``); we return one row per role stream:

- the ACT row: prompt = the initial ACT prompt; response = every later token of the ACT stream (ACT
  outputs with mask 1, tool responses and replayed user turns with mask 0);
- the REHEARSE row (when REHEARSE is trainable and generated at least once): prompt = the REHEARSE
  system prompt; response = call messages (mask 0) and REHEARSE outputs (mask 1).

Why not one interleaved sequence: the two roles see different contexts (their own role prompt and
history); a single sequence would make REHEARSE tokens condition on the ACT stream and the trainer would
score them under a context they were not sampled in. Why not one row per output: every output's prompt
is its stream prefix, so one row per output re-encodes the prefix once per output (quadratic); one row
per stream scores all outputs of a stream in one forward pass. The role-wise estimator still counts
every output once under ``output_mean`` through ``outputs_per_row``.

Per-row extra fields (``AgentLoopOutput.extra_fields``, stored by verl with the row):
``envace_role`` (int), ``envace_role_ids`` (per response token: the Role id on trainable generated
tokens, ``NO_ROLE`` elsewhere), ``envace_trajectory_id``, ``envace_exclude`` (judge failed: the row
is masked out and kept out of every baseline) and ``envace_num_outputs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envace.core.advantages import count_output_spans
from envace.core.records import NO_ROLE, Role

ROLE_KEY = "envace_role"
ROLE_IDS_KEY = "envace_role_ids"
TRAJECTORY_KEY = "envace_trajectory_id"
EXCLUDE_KEY = "envace_exclude"
NUM_OUTPUTS_KEY = "envace_num_outputs"
INFO_KEY = "envace_info"


@dataclass(frozen=True)
class RowInputs:
    """What the role-wise estimator needs beyond verl's own fields, for a padded batch of ``bs`` rows."""

    role_ids: torch.Tensor  # (bs, L) long: Role id on generated tokens, NO_ROLE elsewhere
    trajectory_ids: list[str]
    exclude: torch.Tensor  # (bs,) bool
    outputs_per_row: torch.Tensor  # (bs,) long


def _trajectory_of_key(key: str) -> str:
    """verl's row key ``{uid}_{session}_{index}`` → ``{uid}_{session}`` (one trajectory)."""
    parts = key.rsplit("_", 1)
    return parts[0] if len(parts) == 2 else key


def _row_role_ids(extra: Mapping[str, Any], mask_row: torch.Tensor) -> torch.Tensor:
    """Per-token role ids of one row, aligned to its (padded) response mask."""
    width = mask_row.shape[0]
    listed = extra.get(ROLE_IDS_KEY)
    ids = torch.full((width,), NO_ROLE, dtype=torch.long)
    length = int(mask_row.nonzero().max()) + 1 if bool(mask_row.any()) else 0
    if listed is not None and length <= len(listed) <= width:
        ids[: len(listed)] = torch.as_tensor(list(listed), dtype=torch.long)
    else:  # verl's synthetic padding rows copy another row's extras: fall back to the row's role
        ids[:] = int(extra.get(ROLE_KEY, int(Role.ACT)))
    return torch.where(mask_row.bool(), ids, torch.full_like(ids, NO_ROLE))


def row_inputs(
    extra_fields: Sequence[Mapping[str, Any] | None], keys: Sequence[str], response_mask: torch.Tensor
) -> RowInputs:
    """Role ids, trajectory ids, exclusion flags and output counts of a padded verl batch.

    Args:
        extra_fields: one ``extra_fields`` dict per row (as stored by the agent loop).
        keys: verl's row keys ``{uid}_{session}_{index}`` (fallback trajectory ids).
        response_mask: (bs, L) padded response mask.
    Raises:
        ValueError naming the first row without envace fields (it was not produced by our agent loop).
    """
    mask = response_mask.detach().cpu()
    if len(extra_fields) != mask.shape[0] or len(keys) != mask.shape[0]:
        raise ValueError(f"{mask.shape[0]} rows but {len(extra_fields)} extra_fields and {len(keys)} keys")
    role_rows, trajectories, exclude, counts = [], [], [], []
    spans = count_output_spans(mask)
    for i, extra in enumerate(extra_fields):
        extra = dict(extra or {})
        if ROLE_KEY not in extra and bool(mask[i].any()):
            raise ValueError(
                f"row {keys[i]!r} carries no {ROLE_KEY!r}: it was not produced by the envace agent loop. Set "
                "actor_rollout_ref.rollout.agent.default_agent_loop=envace_act_rehearse (and agent_name in the data)"
            )
        role_rows.append(_row_role_ids(extra, mask[i]))
        trajectories.append(str(extra.get(TRAJECTORY_KEY) or _trajectory_of_key(keys[i])))
        exclude.append(bool(extra.get(EXCLUDE_KEY, False)))
        counts.append(int(extra.get(NUM_OUTPUTS_KEY) or spans[i]))
    return RowInputs(
        role_ids=torch.stack(role_rows) if role_rows else torch.zeros_like(mask, dtype=torch.long),
        trajectory_ids=trajectories,
        exclude=torch.tensor(exclude, dtype=torch.bool),
        outputs_per_row=torch.tensor(counts, dtype=torch.long),
    )


def role_metrics(inputs: RowInputs, advantages: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """Per-role row/token counts and mean |advantage| of a batch (logged under ``envace/``)."""
    mask = response_mask.detach().cpu().bool()
    adv = advantages.detach().cpu().float()
    metrics: dict[str, float] = {"envace/excluded_rows": float(inputs.exclude.sum())}
    for role in Role:
        tokens = mask & (inputs.role_ids == int(role))
        rows = tokens.any(dim=-1)
        name = role.name.lower()
        metrics[f"envace/{name}/rows"] = float(rows.sum())
        metrics[f"envace/{name}/outputs"] = float(inputs.outputs_per_row[rows].sum())
        metrics[f"envace/{name}/tokens"] = float(tokens.sum())
        metrics[f"envace/{name}/adv_abs_mean"] = float(adv[tokens].abs().mean()) if bool(tokens.any()) else 0.0
    return metrics
