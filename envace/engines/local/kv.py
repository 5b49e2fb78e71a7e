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
- ``repeat`` expands a prefilled row K times (one shared prefill of a prompt for its K samples).
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
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from envace.engines.local.lean import LeanLlama
from envace.engines.local.precision import inference_model

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


class BatchedStreams:
    """Rows keyed by hashable ids (e.g. trajectory indices) sharing one cache of ``model``."""

    def __init__(
        self,
        model: Any,
        keys: Sequence[Any],
        pad_id: int = 0,
        precision: str = "fp32",
        lean: bool | LeanLlama | None = None,
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
        return int(self.mask.shape[1])

    def row_of(self, key: Any) -> int:
        return self.keys.index(key)

    def fed_count(self, key: Any) -> int:
        """How many tokens of this row's stream are in the cache."""
        return int(self.next_pos[self.row_of(key)])

    @torch.no_grad()
    def append(self, pieces: Mapping[Any, Sequence[int]]) -> dict[Any, torch.Tensor]:
        """Feed each keyed row its new tokens; returns the float32 CPU logits after each row's last new token.

        Rows absent from ``pieces`` (or with an empty piece) feed padding only.
        """
        lengths = [len(pieces.get(k, ())) for k in self.keys]
        width = max(lengths, default=0)
        if width == 0:
            return {}
        if self.cache_len == 0 and min(lengths) == 0:
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
            all_logits = self.lean(ids, positions, self.mask, self.cache, keep)
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
        column = torch.searchsorted(keep, last)
        # sampling happens on the CPU (per-trajectory CPU generators): one [rows, vocab] transfer per step
        logits = all_logits[torch.arange(rows, device=self.device), column].float().cpu()
        return {k: logits[r] for r, k in enumerate(self.keys) if lengths[r]}

    def repeat(self, new_keys: Sequence[Sequence[Any]]) -> None:
        """Replace row i by len(new_keys[i]) copies keyed new_keys[i] (all groups the same size)."""
        sizes = {len(g) for g in new_keys}
        if len(new_keys) != len(self.keys) or len(sizes) != 1:
            raise ValueError(f"repeat: need one equal-sized key group per row, got sizes {sorted(sizes)}")
        times = sizes.pop()
        self.cache.batch_repeat_interleave(times)
        self.mask = self.mask.repeat_interleave(times, dim=0)
        self.next_pos = self.next_pos.repeat_interleave(times, dim=0)
        self.keys = [k for group in new_keys for k in group]

    def retain(self, keys: Sequence[Any]) -> None:
        """Keep only the rows with these keys (in this order); frees the others' cache rows."""
        if list(keys) == self.keys:
            return
        index = torch.tensor([self.row_of(k) for k in keys], dtype=torch.long, device=self.device)
        if self.cache_len:
            self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.next_pos = self.next_pos[index]
        self.keys = list(keys)
