"""PrefixKVCache (longest common prefix, LRU under a token budget) and seeding a BatchedStreams cache from it."""

from __future__ import annotations

import pytest
import torch

from envace.inference.local import seed_prefixes
from envace.inference.prefix_cache import PrefixKVCache, common_prefix_length
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.kv import BatchedStreams

torch.set_num_threads(1)


def _kv(n: int, layers: int = 2, tag: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake per-layer KV ``[2 heads, n, 3]`` whose entry at position i is ``tag + i`` (values: negated)."""
    pos = (tag + torch.arange(n, dtype=torch.float32)).view(1, n, 1).expand(2, n, 3).contiguous()
    return [(pos + layer, -pos - layer) for layer in range(layers)]


def test_common_prefix_length():
    t = torch.tensor
    assert common_prefix_length(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert common_prefix_length(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix_length(t([9]), t([1])) == 0
    assert common_prefix_length(t([], dtype=torch.long), t([1])) == 0


def test_lookup_takes_the_longest_common_prefix_and_leaves_one_token_to_feed():
    cache = PrefixKVCache(1000, min_prefix_tokens=16)
    a = list(range(100, 140))  # 40 tokens
    b = list(range(100, 120)) + [7] * 10  # shares 20 tokens with a
    cache.store(a, _kv(40, tag=0.0))
    cache.store(b, _kv(30, tag=1000.0))
    hit = cache.lookup(list(range(100, 130)) + [5, 6])  # shares 30 with a, 20 with b
    assert hit.length == 30
    assert torch.equal(hit.kv[1][0][0, :, 0], torch.arange(30, dtype=torch.float32) + 1)  # a's layer-1 keys
    assert torch.equal(hit.kv[0][1][:, -1], torch.full((2, 3), -29.0))
    assert cache.lookup(b + [1]).length == 30  # b itself, the last prompt token is never reused
    assert cache.lookup(a).length == 39
    assert cache.lookup(list(range(100, 115)) + [0] * 20) is None  # 15 < min_prefix_tokens
    assert cache.lookup(list(range(100, 110))) is None


def test_store_evicts_least_recently_used_and_drops_entries_it_contains():
    cache = PrefixKVCache(100, min_prefix_tokens=4)
    x, y, z = ([k] * 40 for k in (1, 2, 3))
    cache.store(x, _kv(40))
    cache.store(y, _kv(40))
    assert cache.lookup(x + [0]).length == 40  # x becomes the most recently used
    cache.store(z, _kv(40))  # 120 > 100: evicts y, not x
    assert (cache.tokens, len(cache)) == (80, 2)
    assert cache.lookup(y + [0]) is None and cache.lookup(z + [0]).length == 40
    cache.store(x + [5] * 10, _kv(50))  # contains x: x is dropped, nothing else evicted
    assert (cache.tokens, len(cache)) == (90, 2) and cache.lookup(x + [5] * 11).length == 50
    cache.store([9] * 101, _kv(101))  # longer than the budget
    cache.store([9] * 3, _kv(3))  # shorter than min_prefix_tokens
    assert (cache.tokens, len(cache)) == (90, 2)
    with pytest.raises(ValueError, match="KV lengths"):
        cache.store([8] * 10, _kv(9))
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        PrefixKVCache(-1)


def test_seeded_prefixes_give_the_logits_of_a_full_encoding():
    """Rows reusing prefixes of different lengths (one none) get the logits of encoding everything afresh."""
    model, _ = load_model_and_tokenizer(ModelSpec("tiny", seed=1))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(20, 300, (n,), generator=g).tolist() for n in (40, 33, 25)]
    reference = BatchedStreams(model, [0, 1, 2]).append(dict(enumerate(prompts)))
    cache = PrefixKVCache(10_000)
    for row, n in ((0, 30), (1, 20)):  # entries that share n tokens with the prompt, then diverge
        entry = prompts[row][:n] + [7, 8]
        alone = BatchedStreams(model, [0])
        alone.append({0: entry})
        cache.store(entry, [(layer.keys[0], layer.values[0]) for layer in alone.cache.layers])
    hits = [cache.lookup(p) for p in prompts]
    assert [h.length if h else 0 for h in hits] == [30, 20, 0]
    streams = BatchedStreams(model, [0, 1, 2])
    seed_prefixes(streams, hits)
    assert streams.mask.sum(dim=1).tolist() == [30, 20, 0] and streams.cache_len == 30
    logits = streams.append({r: p[(h.length if h else 0) :] for r, (p, h) in enumerate(zip(prompts, hits))})
    for row in range(3):  # a position off by one gives ~1e-3 on this model
        torch.testing.assert_close(logits[row], reference[row], atol=1e-5, rtol=0)
    assert streams.next_pos.tolist() == [40, 33, 25]
