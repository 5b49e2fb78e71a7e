"""``PrefixKVCache``: a bounded LRU of key/value states keyed by the token ids that produced them.

A multi-turn chat re-sends the whole conversation with every request: turn t's prompt is turn t-1's
prompt and reply plus the new messages, and requests of one benchmark share long system prompts (tool
schemas). The local backend stores, for each finished row, the KV states of every token it fed (prompt
+ generated tokens except the last, which is never fed) and, for a new prompt, reuses the KV of the
longest common token prefix with any stored sequence, so only the rest of the prompt is encoded.

Choices:
- Matching is by longest common prefix (LCP) with *any* entry, not only by "entry is a prefix of the
  prompt": a causal model's KV of the first p tokens depends on those tokens only, so any shared head is
  reusable. This also covers re-tokenisation at the reply/turn boundary (the re-rendered assistant text
  may tokenise differently from the sampled tokens) and shared system prompts across conversations.
- At most ``len(prompt) - 1`` tokens are reused (the last prompt token must be fed to get its logits);
  a match shorter than ``min_prefix_tokens`` is ignored (not worth a cache copy).
- The bound is on tokens (sum of stored sequence lengths), evicting least-recently used entries; an
  entry longer than the whole budget is not stored; storing a sequence drops the entries that are
  prefixes of it (their KV is contained in the new entry).
- Entries hold per-layer ``(keys, values)`` of shape ``[kv_heads, n, head_dim]`` on the model's device,
  in the dtype the model produced them (so a cache never mixes precisions: one cache per backend).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [kv_heads, n, head_dim]


@dataclass(frozen=True)
class PrefixHit:
    """``length`` reusable tokens and their per-layer KV (``[kv_heads, length, head_dim]`` views)."""

    length: int
    kv: tuple[LayerKV, ...]


@dataclass(frozen=True)
class _Entry:
    ids: torch.Tensor  # [n] long, CPU
    kv: tuple[LayerKV, ...]


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of leading positions where the 1-D tensors ``a`` and ``b`` agree."""
    m = min(a.numel(), b.numel())
    if m == 0:
        return 0
    differ = (a[:m] != b[:m]).nonzero()
    return int(differ[0, 0]) if differ.numel() else m


class PrefixKVCache:
    """LRU of KV states bounded by ``budget_tokens`` stored tokens (see the module docstring)."""

    def __init__(self, budget_tokens: int, min_prefix_tokens: int = 16) -> None:
        if budget_tokens < 0 or min_prefix_tokens < 1:
            raise ValueError(
                f"PrefixKVCache: need budget_tokens >= 0 and min_prefix_tokens >= 1, got "
                f"{budget_tokens} and {min_prefix_tokens} (eval.prefix_cache_tokens)"
            )
        self.budget_tokens = budget_tokens
        self.min_prefix_tokens = min_prefix_tokens
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.tokens = 0  # stored tokens, always <= budget_tokens

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt_ids: Sequence[int]) -> PrefixHit | None:
        """The longest reusable prefix of ``prompt_ids`` (marks its entry recently used), or None."""
        want = len(prompt_ids) - 1
        if want < self.min_prefix_tokens or not self._entries:
            return None
        query = torch.tensor(prompt_ids[:want], dtype=torch.long)
        head = query[: self.min_prefix_tokens]
        best_key, best = None, 0
        for key, entry in self._entries.items():
            if entry.ids.numel() <= best or not torch.equal(entry.ids[: self.min_prefix_tokens], head):
                continue
            length = common_prefix_length(entry.ids, query)
            if length > best:
                best_key, best = key, length
        if best_key is None:
            return None
        self._entries.move_to_end(best_key)
        kv = self._entries[best_key].kv
        return PrefixHit(best, tuple((k[:, :best], v[:, :best]) for k, v in kv))

    def fits(self, n: int) -> bool:
        """Whether a sequence of ``n`` tokens would be stored (long enough to reuse, within the budget)."""
        return self.min_prefix_tokens <= n <= self.budget_tokens

    def store(self, ids: Sequence[int], kv: Sequence[LayerKV]) -> None:
        """Keep the KV of sequence ``ids`` (``kv[layer] = (keys, values)``, ``[kv_heads, len(ids), head_dim]``)."""
        n = len(ids)
        if not self.fits(n):
            return
        if any(k.shape[-2] != n or v.shape[-2] != n for k, v in kv):
            raise ValueError(f"PrefixKVCache.store: {n} ids but KV lengths {[k.shape[-2] for k, _ in kv]}")
        key = tuple(int(t) for t in ids)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        for old in [old for old in self._entries if len(old) <= n and key[: len(old)] == old]:
            self.tokens -= len(self._entries.pop(old).ids)
        self._entries[key] = _Entry(torch.tensor(key, dtype=torch.long), tuple(kv))
        self.tokens += n
        while self.tokens > self.budget_tokens:
            _, evicted = self._entries.popitem(last=False)
            self.tokens -= evicted.ids.numel()
