"""Shared-prefix packing of training rows: every common prefix is encoded once, with gradient.

The K samples of a prompt share their whole prompt (system prompt, tool schemas, first user turn —
88% of the update's tokens at the cpu profile's sizes), and often more: samples that start with the
same tool call, or that are identical, share tokens past the prompt too (in the cpu pipeline's
rollouts, 26–32% of the generated characters lie in such common starts). ``plan_packs`` groups rows
whose token streams share a prefix of at least ``min_shared`` tokens; a *pack* is one sequence
``[prefix, segment_1, ..., segment_m]``: the rows' tails after the shared prefix form a token trie (a
radix tree), and each trie node is one segment, so a token that several rows hold at the same place
behind the same history is encoded once.

- explicit position ids: the prefix at 0..P-1, a segment at its depth in the rows that hold it
  (as if each row were alone);
- a tree-causal mask: the prefix is causal; a segment token sees the prefix, its ancestor segments
  and the earlier tokens of its own segment, never a sibling branch (``pack_mask``).

Every token's hidden state is then exactly the one it has when its row is encoded alone, so
log-probs, losses and gradients equal the unshared computation (up to float summation order; the
tests check 1e-5). A shared position's hidden state is read by every row holding it, each with its
own target there, so gradient contributions add up as they would over separate rows. Identical rows
cost one row's tokens.

Micro-batches hold packs of similar length (length buckets) up to ``max_tokens`` padded tokens;
they carry one boolean ``[B, 1, L, L]`` mask that every layer reads (no per-layer float copies).
The LM head runs only at the (row, position) pairs that are trained, in chunks (``head_logprobs``),
never over a ``[B, L, vocab]`` tensor.

Choices: rows are visited in lexicographic token order, so rows sharing a prefix are adjacent;
grouping is greedy, and a row joins a pack only where a cost model (projections per token +
attention per token pair, ``attention_cost_ratio``) says the pack is cheaper than the row alone —
long suffixes behind a short prefix are not packed, since the masked attention over the pack
grows with the square of its length. A pack is capped at ``max_tokens``. Segments are laid out
breadth first: a node's children are adjacent (equal-length siblings then attend in one batch) and
every segment follows its ancestors. Padding queries attend to themselves only (no NaNs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from envace.engines.local.batching import TrainRow, value_tensors
from envace.runtime.attention import PACK_LAYOUT_ATTR, PackLayout


@dataclass(frozen=True)
class TailSegment:
    """One trie node of a pack: tail tokens ``[offset, offset + length)`` of the rows through it (tails start
    after the shared prefix), behind the segment ``parent`` (an index into ``Pack.segments``; -1: the prefix)."""

    offset: int
    length: int
    parent: int


@dataclass(frozen=True)
class Pack:
    """One packed sequence: ``rows`` (indices into the row list) behind a shared prefix of ``prefix_len``.

    ``segments`` are the trie nodes of the rows' tails, in packed order (breadth first); ``paths[j]`` the
    segments row ``rows[j]`` runs through, root to leaf (its tail is their tokens in that order).
    """

    rows: tuple[int, ...]
    prefix_len: int
    length: int
    segments: tuple[TailSegment, ...] = ()
    paths: tuple[tuple[int, ...], ...] = ()


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(int(a.numel()), int(b.numel()))
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else n


def tail_trie(tails: Sequence[torch.Tensor]) -> tuple[tuple[TailSegment, ...], tuple[tuple[int, ...], ...]]:
    """The radix tree of token sequences ``tails``: segments breadth first, and each sequence's path.

    A segment is a maximal run of tokens that the same set of sequences hold behind the same history; a
    sequence ending inside another's run splits it there. Identical sequences share one path.
    """
    segments: list[TailSegment] = []
    paths: list[list[int]] = [[] for _ in tails]
    lengths = [int(t.numel()) for t in tails]
    queue = [(list(range(len(tails))), 0, -1)]  # (sequences sharing tokens [0, depth), depth, their segment)
    for members, depth, parent in queue:
        branches: dict[int, list[int]] = {}
        for i in members:
            if lengths[i] > depth:
                branches.setdefault(int(tails[i][depth]), []).append(i)
        for branch in branches.values():
            end = min(lengths[i] for i in branch)
            if len(branch) > 1:
                head = tails[branch[0]][depth:end]
                differs = torch.stack([tails[i][depth:end] != head for i in branch[1:]]).any(dim=0).nonzero()
                end = depth + int(differs[0]) if differs.numel() else end
            segments.append(TailSegment(depth, end - depth, parent))
            for i in branch:
                paths[i].append(len(segments) - 1)
            queue.append((branch, end, len(segments) - 1))
    return tuple(segments), tuple(tuple(p) for p in paths)


def _pack(rows: Sequence[TrainRow], members: list[int], prefix: int, tree: bool = True) -> Pack:
    if len(members) == 1:
        prefix = int(rows[members[0]].input_ids.numel())
    tails = [rows[i].input_ids[prefix:] for i in members]
    if tree:
        segments, paths = tail_trie(tails)
    else:  # one segment per row, each behind the prefix
        segments = tuple(TailSegment(0, int(t.numel()), -1) for t in tails if t.numel())
        paths, k = [], 0
        for t in tails:
            paths.append((k,) if t.numel() else ())
            k += bool(t.numel())
        paths = tuple(paths)
    length = prefix + sum(s.length for s in segments)
    return Pack(tuple(members), prefix, length, segments, paths)


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
    tree: bool = True,
) -> list[Pack]:
    """Group rows sharing a ≥ ``min_shared``-token prefix into packs of at most ``max_tokens`` tokens.

    A row joins the current pack only when that is cheaper than encoding it alone: with
    ``pair_cost`` > 0 (``attention_cost_ratio``), the quadratic attention over a long pack can
    outweigh the prefix saved (long suffixes), and the row then starts a new pack. ``tree``: the tails
    after the shared prefix share their own common prefixes too (a trie); False: one segment per row.
    """
    if not share:
        return [_pack(rows, [i], 0) for i in range(len(rows))]
    order = sorted(range(len(rows)), key=lambda i: rows[i].input_ids.tolist())
    packs: list[Pack] = []
    current: Pack | None = None  # the pack being grown
    for i in order:
        if current is not None:
            shared = min(current.prefix_len, common_prefix_len(rows[current.rows[0]].input_ids, rows[i].input_ids))
            if shared >= min_shared:
                grown = _pack(rows, [*current.rows, i], shared, tree)
                cheaper = sequence_cost(grown.length, pair_cost) <= (
                    sequence_cost(current.length, pair_cost) + sequence_cost(int(rows[i].input_ids.numel()), pair_cost)
                )
                if grown.length <= max_tokens and cheaper:
                    current = grown
                    continue
            packs.append(current)
        current = _pack(rows, [i], 0, tree)
    if current is not None:
        packs.append(current)
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


def pack_mask(segments: torch.Tensor, parents: Sequence[int] | None = None) -> torch.Tensor:
    """``[L, L]`` bool (True = may attend) from per-token segment ids (0 prefix, 1.. segments, -1 pad).

    ``parents[j - 1]`` is segment j's parent, as ``TailSegment.parent`` counts (an index into the segments,
    -1: the prefix); None: every segment hangs off the prefix. A token sees the earlier tokens of its own
    segment and of its ancestors'; padding sees only itself.
    """
    n = segments.numel()
    count = int(segments.max()) + 1 if n else 1
    parents = list(parents) if parents is not None else [-1] * (count - 1)
    # sees[a, b]: segment b is segment a or one of its ancestors (the prefix, 0, is everyone's)
    sees = torch.eye(count, dtype=torch.bool)
    sees[:, 0] = True
    for j in range(1, count):
        sees[j] |= sees[parents[j - 1] + 1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    real = segments >= 0
    idx = segments.clamp(min=0)
    allowed = sees[idx[:, None], idx[None, :]] & real[:, None] & real[None, :]
    return causal & (allowed | torch.eye(n, dtype=torch.bool))


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
    encoded_tokens: int = 0  # real tokens one forward encodes: each pack's prefix and trie segments once

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
    """One pack's ``ids``, ``pos``, ``seg`` (``width``), each segment's start, and each member's position map
    (position in the row -> packed index)."""
    p = pack.prefix_len
    if p + sum(part.length for part in pack.segments) != pack.length or len(pack.paths) != len(pack.rows):
        raise ValueError(
            f"Pack {pack.rows}: prefix {p} + segments {[part.length for part in pack.segments]} do not make its "
            f"length {pack.length}, or {len(pack.paths)} paths for {len(pack.rows)} rows; build packs with plan_packs"
        )
    ids = torch.full((width,), pad_id, dtype=torch.long)
    pos = torch.zeros(width, dtype=torch.long)
    seg = torch.full((width,), -1, dtype=torch.long)
    first = rows[pack.rows[0]].input_ids
    ids[:p], pos[:p], seg[:p] = first[:p], torch.arange(p), 0
    holder = {k: j for j, path in enumerate(pack.paths) for k in path}  # a member holding each segment
    starts = []
    cursor = p
    for k, part in enumerate(pack.segments):
        tokens = rows[pack.rows[holder[k]]].input_ids[p + part.offset : p + part.offset + part.length]
        span = slice(cursor, cursor + part.length)
        ids[span], pos[span], seg[span] = tokens, torch.arange(p + part.offset, p + part.offset + part.length), k + 1
        starts.append(cursor)
        cursor += part.length
    maps = [
        torch.cat([torch.arange(p), *(torch.arange(starts[k], starts[k] + pack.segments[k].length) for k in path)])
        for path in pack.paths
    ]
    return ids, pos, seg, starts, maps


def collate_packs(
    rows: Sequence[TrainRow], packs: Sequence[Pack], pad_id: int = 0, device: str | torch.device = "cpu"
) -> PackedBatch:
    """Tensors for ``packs`` (one micro-batch), right-padded to the longest pack."""
    width = max(p.length for p in packs)
    ids, pos, masks = [], [], []
    pack_idx, tok_idx, row_idx, col_idx, order = [], [], [], [], []
    layout = []
    for b, pack in enumerate(packs):
        i, p_ids, seg, starts, maps = _pack_tensors(rows, pack, width, pad_id)
        ids.append(i)
        pos.append(p_ids)
        masks.append(pack_mask(seg, [part.parent for part in pack.segments]))
        spans = tuple((s, s + part.length, part.parent) for s, part in zip(starts, pack.segments))
        layout.append((pack.prefix_len, spans))
        for r, where in zip(pack.rows, maps):
            positions = rows[r].positions
            packed = where[positions]
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
        encoded_tokens=sum(p.length for p in packs),
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
