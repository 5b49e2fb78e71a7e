"""A grouped-query SDPA attention for HF models that never materialises repeated key/value heads.

HF's ``sdpa`` attention copies every key/value head ``num_key_value_groups`` times (``repeat_kv``)
whenever an attention mask is present — always the case in batched rollouts with padding holes — so a
decode step copies the whole KV cache several times over (SmolLM2: 3×, ~1.6 GB per step at 8 rows ×
1500 tokens). torch's ``scaled_dot_product_attention(..., enable_gqa=True)`` handles the grouping
itself, with or without a mask (measured on CPU with torch 2.13: ~7× faster per layer at that size,
identical outputs). ``use_gqa_attention(model)`` switches a model to it; masks are built exactly as
for ``sdpa``.

Packed training sequences (``envace.engines.local.packing``) carry their layout on the mask
(``PackLayout``): the attention then runs per segment — the shared prefix causally, each trie segment
over [prefix, its ancestor segments, its own tokens] — instead of one masked attention over every
(query, key) pair of the pack, most of which the tree-causal mask discards (the CPU kernels do not skip
masked blocks). Exact: each query attends to exactly the keys the mask allows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

logger = logging.getLogger(__name__)

GQA_SDPA = "envace_gqa_sdpa"


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Same contract as HF's ``sdpa_attention_forward`` (query [B, H, q, D], key/value [B, Hkv, L, D])."""
    layout = getattr(attention_mask, PACK_LAYOUT_ATTR, None)
    if layout is not None and query.shape[2] == key.shape[2] == layout.width:
        return segment_attention(query, key, value, layout, scaling), None
    short = query.shape[2] <= DECODE_QUERY_TOKENS and (query.shape[2] == 1 or attention_mask is not None)
    if short and not torch.is_grad_enabled():
        return decode_attention(query, key, value, attention_mask, scaling), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


# decode steps (a handful of query tokens against a long cache with holes): two batched matmuls with
# the query heads grouped per key/value head beat the CPU flash kernel, which tiles for long queries
DECODE_QUERY_TOKENS = 4


def _stacked_rows(mask: torch.Tensor, q: int, length: int, group: int) -> torch.Tensor:
    """``mask`` ``[B, 1, q or 1, L]`` laid out per stacked query row (``group`` query heads per key head, each
    with its q queries): ``[B, 1, G*q, L]``."""
    b = mask.shape[0]
    return mask.expand(b, 1, q, length).unsqueeze(2).expand(b, 1, group, q, length).reshape(b, 1, group * q, length)


def decode_blocked(mask: torch.Tensor, q: int, length: int, group: int) -> torch.Tensor:
    """The keys each stacked query row of ``decode_attention`` may *not* attend, ``[B, 1, G*q, L]``, from a
    boolean ``mask`` ``[B, 1, q or 1, L]`` (True = attend) and ``group`` query heads per key head. The same
    for every layer of a forward: built once there."""
    return ~_stacked_rows(mask, q, length, group)


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    blocked: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v with grouped heads; returns [B, q, H, D] like ``gqa_sdpa_attention``.

    ``blocked`` (``decode_blocked``), where given, stands for a boolean ``mask``."""
    b, h, q, d = query.shape
    kv_heads = key.shape[1]
    group = h // kv_heads
    scale = scaling if scaling is not None else d**-0.5
    grouped = query.reshape(b, kv_heads, group * q, d)
    scores = _scores(grouped, key).float().mul_(scale)  # [B, Hkv, G*q, L], a fresh tensor
    if blocked is None and mask is not None and mask.dtype == torch.bool:
        blocked = decode_blocked(mask, q, key.shape[2], group)
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    elif mask is not None:  # None only for a single query token, which may see the whole cache
        scores += _stacked_rows(mask, q, key.shape[2], group).float()
    out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)  # [B, Hkv, G*q, D]
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous()


def _scores(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``query @ keyᵀ`` (``[..., n, D] x [..., L, D] -> [..., n, L]``, contiguous), read as each dtype is fastest."""
    if key.dtype == torch.float32:
        return torch.matmul(query, key.transpose(-1, -2))
    # bf16: the CPU bmm copies a transposed cache operand; (k qᵀ)ᵀ reads it in place (~3.7x), made contiguous
    # before the float32 math: a softmax over a strided last dim runs ~8x slower
    return torch.matmul(key, query.transpose(-1, -2)).transpose(-1, -2).contiguous()


def shared_prefix_blocked(mask: torch.Tensor, prefix_mask: torch.Tensor, group: int) -> torch.Tensor:
    """The keys each stacked query row of ``shared_prefix_decode_attention`` may *not* attend, ``[B, 1, G*q, P+S]``.

    ``prefix_mask`` ``[B, P]`` (row b's group's prefix, open = True), ``mask`` ``[B, 1, q, S]`` (its own
    keys); ``group`` query heads per key head. The same for every layer: built once per forward.
    """
    b, _, q, slen = mask.shape
    plen = prefix_mask.shape[1]
    open_keys = torch.cat([prefix_mask[:, None, None, :].expand(b, 1, q, plen), mask.expand(b, 1, q, slen)], dim=-1)
    return decode_blocked(open_keys, q, plen + slen, group)


def shared_prefix_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    blocked: torch.Tensor,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
    groups: list[tuple[int, slice | torch.Tensor]],
    scaling: float | None,
    uniform: int | None = None,
) -> torch.Tensor:
    """Decode attention of rows that share a cached prefix per group; returns [B, q, H, D].

    Row b attends to its group's prefix keys (``prefix_key[g]`` ``[Hkv, P, D]``) followed by its own keys
    (``key[b]`` ``[Hkv, S, D]``), except where ``blocked`` (``shared_prefix_blocked``: from the prefix
    mask and the rows' own key mask). The softmax runs over both parts at once, so the result is the attention over
    the concatenated keys (the unshared computation up to float summation order). The point is memory
    traffic: a decode step reads each group's prefix once for all its rows (one matmul per group with the
    rows' query heads stacked), not once per row; on a CPU a decode step is bound by reading the cache.
    ``groups`` lists (group index, its rows: a slice or an index tensor); every row is in one group.
    ``uniform`` = n when row r is in group r // n for every row (as right after ``repeat``): then each part is
    one batched matmul over all groups instead of a loop (the loop's per-call costs dominate small models).
    """
    b, h, q, d = query.shape
    kv_heads = prefix_key.shape[1]
    stack = (h // kv_heads) * q  # query rows per key head and batch row
    plen, slen = prefix_key.shape[2], key.shape[2]
    scale = scaling if scaling is not None else d**-0.5
    grouped = query.reshape(b, kv_heads, stack, d)
    # every row at once when uniform, else group by group (rows, their group's prefix, rows per group); the rows
    # are viewed as [groups, n, Hkv, stack, ·] and each group's n rows stack their queries against its prefix
    if uniform:
        parts = [(slice(None), slice(None), uniform)]
    else:
        parts = [
            (rows, slice(g, g + 1), rows.stop - rows.start if isinstance(rows, slice) else int(rows.numel()))
            for g, rows in groups
        ]

    def stacked(x: torch.Tensor, n: int) -> torch.Tensor:  # [G*n, Hkv, stack, ·] -> [G, Hkv, n*stack, ·]
        return (
            x.reshape(-1, n, kv_heads, stack, x.shape[-1]).transpose(1, 2).reshape(-1, kv_heads, n * stack, x.shape[-1])
        )

    def unstacked(x: torch.Tensor, n: int) -> torch.Tensor:  # the inverse: [G, Hkv, n*stack, ·] -> [G*n, Hkv, stack, ·]
        return x.view(-1, kv_heads, n, stack, x.shape[-1]).transpose(1, 2).reshape(-1, kv_heads, stack, x.shape[-1])

    def per_row(pieces: list[torch.Tensor]) -> torch.Tensor:  # the parts' results laid out by row
        if uniform:
            return pieces[0]
        whole = pieces[0].new_empty(b, kv_heads, stack, pieces[0].shape[-1])
        for (rows, _, _), piece in zip(parts, pieces):
            whole[rows] = piece
        return whole

    scores = per_row([unstacked(_scores(stacked(grouped[rows], n), prefix_key[g]), n) for rows, g, n in parts])
    if slen:
        scores = torch.cat([scores, _scores(grouped, key)], dim=-1)
    scores = scores.float().mul_(scale).masked_fill_(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = per_row(
        [unstacked(torch.matmul(stacked(probs[rows, :, :, :plen], n), prefix_value[g]), n) for rows, g, n in parts]
    )
    if slen:
        out += torch.matmul(probs[..., plen:], value)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous()


PACK_LAYOUT_ATTR = "envace_pack_layout"


@dataclass(frozen=True)
class PackLayout:
    """Where the segments of each packed row lie: ``rows[b] = (prefix_len, ((start, end, parent), ...))``.

    Row b's prefix is ``[0, prefix_len)``; its segments are the given half-open spans (contiguous, in
    order, starting at ``prefix_len``), each behind its ``parent`` (an index into the same spans, always an
    earlier one; -1: the prefix; a ``(start, end)`` pair means -1); positions after the last span are
    padding. A segment attends to the prefix, its ancestors' spans and causally to itself.
    ``blocked(n, group)`` is the mask of the keys a segment of n tokens may *not* attend among its own n
    keys (causal; the prefix has no other keys, a segment sees every key of its context, so those columns
    need no mask), repeated for ``group`` query heads per key head; built once per length and reused by
    every layer.
    """

    width: int
    rows: tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]
    _blocked: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        rows = tuple((prefix, tuple((*span, -1)[:3] for span in spans)) for prefix, spans in self.rows)
        for _, spans in rows:
            if any(not -1 <= parent < j for j, (_, _, parent) in enumerate(spans)):
                raise ValueError(f"PackLayout: a segment's parent must be an earlier segment or -1, got {spans}")
        object.__setattr__(self, "rows", rows)

    def blocked(self, n: int, group: int, device: torch.device) -> torch.Tensor:
        key = (n, group, device)
        if key not in self._blocked:
            allowed = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            self._blocked[key] = (~allowed).repeat(group, 1)
        return self._blocked[key]

    def row_sets(self) -> list[tuple[list[int], tuple[int, tuple[tuple[int, int, int], ...]]]]:
        """The rows grouped by identical layout (first-appearance order): each set runs as one batch."""
        sets: dict = {}
        for b, layout in enumerate(self.rows):
            sets.setdefault(layout, []).append(b)
        return [(rows, layout) for layout, rows in sets.items()]


def _equal_runs(spans: tuple[tuple[int, int, int], ...]) -> list[tuple[int, int, int, int]]:
    """Maximal runs of consecutive equal-length spans behind the same parent: (start, count, length,
    parent) each."""
    runs: list[list[int]] = []
    for start, end, parent in spans:
        if runs and runs[-1][2] == end - start and runs[-1][3] == parent:
            runs[-1][1] += 1
        else:
            runs.append([start, 1, end - start, parent])
    return [(a, n, length, parent) for a, n, length, parent in runs]


def _context(x: torch.Tensor, prefix: int, spans: tuple[tuple[int, int, int], ...], parent: int) -> torch.Tensor:
    """The keys (or values) of the prefix, then of segment ``parent`` and its ancestors' spans, root first
    (``x`` ``[B, Hkv, L, D]``): what a child of ``parent`` attends besides its own keys, or, given a segment
    itself, everything it attends. A view when those lie back to back."""
    chain = []
    while parent >= 0:
        chain.append(spans[parent][:2])
        parent = spans[parent][2]
    ranges = [[0, prefix]]
    for start, end in reversed(chain):
        if ranges[-1][1] == start:
            ranges[-1][1] = end
        else:
            ranges.append([start, end])
    parts = [x[:, :, a:b] for a, b in ranges]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def segment_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackLayout, scaling: float | None
) -> torch.Tensor:
    """Attention of packed rows, segment by segment; returns [B, L, H, D] (zeros at padding positions).

    Per row: the prefix attends causally to itself; each segment attends to its context (the prefix and
    its ancestor segments) and causally to its own tokens. The work is the pairs the tree-causal mask
    allows, not the whole L × L square. Rows with the same layout run as one batch, and so do
    consecutive sibling segments of equal length (K samples that all ran to their token budget): a run
    of n segments is two batched matmuls for the scores and two for the output, whatever n, instead of a
    matmul pair per segment over a copied [context, segment] key block. On CPU the plain matmuls run at
    the matmul kernels' speed, faster than the flash kernel with a mask on these short segments
    (SmolLM2 shapes, bf16, forward + backward, one AMD EPYC core: a 200-token suffix behind a
    715-token prefix 15 ms vs 23 ms; ``scripts/bench_step.py`` measures the whole update); for a small
    model, the number of calls is what counts.
    """
    group = query.shape[1] // key.shape[1]
    outputs, order = [], []
    for rows, (prefix, spans) in layout.row_sets():
        if rows == list(range(rows[0], rows[-1] + 1)):
            pick = slice(rows[0], rows[-1] + 1)
        else:
            pick = torch.tensor(rows, device=query.device)
        q, k, v = query[pick], key[pick], value[pick]
        pieces = [prefix_attention(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], layout, scaling)]
        index = {span[0]: j for j, span in enumerate(spans)}
        for start, n, length, parent in _equal_runs(spans):
            own = layout.blocked(length, group, query.device)
            if n == 1:  # its context and its own keys, gathered at once (a view when they lie back to back)
                keys, values = _context(k, prefix, spans, index[start]), _context(v, prefix, spans, index[start])
                pieces.append(masked_attention(q[:, :, start : start + length], keys, values, own, scaling))
            else:
                ctx_k, ctx_v = _context(k, prefix, spans, parent), _context(v, prefix, spans, parent)
                span = slice(start, start + n * length)
                pieces.append(
                    suffix_run_attention(q[:, :, span], ctx_k, ctx_v, k[:, :, span], v[:, :, span], n, own, scaling)
                )
        used = spans[-1][1] if spans else prefix
        if used < layout.width:
            pieces.append(query.new_zeros(len(rows), query.shape[1], layout.width - used, query.shape[3]))
        outputs.append(torch.cat(pieces, dim=2))
        order.extend(rows)
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)
    if order != list(range(len(order))):
        out = out[torch.tensor(order, device=query.device).argsort()]
    return out.transpose(1, 2).contiguous()


def suffix_run_attention(
    query: torch.Tensor,
    ctx_key: torch.Tensor,
    ctx_value: torch.Tensor,
    own_key: torch.Tensor,
    own_value: torch.Tensor,
    n: int,
    blocked: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """n consecutive segments of S tokens each behind one context, in one batch; returns [B, H, n*S, D].

    ``query`` ``[B, H, n*S, D]`` (the run's queries); ``ctx_key``/``ctx_value`` ``[B, Hkv, C, D]`` the keys
    every segment of the run sees (the prefix and their common ancestors); ``own_key``/``own_value``
    ``[B, Hkv, n*S, D]`` the run's own; ``blocked`` ``[G*S, S]`` the causal mask of one segment over its own
    keys. Segment j's queries are scored against the context (one matmul for every segment) and against
    its own S keys (one batched matmul over the segments); the softmax runs over both parts at once, so
    each segment's result is its attention over [context, own keys], as ``masked_attention`` computes it
    (up to float summation order in the output's sum).
    """
    b, heads, _, d = query.shape
    kv_heads = ctx_key.shape[1]
    group = heads // kv_heads
    s = blocked.shape[-1]
    context = ctx_key.shape[2]
    scale = scaling if scaling is not None else d**-0.5
    # [B, Hkv, G, n, S, D] -> [B, Hkv, n, G*S, D]: per key head, segment j's G*S query rows together
    grouped = (query * scale).reshape(b, kv_heads, group, n, s, d).transpose(2, 3).reshape(b, kv_heads, n, group * s, d)
    own_keys = own_key.reshape(b, kv_heads, n, s, d)
    own_values = own_value.reshape(b, kv_heads, n, s, d)
    to_context = torch.matmul(grouped.reshape(b, kv_heads, n * group * s, d), ctx_key.transpose(-1, -2))
    to_own = torch.matmul(grouped, own_keys.transpose(-1, -2))  # [B, Hkv, n, G*S, S]
    scores = torch.cat([to_context.reshape(b, kv_heads, n, group * s, context), to_own], dim=-1)
    scores[..., context:].masked_fill_(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(ctx_value.dtype)
    out = torch.matmul(probs[..., :context].reshape(b, kv_heads, n * group * s, context), ctx_value)
    out = out.reshape(b, kv_heads, n, group * s, d) + torch.matmul(probs[..., context:], own_values)
    # back to [B, H, n*S, D]
    return out.reshape(b, kv_heads, n, group, s, d).transpose(2, 3).reshape(b, heads, n * s, d)


# from this many prefix tokens on, the prefix's causal self-attention runs in torch's flash kernel
# (``is_causal``: it skips the blocks above the diagonal and never materialises the scores); below it the
# two plain matmuls win. SmolLM2 shapes (9 query / 3 key heads, D = 64), bf16, forward + backward, one AMD
# EPYC core: 200 tokens 3.1 vs 6.2 ms, 400: 22 vs 19 ms, 1,000: 178 vs 70 ms, 2,500: 1,113 vs 338 ms
# (the matmul path's [G*P, P] float32 scores fall out of cache). Suffixes keep the matmuls: their mask is
# not top-left causal, and with a mask the flash kernel is no faster (200 behind 1,500: 46 vs 41 ms).
CAUSAL_FLASH_MIN_TOKENS = 384


def prefix_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackLayout, scaling: float | None
) -> torch.Tensor:
    """Causal self-attention of rows' shared prefixes, ``[B, H, P, D]``: flash kernel or matmuls by length."""
    if query.shape[2] >= CAUSAL_FLASH_MIN_TOKENS:
        return F.scaled_dot_product_attention(
            query, key, value, scale=scaling, is_causal=True, enable_gqa=key.shape[1] != query.shape[1]
        )
    blocked = layout.blocked(query.shape[2], query.shape[1] // key.shape[1], query.device)
    return masked_attention(query, key, value, blocked, scaling)


def masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, blocked: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """softmax(q kᵀ · scale, except where ``blocked``) v for B rows, grouped query heads; [B, H, S, D].

    query ``[B, H, S, D]``, key/value ``[B, Hkv, T, D]``; ``blocked`` ``[G*S, M]`` bool over the last M ≤ T
    keys (True = may not attend; the first T - M keys are open to every query; G = H / Hkv query heads
    per key head, stacked in HF's ``repeat_kv`` order; every query keeps at least one key). The scale is
    applied to q (exact for the usual power-of-two 1/sqrt(D)), the mask in place on the matmul's output
    (only its last M columns: a suffix behind a 1,500-token prefix masks its own ~200 keys, not 1,700),
    the softmax in float32; matmuls in the inputs' dtype.
    """
    b, heads, s, d = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    grouped = (query * scale).reshape(b, kv_heads, (heads // kv_heads) * s, d)
    scores = torch.matmul(grouped, key.transpose(-1, -2))
    scores[..., scores.shape[-1] - blocked.shape[-1] :].masked_fill_(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(probs, value).reshape(b, heads, s, d)


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_SDPA, sdpa_mask)


def use_gqa_attention(model: Any) -> bool:
    """Switch a model using ``sdpa`` to ``GQA_SDPA`` (in place); returns whether it switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(GQA_SDPA)
    return model.config._attn_implementation == GQA_SDPA
