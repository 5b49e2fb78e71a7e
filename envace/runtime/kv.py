"""Batched, append-only KV caches: many token streams of one model advanced together.

``BatchedStreams`` keeps one HF ``DynamicCache`` whose batch rows are streams (one row per trajectory
stream), a boolean key mask ``[rows, cache_len]`` and each row's next position id. ``append`` feeds,
for every row, the tokens that row has not fed yet (any number, possibly none); rows are right-padded
to the longest piece, the padding is masked out of every later attention (holes in the cache) and
position ids are passed explicitly, so each row sees exactly the positions 0..n-1 of its own tokens,
as if it were encoded alone. The history is never re-encoded.

Costs and choices:
- Padding holes stay in the cache: a row that feeds nothing while others feed T tokens grows by T
  masked slots. ``retain`` drops finished rows; memory is bounded by rows × (longest schedule).
- ``repeat`` expands a prefilled row K times (one shared prefill of a prompt for its K samples). With
  ``LeanLlama`` decoding, the prefilled rows are not copied K times: they become a ``SharedPrefix`` that
  every row of the group attends to (``shared_prefix_decode_attention``), and the cache holds only what
  each row feeds after it. A decode step then reads each prompt's keys/values once per group instead of
  once per row, and the rollout's cache is smaller. SmolLM2, float32, one AMD EPYC core (AVX2), 2 prompts
  × 4 samples: 159 -> 134 ms per decode step behind 700-token prompts, 243 -> 183 ms behind 1,500
  (``scripts/bench_decode.py --compare share``). HF's forward needs the rows materialised, so without
  ``LeanLlama`` (or with ``share_prefixes=False``) ``repeat`` copies. By default (``share_prefixes=None``)
  a prefix too small to be worth it (``SHARE_MIN_BYTES`` per row and layer) is copied too.
- The first ``append`` must give every row at least one token (a row of only masked keys would
  attend to nothing and produce NaNs).
- Logits are computed only at each row's last fed position (``logits_to_keep``): no [T, vocab] tensor
  for long prefills.
- Cache layers are ``GrowingLayer``s (amortised appends into a doubling buffer) instead of HF's
  ``DynamicLayer`` (a full ``torch.cat`` of the cache for every token).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from envace.runtime.lean import LeanLlama
from envace.runtime.precision import inference_model

logger = logging.getLogger(__name__)


def _ints(piece: Sequence[int] | torch.Tensor) -> list[int]:
    return piece.tolist() if torch.is_tensor(piece) else [int(t) for t in piece]


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer writing into a capacity buffer that doubles when full.

    HF's ``DynamicLayer`` concatenates the whole cache with every new token (O(length) copies per
    decode step, O(length²) per generation); this layer copies only the new keys/values and
    reallocates O(log length) times. ``keys``/``values`` are views of the filled part.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = key_states.new_empty(*key_states.shape[:-2], 0, key_states.shape[-1])
        self._v = value_states.new_empty(*value_states.shape[:-2], 0, value_states.shape[-1])
        self._len = 0

    def _view(self) -> None:
        self.keys, self.values = self._k[..., : self._len, :], self._v[..., : self._len, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self._len + n > self._k.shape[-2]:
            capacity = max(2 * (self._len + n), 64)
            grow = lambda buf: torch.cat(
                [buf[..., : self._len, :], buf.new_empty(*buf.shape[:-2], capacity - self._len, buf.shape[-1])], dim=-2
            )
            self._k, self._v = grow(self._k), grow(self._v)
        self._k[..., self._len : self._len + n, :] = key_states
        self._v[..., self._len : self._len + n, :] = value_states
        self._len += n
        self._view()
        return self.keys, self.values

    def crop(self, max_length: int) -> None:
        if self.is_initialized:
            self._len = min(self._len, max_length if max_length >= 0 else self._len + max_length)
            self._view()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k[..., : self._len, :].repeat_interleave(repeats, dim=0)
            self._v = self._v[..., : self._len, :].repeat_interleave(repeats, dim=0)
            self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._view()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def make_cache(model: Any) -> DynamicCache:
    """A ``DynamicCache`` of ``GrowingLayer``s for full-attention models (else HF's default layers)."""
    cache = DynamicCache(config=model.config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


@dataclass
class SharedPrefix:
    """Per-group prefix keys/values that several rows attend to before their own cached tokens.

    ``keys[l]``/``values[l]``: layer l's ``[G, Hkv, P, D]``; ``mask`` ``[G, P]`` (False at the prefill's
    padding holes); ``group`` ``[B]``: each row's group. ``groups`` lists, per group that still has rows,
    (group, its rows as a slice where they are contiguous, else an index tensor).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    group: torch.Tensor
    groups: list[tuple[int, slice | torch.Tensor]] = field(init=False)
    row_mask: torch.Tensor = field(init=False)  # [B, P]: each row's group's prefix mask
    uniform: int | None = field(init=False)  # n when row r is in group r // n for every row (after ``repeat``)

    def __post_init__(self) -> None:
        self.groups = []
        for g in torch.unique(self.group).tolist():
            rows = torch.nonzero(self.group == g).flatten()
            first, last = int(rows[0]), int(rows[-1])
            self.groups.append((g, slice(first, last + 1) if last - first + 1 == len(rows) else rows))
        self.row_mask = self.mask[self.group]
        groups, rows = int(self.mask.shape[0]), int(self.group.numel())
        n = rows // groups if groups and rows % groups == 0 else 0
        even = n > 0 and torch.equal(self.group, torch.arange(groups, device=self.group.device).repeat_interleave(n))
        self.uniform = n if even else None

    def select(self, index: torch.Tensor) -> SharedPrefix:
        """The prefix of rows ``index`` (groups left without rows are dropped, freeing their keys/values)."""
        group = self.group[index]
        used, group = torch.unique(group, return_inverse=True)
        if len(used) == self.mask.shape[0]:
            return SharedPrefix(self.keys, self.values, self.mask, group)
        return SharedPrefix([k[used] for k in self.keys], [v[used] for v in self.values], self.mask[used], group)

    def materialise(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s prefix keys and values copied out per row: ``[B, Hkv, P, D]`` each."""
        return self.keys[layer][self.group], self.values[layer][self.group]


class BatchedStreams:
    """Rows keyed by hashable ids (e.g. trajectory indices) sharing one cache of ``model``."""

    def __init__(
        self,
        model: Any,
        keys: Sequence[Any],
        pad_id: int = 0,
        precision: str = "fp32",
        lean: bool | LeanLlama | None = None,
        share_prefixes: bool | None = None,
    ):
        if len(set(keys)) != len(keys):
            raise ValueError(f"BatchedStreams: duplicate row keys {list(keys)}")
        # bf16: forwards run on a bf16-weight copy of the model (``inference_model``; cache in bf16),
        # fp32: on the model itself
        self.model = inference_model(model, precision)
        # Llama-family models decode through ``LeanLlama`` (same computation, a fraction of HF's per-call
        # overhead); ``lean=False`` forces HF's forward, None = wherever the model qualifies; a ``LeanLlama``
        # built for this model by another streams object is reused (its fused weights cost ~0.1 s to build)
        if isinstance(lean, LeanLlama):
            self.lean: LeanLlama | None = lean
        else:
            use_lean = LeanLlama.supports(self.model) if lean is None else lean
            self.lean = LeanLlama(self.model) if use_lean else None
        self.share_prefixes = share_prefixes
        self.shared: SharedPrefix | None = None  # set by ``repeat`` (LeanLlama only)
        self.pad_id = pad_id
        self.precision = precision
        self.keys: list[Any] = list(keys)
        self.device = next(model.parameters()).device
        self.cache = make_cache(model)
        self.mask = torch.zeros(len(keys), 0, dtype=torch.bool, device=self.device)
        self.next_pos = torch.zeros(len(keys), dtype=torch.long, device=self.device)
        self.fed_tokens = 0  # real tokens fed (for throughput metrics)

    @property
    def cache_len(self) -> int:
        """Cached slots per row, padding holes included (after a sharing ``repeat``: the rows' own, past the prefix)."""
        return int(self.mask.shape[1])

    def row_of(self, key: Any) -> int:
        return self.keys.index(key)

    def fed_count(self, key: Any) -> int:
        """How many tokens of this row's stream are in the cache."""
        return int(self.next_pos[self.row_of(key)])

    def append(self, pieces: Mapping[Any, Sequence[int]]) -> dict[Any, torch.Tensor]:
        """Feed each keyed row its new tokens; returns the float32 CPU logits after each row's last new token.

        Rows absent from ``pieces`` (or with an empty piece) feed padding only.
        """
        logits = self.append_logits(pieces)
        if logits is None:
            return {}
        return {k: logits[r] for r, k in enumerate(self.keys) if len(pieces.get(k, ()))}

    @torch.no_grad()
    def append_logits(self, pieces: Mapping[Any, Sequence[int]]) -> torch.Tensor | None:
        """``append``'s logits as one ``[rows, vocab]`` float32 CPU tensor in ``keys`` order (None when nothing
        was fed); a row that fed nothing has a row of meaningless values. A decode step reads it with one
        index instead of a tensor per row."""
        lengths = [len(pieces.get(k, ())) for k in self.keys]
        width = max(lengths, default=0)
        if width == 0:
            return None
        if self.cache_len == 0 and self.shared is None and min(lengths) == 0:
            empty = [k for k, n in zip(self.keys, lengths) if n == 0]
            raise ValueError(f"BatchedStreams: first append must feed every row; rows {empty} got no tokens")
        rows = len(self.keys)
        # one tensor call for the whole batch (a decode step feeds one token to each of many rows)
        padded = [_ints(pieces.get(k, ())) + [self.pad_id] * (width - n) for k, n in zip(self.keys, lengths)]
        ids = torch.tensor(padded, dtype=torch.long, device=self.device)
        lengths_t = torch.tensor(lengths, device=self.device)
        new_mask = torch.arange(width, device=self.device).unsqueeze(0) < lengths_t.unsqueeze(1)
        positions = self.next_pos.unsqueeze(1) + torch.arange(width, device=self.device).unsqueeze(0)
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        last = torch.tensor([max(n - 1, 0) for n in lengths], device=self.device)
        keep = torch.unique(last)
        if self.lean is not None:
            all_logits = self.lean(ids, positions, self.mask, self.cache, keep, prefix=self.shared)
        else:
            out = self.model(
                input_ids=ids,
                attention_mask=self.mask.long(),
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
            self.cache, all_logits = out.past_key_values, out.logits
        self.next_pos = self.next_pos + lengths_t
        self.fed_tokens += int(lengths_t.sum())
        # sampling happens on the CPU (per-trajectory CPU generators): one [rows, vocab] transfer per step
        if keep.numel() == 1:
            return all_logits[:, 0].float().cpu()
        column = torch.searchsorted(keep, last)
        return all_logits[torch.arange(rows, device=self.device), column].float().cpu()

    def repeat(self, new_keys: Sequence[Sequence[Any]]) -> None:
        """Replace row i by len(new_keys[i]) copies keyed new_keys[i] (all groups the same size)."""
        sizes = {len(g) for g in new_keys}
        if len(new_keys) != len(self.keys) or len(sizes) != 1:
            raise ValueError(f"repeat: need one equal-sized key group per row, got sizes {sorted(sizes)}")
        times = sizes.pop()
        if self.shared is not None:  # a second repeat: the first one's groups are copied out
            self._unshare()
        if self.lean is not None and self.cache_len and self._share_prefix():
            group = torch.arange(len(self.keys), device=self.device).repeat_interleave(times)
            layers = self.cache.layers
            self.shared = SharedPrefix(
                [layer.keys.contiguous() for layer in layers],
                [layer.values.contiguous() for layer in layers],
                self.mask,
                group,
            )
            self.cache = make_cache(self.model)
            self.mask = torch.zeros(len(group), 0, dtype=torch.bool, device=self.device)
        else:
            self.cache.batch_repeat_interleave(times)
            self.mask = self.mask.repeat_interleave(times, dim=0)
        self.next_pos = self.next_pos.repeat_interleave(times, dim=0)
        self.keys = [k for group in new_keys for k in group]

    # ``share_prefixes=None`` shares a prefix whose keys and values are at least this many bytes per row and
    # layer. Sharing adds a dozen small calls per layer and decode step and saves re-reading the prefix once
    # per row; measured (``scripts/bench_peer_trl.py``'s 0.7M-parameter Llama, fp32, 8 prompts x 4 samples,
    # no-bf16 AMD EPYC): at 32 KB (64-token prompts) copying is 1% faster at 1 thread and 8% at 2; at 64 KB
    # sharing is 12% faster at 1 thread (3% slower at 2); from 128 KB on, sharing wins at both (8-36%).
    # SmolLM2 behind a 500-token prompt reads 750 KB per row and layer in fp32: always shared.
    SHARE_MIN_BYTES = 64 << 10

    def _share_prefix(self) -> bool:
        """Whether ``repeat`` shares the prefilled rows (``share_prefixes``; None: by their size)."""
        if self.share_prefixes is not None:
            return self.share_prefixes
        keys = self.cache.layers[0].keys  # [rows, kv heads, length, head dim]
        per_row = 2 * keys[0].numel() * keys.element_size()
        return per_row >= self.SHARE_MIN_BYTES

    def _unshare(self) -> None:
        """Copy the shared prefix into every row's own cache (rows then stand alone, as without sharing)."""
        shared, own = self.shared, self.cache
        cache = make_cache(self.model)
        for i, layer in enumerate(own.layers):
            keys, values = shared.materialise(i)
            if self.cache_len:
                keys, values = torch.cat([keys, layer.keys], dim=2), torch.cat([values, layer.values], dim=2)
            cache.update(keys, values, i)
        self.cache, self.shared = cache, None
        self.mask = torch.cat([shared.row_mask, self.mask], dim=1)

    def retain(self, keys: Sequence[Any]) -> None:
        """Keep only the rows with these keys (in this order); frees the others' cache rows."""
        if list(keys) == self.keys:
            return
        index = torch.tensor([self.row_of(k) for k in keys], dtype=torch.long, device=self.device)
        if self.cache_len:
            self.cache.batch_select_indices(index)
        if self.shared is not None:
            self.shared = self.shared.select(index)
        self.mask = self.mask[index]
        self.next_pos = self.next_pos[index]
        self.keys = list(keys)
