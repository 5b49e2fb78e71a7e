"""From scored trajectories to training tensors: one row per role stream, log-probs on its outputs.

A row is one stream of one trajectory (the ACT stream or the REHEARSE stream). All its outputs are
scored with one forward pass over the stream (an output's prompt is exactly the stream prefix before
it). Rows are stored compactly: only the *predicting* positions i whose next token i+1 is a generated
token of a trainable role, with that token's id, role, temperature, advantage and sampling log-prob.
A micro-batch right-pads its rows, asks the model for logits only at the union of their predicting
positions (``logits_to_keep``) and scatters the per-row values into ``[rows, positions]`` tensors.

Log-probs are taken under each token's role temperature (logits / T), matching the sampling
distribution (``decode.effective_temperature``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from envace.core.records import Role, Stream, Trajectory
from envace.runtime.decode import effective_temperature


@dataclass
class TrainRow:
    """One stream's training view. Tensors are 1-D over the row's predicting positions."""

    input_ids: torch.Tensor  # (n,) long — the whole stream
    positions: torch.Tensor  # (p,) long — i such that token i+1 is trained
    targets: torch.Tensor  # (p,) long — token i+1
    roles: torch.Tensor  # (p,) long — Role value of token i+1
    temperatures: torch.Tensor  # (p,) float
    advantages: torch.Tensor  # (p,) float — advantage of the output holding token i+1
    sampling_logprobs: torch.Tensor  # (p,) float — recorded while sampling
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return int(self.positions.numel())


def output_index(trajectories: Sequence[Trajectory]) -> list[tuple[int, Role]]:
    """(trajectory index, role) of every output, in the order rows and advantages use."""
    return [(t, role) for t, traj in enumerate(trajectories) for role, _ in traj.outputs()]


def stream_row(
    stream: Stream,
    roles: frozenset[Role],
    output_advantages: Sequence[float],
    temperatures: dict[Role, float],
    meta: dict[str, Any] | None = None,
) -> TrainRow | None:
    """Row of one stream; ``output_advantages`` has one value per output of the stream (all roles)."""
    n_outputs = len(stream.outputs())
    if n_outputs != len(output_advantages):
        raise ValueError(f"stream has {n_outputs} outputs but {len(output_advantages)} advantages were given")
    ids: list[int] = []
    pos, tgt, rol, tmp, adv, lps = [], [], [], [], [], []
    k = 0
    for seg in stream.segments:
        start = len(ids)
        ids.extend(seg.token_ids)
        if seg.role is None:
            continue
        a = float(output_advantages[k])
        k += 1
        if seg.role not in roles or start == 0:
            continue
        logprobs = seg.logprobs if seg.logprobs is not None else (0.0,) * len(seg.token_ids)
        for j, tok in enumerate(seg.token_ids):
            pos.append(start + j - 1)
            tgt.append(tok)
            rol.append(int(seg.role))
            tmp.append(effective_temperature(temperatures[seg.role]))
            adv.append(a)
            lps.append(float(logprobs[j]))
    if not pos:
        return None
    return TrainRow(
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.tensor(pos, dtype=torch.long),
        targets=torch.tensor(tgt, dtype=torch.long),
        roles=torch.tensor(rol, dtype=torch.long),
        temperatures=torch.tensor(tmp, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32),
        sampling_logprobs=torch.tensor(lps, dtype=torch.float32),
        meta=dict(meta or {}),
    )


def build_rows(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    roles: frozenset[Role],
    temperatures: dict[Role, float],
    exclude: Sequence[bool] | None = None,
) -> list[TrainRow]:
    """Rows for every stream holding outputs of ``roles`` (advantages: one per output, ``output_index`` order).

    Excluded trajectories (judge failures) contribute no row.
    """
    rows: list[TrainRow] = []
    k = 0
    for t, traj in enumerate(trajectories):
        for stream in traj.streams:
            n = len(stream.outputs())
            if not (exclude is not None and exclude[t]):
                meta = {"trajectory": t, "stream": stream.role.name, "prompt_id": traj.prompt_id}
                row = stream_row(stream, roles, advantages[k : k + n], temperatures, meta)
                if row is not None:
                    rows.append(row)
            k += n
    if k != len(advantages):
        raise ValueError(f"{len(advantages)} advantages for {k} outputs; give one per output")
    return rows


@dataclass(frozen=True)
class MicroBatch:
    """Padded tensors of some rows: ``[B, L]`` inputs and ``[B, P]`` per-position values (P = union)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: torch.Tensor  # (P,) positions to compute logits at
    mask: torch.Tensor  # (B, P) bool — position belongs to the row
    values: dict[str, torch.Tensor]  # targets, roles, temperatures, advantages, sampling/old/ref log-probs


ROW_VALUES = ("targets", "roles", "temperatures", "advantages", "sampling_logprobs", "old_logprobs", "ref_logprobs")


def value_tensors(rows: Sequence[TrainRow], width: int) -> dict[str, torch.Tensor]:
    """``[rows, width]`` tensors for every per-position value the rows carry (temperatures filled with 1, others 0)."""
    values: dict[str, torch.Tensor] = {}
    for name in ROW_VALUES:
        first = getattr(rows[0], name)
        if first is not None:
            values[name] = torch.full((len(rows), width), 1.0 if name == "temperatures" else 0, dtype=first.dtype)
    return values


def collate(rows: Sequence[TrainRow], pad_id: int = 0, device: str | torch.device = "cpu") -> MicroBatch:
    length = max(int(r.input_ids.numel()) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), length, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : r.input_ids.numel()] = r.input_ids
        attn[b, : r.input_ids.numel()] = 1
    keep = torch.unique(torch.cat([r.positions for r in rows]))
    mask = torch.zeros(len(rows), keep.numel(), dtype=torch.bool)
    values = value_tensors(rows, keep.numel())
    for b, r in enumerate(rows):
        cols = torch.searchsorted(keep, r.positions)
        mask[b, cols] = True
        for name, tensor in values.items():
            tensor[b, cols] = getattr(r, name)
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        keep=keep.to(device),
        mask=mask.to(device),
        values={k: v.to(device) for k, v in values.items()},
    )


def token_logprobs(model: Any, batch: MicroBatch) -> torch.Tensor:
    """log π(target | prefix) at temperature T for every kept position: ``[B, P]`` (0 off-mask)."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=batch.keep)
    logits = out.logits.float() / batch.values["temperatures"].unsqueeze(-1)
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.values["targets"].reshape(-1), reduction="none")
    return (-flat).view(logits.shape[:2]) * batch.mask


def scatter_back(rows: Sequence[TrainRow], batch: MicroBatch, values: torch.Tensor, name: str) -> None:
    """Store ``[B, P]`` per-position values (e.g. recomputed old log-probs) on each row as ``name``."""
    keep = batch.keep.cpu()
    values = values.detach().cpu()
    for b, r in enumerate(rows):
        setattr(r, name, values[b, torch.searchsorted(keep, r.positions)].clone())


@dataclass(frozen=True)
class PaddedBatch:
    """The legacy layout (``share_prefix=False``): rows right-padded, logits at the union of positions."""

    rows: tuple[int, ...]
    batch: MicroBatch

    @property
    def mask(self) -> torch.Tensor:
        return self.batch.mask

    @property
    def values(self) -> dict[str, torch.Tensor]:
        return self.batch.values

    @property
    def padded_tokens(self) -> int:
        return int(self.batch.input_ids.numel())

    @property
    def encoded_tokens(self) -> int:
        """Real tokens one forward over this batch encodes (every row's whole stream)."""
        return int(self.batch.attention_mask.sum())

    def logprobs(self, model: Any) -> torch.Tensor:
        return token_logprobs(model, self.batch)

    def store(self, rows: Sequence[TrainRow], values: torch.Tensor, name: str) -> None:
        scatter_back([rows[i] for i in self.rows], self.batch, values, name)
