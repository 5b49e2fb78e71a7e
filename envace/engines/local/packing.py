"""Shared-prefix packing of training rows: each common prefix is encoded once, with gradient.

The K samples of a prompt share their whole prompt (system prompt, tool schemas, first user turn —
88% of the update's tokens at the cpu profile's sizes). ``plan_packs`` groups rows whose token
streams share a prefix of at least ``min_shared`` tokens; a *pack* is one sequence
``[prefix, suffix_1, ..., suffix_m]`` with

- explicit position ids: the prefix at 0..P-1, every suffix at P..P+len-1 (as if alone after it);
- a block-causal mask: the prefix is causal; a suffix token sees the whole prefix and the earlier
  tokens of its own suffix, never another suffix (``pack_mask``).

Every token's hidden state is then exactly the one it has when its row is encoded alone, so
log-probs, losses and gradients equal the unshared computation (up to float summation order; the
tests check 1e-5). A prefix position's hidden state is shared by the rows of its pack, and each row
reads its own target there, so gradient contributions add up as they would over separate rows.

Micro-batches hold packs of similar length (length buckets) up to ``max_tokens`` padded tokens;
they carry one boolean ``[B, 1, L, L]`` mask that every layer reads (no per-layer float copies).
The LM head runs only at the (row, position) pairs that are trained, in chunks (``head_logprobs``),
never over a ``[B, L, vocab]`` tensor.

Choices: rows are visited in lexicographic token order, so rows sharing a prefix are adjacent;
grouping is greedy, and a row joins a pack only where a cost model (projections per token +
attention per token pair, ``attention_cost_ratio``) says the pack is cheaper than the row alone —
long suffixes behind a short prefix are not packed, since the masked attention over the pack
grows with the square of its length. A pack is capped at ``max_tokens``. Padding queries attend to
themselves only (no NaNs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from envace.engines.local.attention import PACK_LAYOUT_ATTR, PackLayout
from envace.engines.local.batching import TrainRow, value_tensors


@dataclass(frozen=True)
class Pack:
    """One packed sequence: ``rows`` (indices into the row list) behind a shared prefix of ``prefix_len``."""

    rows: tuple[int, ...]
    prefix_len: int
    length: int


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(int(a.numel()), int(b.numel()))
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else n


def _pack(rows: Sequence[TrainRow], members: list[int], prefix: int) -> Pack:
    if len(members) == 1:
        prefix = int(rows[members[0]].input_ids.numel())
    length = prefix + sum(int(rows[i].input_ids.numel()) - prefix for i in members)
    return Pack(tuple(members), prefix, length)


def attention_cost_ratio(model: Any) -> float:
    """Cost of one (query, key) attention pair relative to one token's projections, for a Llama-like model.

    Per token and layer the projections cost ``h·(2h + 2·kv) + 3·h·m`` multiply-adds (q, o, k, v, and
    the gated MLP); a pair costs ``2h`` (q·k and p·v over all heads). A packed sequence runs its mask
    over every pair of its length (the CPU kernel does not skip masked blocks).
    """
    cfg = getattr(model, "config", None)
    h = int(getattr(cfg, "hidden_size", 0) or 0)
    if not h:
        return 0.0
    heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
    kv = h // heads * int(getattr(cfg, "num_key_value_heads", heads) or heads)
    m = int(getattr(cfg, "intermediate_size", 4 * h) or 4 * h)
    return 2 * h / (h * (2 * h + 2 * kv) + 3 * h * m)


def sequence_cost(length: int, pair_cost: float, causal: bool = False) -> float:
    """Relative compute of one forward over ``length`` tokens (projections + attention pairs)."""
    return length + pair_cost * length * length * (0.5 if causal else 1.0)


def plan_packs(
    rows: Sequence[TrainRow],
    *,
    share: bool = True,
    min_shared: int = 16,
    max_tokens: int = 8192,
    pair_cost: float = 0.0,
) -> list[Pack]:
    """Group rows sharing a ≥ ``min_shared``-token prefix into packs of at most ``max_tokens`` tokens.

    A row joins the current pack only when that is cheaper than encoding it alone: with
    ``pair_cost`` > 0 (``attention_cost_ratio``), the quadratic attention over a long pack can
    outweigh the prefix saved (long suffixes), and the row then starts a new pack.
    """
    if not share:
        return [_pack(rows, [i], 0) for i in range(len(rows))]
    order = sorted(range(len(rows)), key=lambda i: rows[i].input_ids.tolist())
    packs: list[Pack] = []
    members: list[int] = []
    prefix = 0
    for i in order:
        if members:
            shared = min(prefix, common_prefix_len(rows[members[0]].input_ids, rows[i].input_ids))
            length = shared + sum(int(rows[j].input_ids.numel()) - shared for j in [*members, i])
            current = _pack(rows, members, prefix).length
            cheaper = sequence_cost(length, pair_cost) <= (
                sequence_cost(current, pair_cost) + sequence_cost(int(rows[i].input_ids.numel()), pair_cost)
            )
            if shared >= min_shared and length <= max_tokens and cheaper:
                members.append(i)
                prefix = shared
                continue
            packs.append(_pack(rows, members, prefix))
        members, prefix = [i], int(rows[i].input_ids.numel())
    if members:
        packs.append(_pack(rows, members, prefix))
    return packs


MAX_PADDING = 0.15  # a micro-batch's padded tokens may exceed its real tokens by at most this share


def micro_batches(packs: Sequence[Pack], max_tokens: int) -> list[list[Pack]]:
    """Length-bucketed micro-batches: packs sorted by length, each batch ≤ ``max_tokens`` padded tokens
    and at most ``MAX_PADDING`` padding (a much longer pack starts its own batch)."""
    batches: list[list[Pack]] = []
    for pack in sorted(packs, key=lambda p: (p.length, p.rows)):
        if batches:
            width = max(pack.length, batches[-1][-1].length)
            padded = (len(batches[-1]) + 1) * width
            real = sum(p.length for p in batches[-1]) + pack.length
            if padded <= max_tokens and padded <= (1 + MAX_PADDING) * real:
                batches[-1].append(pack)
                continue
        batches.append([pack])
    return batches


def pack_mask(segments: torch.Tensor) -> torch.Tensor:
    """``[L, L]`` bool (True = may attend) from per-token segment ids (0 prefix, 1.. suffixes, -1 pad)."""
    n = segments.numel()
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    same = segments[:, None] == segments[None, :]
    prefix_key = (segments == 0)[None, :] & (segments[:, None] >= 0)
    return causal & (same | prefix_key)


@dataclass(frozen=True)
class PackedBatch:
    """Tensors of one micro-batch of packs.

    ``input_ids``/``position_ids``: ``[B, L]``; ``attention_mask``: ``[B, 1, L, L]`` bool;
    ``pack_index``/``token_index``: ``(N,)`` where each trained token's predicting position sits;
    ``row_index``/``col_index``: ``(N,)`` its (row of this batch, position in the row's own arrays);
    ``values``: ``[R, P]`` per-row tensors (``targets``, ``roles``, ...; ``mask`` marks real entries).
    """

    rows: tuple[int, ...]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    pack_index: torch.Tensor
    token_index: torch.Tensor
    row_index: torch.Tensor
    col_index: torch.Tensor
    mask: torch.Tensor
    values: dict[str, torch.Tensor]

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def padded_tokens(self) -> int:
        """Tokens one forward over this batch runs (padding included)."""
        return int(self.input_ids.numel())

    def logprobs(self, model: Any) -> torch.Tensor:
        return packed_logprobs(model, self)

    def store(self, rows: Sequence[TrainRow], values: torch.Tensor, name: str) -> None:
        """Save ``[R, P]`` per-row values (e.g. old log-probs) on this batch's rows as ``name``."""
        values = values.detach().cpu()
        for k, r in enumerate(self.rows):
            setattr(rows[r], name, values[k, : rows[r].n_tokens].clone())


def _pack_tensors(rows: Sequence[TrainRow], pack: Pack, width: int, pad_id: int):
    ids = torch.full((width,), pad_id, dtype=torch.long)
    pos = torch.zeros(width, dtype=torch.long)
    seg = torch.full((width,), -1, dtype=torch.long)
    p = pack.prefix_len
    first = rows[pack.rows[0]].input_ids
    ids[:p], pos[:p], seg[:p] = first[:p], torch.arange(p), 0
    starts = []
    cursor = p
    for j, r in enumerate(pack.rows, start=1):
        tail = rows[r].input_ids[p:]
        ids[cursor : cursor + tail.numel()] = tail
        pos[cursor : cursor + tail.numel()] = torch.arange(p, p + tail.numel())
        seg[cursor : cursor + tail.numel()] = j
        starts.append(cursor)
        cursor += tail.numel()
    return ids, pos, seg, starts


def collate_packs(
    rows: Sequence[TrainRow], packs: Sequence[Pack], pad_id: int = 0, device: str | torch.device = "cpu"
) -> PackedBatch:
    """Tensors for ``packs`` (one micro-batch), right-padded to the longest pack."""
    width = max(p.length for p in packs)
    ids, pos, masks = [], [], []
    pack_idx, tok_idx, row_idx, col_idx, order = [], [], [], [], []
    layout = []
    for b, pack in enumerate(packs):
        i, p_ids, seg, starts = _pack_tensors(rows, pack, width, pad_id)
        ids.append(i)
        pos.append(p_ids)
        masks.append(pack_mask(seg))
        ends = [*starts[1:], pack.length]
        layout.append((pack.prefix_len, tuple((s, e) for s, e in zip(starts, ends) if e > s)))
        for start, r in zip(starts, pack.rows):
            positions = rows[r].positions
            packed = torch.where(positions < pack.prefix_len, positions, positions - pack.prefix_len + start)
            pack_idx.append(torch.full_like(positions, b))
            tok_idx.append(packed)
            row_idx.append(torch.full_like(positions, len(order)))
            col_idx.append(torch.arange(positions.numel()))
            order.append(r)
    members = [rows[r] for r in order]
    longest = max(r.n_tokens for r in members)
    mask = torch.zeros(len(members), longest, dtype=torch.bool)
    values = value_tensors(members, longest)
    for k, r in enumerate(members):
        mask[k, : r.n_tokens] = True
        for name, tensor in values.items():
            tensor[k, : r.n_tokens] = getattr(r, name)
    to = lambda t: t.to(device)
    attention_mask = to(torch.stack(masks).unsqueeze(1))
    # the layout rides on the mask: ``gqa_sdpa_attention`` then attends segment by segment (same result)
    setattr(attention_mask, PACK_LAYOUT_ATTR, PackLayout(width, tuple(layout)))
    return PackedBatch(
        rows=tuple(order),
        input_ids=to(torch.stack(ids)),
        position_ids=to(torch.stack(pos)),
        attention_mask=attention_mask,
        pack_index=to(torch.cat(pack_idx)),
        token_index=to(torch.cat(tok_idx)),
        row_index=to(torch.cat(row_idx)),
        col_index=to(torch.cat(col_idx)),
        mask=to(mask),
        values={k: to(v) for k, v in values.items()},
    )


def _chunk_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperatures: torch.Tensor
) -> torch.Tensor:
    logits = head(hidden).float() / temperatures.unsqueeze(-1)
    return -F.cross_entropy(logits, targets, reduction="none")


# logits computed at once by ``head_logprobs``: 256 rows of SmolLM2's 49,152-token vocabulary (~50 MB in
# float32); a small vocabulary takes proportionally more rows per chunk (the peer bench's 512: all of them)
HEAD_CHUNK_LOGITS = 256 * 49_152


def head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperatures: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """log softmax(head(h) / T)[target] for ``(N, H)`` hidden states, ``chunk`` rows of logits at a time.

    ``chunk`` defaults to ``HEAD_CHUNK_LOGITS`` logits' worth of rows (at least 256). With gradient, each
    chunk's logits are recomputed in backward (activation checkpointing) when there are several, so at
    most one ``[chunk, vocab]`` float32 tensor is alive.
    """
    if chunk is None:
        vocab = getattr(head, "out_features", None) or head.weight.shape[0]
        chunk = max(256, HEAD_CHUNK_LOGITS // vocab)
    if hidden.shape[0] <= chunk:
        return _chunk_logprobs(head, hidden, targets, temperatures)
    pieces = []
    for s in range(0, hidden.shape[0], chunk):
        args = (head, hidden[s : s + chunk], targets[s : s + chunk], temperatures[s : s + chunk])
        if torch.is_grad_enabled() and hidden.requires_grad:
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    return torch.cat(pieces)


def decoder_and_head(model: Any) -> tuple[Any, torch.nn.Module]:
    """The transformer body (hidden states) and the LM head of a causal LM (HF or peft-wrapped)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    if decoder is None or head is None:
        raise TypeError(f"{type(model).__name__}: packed training needs get_decoder() and get_output_embeddings()")
    return decoder, head


def packed_logprobs(model: Any, batch: PackedBatch) -> torch.Tensor:
    """``[R, P]`` log-probs of every row's targets at its temperatures (0 off ``batch.mask``)."""
    decoder, head = decoder_and_head(model)
    out = decoder(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False
    )
    hidden = out.last_hidden_state[batch.pack_index, batch.token_index]
    targets = batch.values["targets"][batch.row_index, batch.col_index]
    temps = batch.values["temperatures"][batch.row_index, batch.col_index]
    flat = head_logprobs(head, hidden, targets, temps)
    logp = flat.new_zeros(batch.mask.shape)
    return logp.index_put((batch.row_index, batch.col_index), flat)
