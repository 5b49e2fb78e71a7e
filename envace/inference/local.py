"""``LocalHFBackend``: a ``ChatBackend`` over an in-process Hugging Face causal LM.

Requests are rendered with a ``ChatFormatter`` (the tokenizer's tool-capable chat template), sorted
by prompt length and decoded in batches of ``batch_size``. Each request's prompt is prefilled on its
own (``_prefill``: no padding to the batch's longest prompt), then the batch decodes together through
``envace.runtime.kv.BatchedStreams``: one KV cache whose rows are the requests, holes masked and
position ids explicit, so each row is computed as if it were alone (up to floating-point effects of the
batch shape). Finished rows leave the batch at once.

Sampling (``sample_next_tokens``): each request has its own temperature (0 = greedy) and its own CPU
``torch.Generator`` seeded with ``request.seed``. Every step runs one float32 softmax(logits / T)
over the sampling rows; each draws one uniform from its generator and takes the first token whose
cumulative probability exceeds it (inverse CDF: cumsum + searchsorted); greedy rows take the argmax.
A request's output depends on its seed, not on which requests share its batch.

Prefix cache (``envace.inference.prefix_cache.PrefixKVCache``, ``prefix_cache_tokens`` stored tokens,
0 = off): the KV of every prefilled prompt, and of every finished row (prompt + generated tokens but
the last), is kept in an LRU; a prompt reuses the KV of its longest common token prefix with any entry
(at least ``MIN_PREFIX_TOKENS``) and feeds only the rest. Turn t of an episode thus encodes only the new
messages; rows of one batch that share a head (parallel rehearsal attempts send the same prompt; tasks
of a domain share the system prompt and tool schemas) encode it once, since each row's prompt is stored
before the next row is prefilled. In the decode batch each row's prompt KV is written left-aligned, the
gap to the longest one a masked hole (the ``BatchedStreams`` layout).

Why prefill row by row: a padded batched prefill computes every row at the width of the longest
remaining prompt, and after prefix reuse the rows' remaining lengths differ by 10-100×, while on a CPU a
batch-1 prefill runs at the same tokens/s as a batched one (SmolLM2-135M, bf16, one AMD EPYC core: 351
vs 352 tokens/s for 1 vs 8 rows of 1,200 tokens). Measured on the science test-time sweep (8 tool-world
tasks, parallel N=2, the trained SmolLM2 rehearser, one core of that EPYC): 298 s padded with a
16,384-token cache, 126 s row by row, 102 s row by row with a 131,072-token cache. Decoding then
dominates: ~100 ms a step for 8 rows behind ~1,000 cached tokens, ~180 ms for 16 (82 vs 88 tokens/s),
so batches larger than 8 buy little.

Precision (``envace.runtime.precision``): ``auto | fp32 | bf16``; bf16 forwards run on a bf16
copy of the weights (``inference_model``); logits are up-cast and sampled in float32.

Generation stops at an end-of-turn token (``ChatFormatter.end_of_turn_token_ids``), at the
request's ``max_new_tokens``, or at one of its ``stop`` strings (the text is cut before it).
``completion_tokens`` counts generated tokens including the end-of-turn token. A prompt that does not
fit the model's context window is refused (``finish_reason="context_overflow"``).

Deviations from the earlier ``model.generate`` backend and from HF ``generate``:
- The sampler draws by inverse CDF, not ``torch.multinomial``: the same distribution, but a given
  seed yields other tokens than before. Generators live on the CPU (logits are sampled there).
- The completion budget is clipped per request (window − its own prompt), not per batch.
- With the cache on, a reused prefix was encoded in another forward pass than a fresh one would be:
  outputs agree with the cache off up to float rounding — exactly in fp32 (the tests; SmolLM2 too),
  not in bf16, whose rounding makes long greedy replies drift apart.
- The cache assumes fixed weights: a backend over a model being trained must ``clear_prefix_cache()``
  after each update (``FidelityProbe`` builds a new backend per probe). Memory: 2 × layers × kv_heads
  × head_dim values per token (SmolLM2-135M in fp32: 46 KB, 1.5 GB for 32768 tokens).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from envace.core.prompts import ChatFormatter
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.prefix_cache import PrefixHit, PrefixKVCache
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.attention import use_gqa_attention
from envace.runtime.decode import sample_next_tokens
from envace.runtime.kv import BatchedStreams, GrowingLayer, make_cache
from envace.runtime.precision import resolve_precision

logger = logging.getLogger(__name__)

MIN_PREFIX_TOKENS = 16  # shorter cached prefixes are not reused (a cache copy costs more than it saves)


def seed_prefixes(streams: BatchedStreams, hits: Sequence[PrefixHit | None]) -> None:
    """Write row r's reused prefix ``hits[r]`` into the empty cache of ``streams`` (one hit per row, in order).

    Each layer's cache becomes ``[rows, kv_heads, width, head_dim]`` with width = the longest prefix;
    row r holds its prefix in columns ``[0, length_r)`` and a masked hole after it; its next position
    id is ``length_r`` (0 for a row without a hit, whose hole spans the whole width).
    """
    found = [h for h in hits if h is not None]
    width = max(h.length for h in found)
    for layer, (k0, v0) in enumerate(found[0].kv):
        keys = k0.new_zeros(len(hits), k0.shape[0], width, k0.shape[-1])
        values = v0.new_zeros(len(hits), v0.shape[0], width, v0.shape[-1])
        for r, hit in enumerate(hits):
            if hit is not None:
                keys[r, :, : hit.length], values[r, :, : hit.length] = hit.kv[layer]
        streams.cache.update(keys, values, layer)
    lengths = torch.tensor([0 if h is None else h.length for h in hits], device=streams.device)
    streams.mask = torch.arange(width, device=streams.device).unsqueeze(0) < lengths.unsqueeze(1)
    streams.next_pos = lengths


@dataclass(frozen=True)
class _Prepared:
    index: int
    request: ChatRequest
    prompt_ids: list[int]


@dataclass
class _Row:
    """One request being decoded: its budget, generator, the cached prefix it reused, its tokens so far."""

    item: _Prepared
    limit: int
    generator: torch.Generator | None
    reused: int = 0
    tokens: list[int] = field(default_factory=list)


class LocalHFBackend:
    """Batched chat generation with a local HF model (``ChatBackend``).

    Args:
        model: a causal LM (moved nowhere: inputs go to its parameters' device).
        tokenizer: its tokenizer (chat template must render tools; see ``envace.models``).
        name: backend name reported to callers.
        batch_size: requests decoded together.
        formatter: a ``ChatFormatter`` to use instead of one built from ``tokenizer``.
        precision: ``auto | fp32 | bf16`` (``eval.precision``; ``resolve_precision``).
        prefix_cache_tokens: token budget of the prefix KV cache (``eval.prefix_cache_tokens``); 0 = off.
            Ignored (off) for models whose cache layers are not plain full attention.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        *,
        name: str = "local",
        batch_size: int = 8,
        formatter: ChatFormatter | None = None,
        precision: str = "fp32",
        prefix_cache_tokens: int = 32768,
    ) -> None:
        if isinstance(model, str) or isinstance(tokenizer, str):
            raise TypeError(
                "LocalHFBackend(model, tokenizer) takes loaded objects; for a name or directory use "
                "LocalHFBackend.from_spec(envace.models.model_spec_from_string(text))"
            )
        if batch_size < 1:
            raise ValueError(f"LocalHFBackend: batch_size must be >= 1, got {batch_size}")
        if prefix_cache_tokens < 0:
            raise ValueError(
                f"LocalHFBackend: prefix_cache_tokens must be >= 0 (0 = off), got {prefix_cache_tokens} "
                "(eval.prefix_cache_tokens)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        self.formatter = formatter or ChatFormatter(tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else self.formatter.end_of_turn_token_ids[0]
        self.end_of_turn = frozenset(self.formatter.end_of_turn_token_ids)
        self.device = next(model.parameters()).device
        self.precision = resolve_precision(precision, self.device, model)  # "bf16" | "fp32"
        # the model's context window: longer prompts are refused (finish_reason "context_overflow"),
        # never fed past the positions it was trained on; completions are clipped to fit
        self.context_window = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0)
        self.context_overflows = 0  # refused requests so far (callers report it)
        full_attention = all(isinstance(layer, GrowingLayer) for layer in make_cache(model).layers)
        if prefix_cache_tokens and not full_attention:
            logger.warning("%s: the model's KV cache is not plain full attention; prefix cache off", name)
        self.prefix_cache_tokens = prefix_cache_tokens if full_attention else 0
        self.clear_prefix_cache()
        self.prefix_cache_hits = 0  # requests that reused a cached prefix
        self.cached_tokens_reused = 0  # prompt tokens not encoded thanks to the cache
        self.prompt_tokens_encoded = 0  # prompt tokens fed to the model

    @classmethod
    def from_spec(cls, spec: ModelSpec, **kwargs: object) -> LocalHFBackend:
        """Load ``spec`` (``envace.models``), switch it to GQA-aware SDPA attention and wrap it.

        kwargs go to the constructor.
        """
        model, tokenizer = load_model_and_tokenizer(spec)
        use_gqa_attention(model)  # our own copy of the model: masked batches skip HF's repeat_kv
        kwargs.setdefault("name", f"local:{spec.kind}")
        return cls(model, tokenizer, **kwargs)  # type: ignore[arg-type]

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (call after changing the model's weights)."""
        budget = self.prefix_cache_tokens
        self.prefix_cache = PrefixKVCache(budget, MIN_PREFIX_TOKENS) if budget else None

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        """Answer every request (outputs in request order)."""
        prepared = [
            _Prepared(i, r, self.formatter.encode(self.formatter.render(r.messages, r.tools, True)))
            for i, r in enumerate(requests)
        ]
        outputs: list[ChatOutput | None] = [None] * len(prepared)
        if self.context_window:
            for p in [p for p in prepared if len(p.prompt_ids) >= self.context_window]:
                self.context_overflows += 1
                logger.warning(
                    "%s: prompt of %d tokens does not fit the model's %d-token window; answered "
                    "with an empty reply (finish_reason=context_overflow)",
                    self.name,
                    len(p.prompt_ids),
                    self.context_window,
                )
                outputs[p.index] = ChatOutput("", len(p.prompt_ids), 0, "context_overflow")
            prepared = [p for p in prepared if outputs[p.index] is None]
        prepared.sort(key=lambda p: (-len(p.prompt_ids), p.index))
        n_batches = (len(prepared) + self.batch_size - 1) // self.batch_size
        for b in range(n_batches):
            batch = prepared[b * self.batch_size : (b + 1) * self.batch_size]
            started, reused, encoded = time.perf_counter(), self.cached_tokens_reused, self.prompt_tokens_encoded
            results = self._generate_batch(batch)
            for item, output in zip(batch, results, strict=True):
                outputs[item.index] = output
            logger.info(
                "%s: batch %d/%d (%d requests, %d prompt tokens encoded, %d cached ones reused, %d generated "
                "tokens) in %.1f s",
                self.name,
                b + 1,
                n_batches,
                len(batch),
                self.prompt_tokens_encoded - encoded,
                self.cached_tokens_reused - reused,
                sum(o.completion_tokens for o in results),
                time.perf_counter() - started,
            )
        return [o for o in outputs if o is not None]

    def _generate_batch(self, batch: Sequence[_Prepared]) -> list[ChatOutput]:
        """Decode ``batch`` together (rows with no room to generate are answered empty)."""
        rows = [self._start_row(item) for item in batch]
        live = {i: row for i, row in enumerate(rows) if row.limit > 0}
        if live:
            self._decode(live)
        return [self._finish(row.item, row.tokens) for row in rows]

    def _start_row(self, item: _Prepared) -> _Row:
        request = item.request
        limit = int(request.max_new_tokens)
        if self.context_window:
            limit = min(limit, self.context_window - len(item.prompt_ids))
        generator = torch.Generator().manual_seed(int(request.seed)) if request.temperature > 0 else None
        return _Row(item, max(limit, 0), generator)

    def _decode(self, rows: dict[int, _Row]) -> None:
        """Encode the prompts (``_prefill``), then one token per live row per forward pass until each row is
        done (appends to ``row.tokens``)."""
        streams = BatchedStreams(self.model, list(rows), pad_id=self.pad_token_id, precision=self.precision)
        logits = self._prefill(streams, rows)
        live = list(rows)
        with torch.no_grad():
            while live:
                tokens = sample_next_tokens(
                    torch.stack([logits[i] for i in live]),
                    [float(rows[i].item.request.temperature) for i in live],
                    [rows[i].generator for i in live],
                )
                feed: dict[int, list[int]] = {}
                for i, token in zip(live, tokens.tolist(), strict=True):
                    rows[i].tokens.append(token)
                    if self._row_done(rows[i], token):
                        self._remember(streams, i, rows[i])
                    else:
                        feed[i] = [token]
                if not feed:
                    return
                if len(feed) < len(live):
                    streams.retain(list(feed))
                logits = streams.append(feed)
                live = list(feed)

    def _prefill(self, streams: BatchedStreams, rows: dict[int, _Row]) -> dict[int, torch.Tensor]:
        """Encode each row's prompt on its own, then lay the rows' KV side by side in the empty ``streams``.

        Returns each row's float32 logits after its last prompt token. Why one row at a time and not one
        padded batch: a padded forward computes every row at the width of the longest remaining prompt,
        and after prefix reuse the rows' remaining lengths differ by 10-100×, while on a CPU a batch-1
        prefill runs at the same tokens/s as a batched one. Each row reuses the longest cached prefix,
        including the prompts of the rows encoded before it in this batch (stored at once): parallel
        rehearsal attempts send the same prompt, and tasks of one domain share the system prompt and
        tool schemas. The decode that follows is batched as before (``seed_prefixes`` layout).
        """
        logits: dict[int, torch.Tensor] = {}
        prompts: dict[int, PrefixHit] = {}
        lean = streams.lean if streams.lean is not None else False
        with torch.no_grad():
            for i, row in rows.items():
                ids = row.item.prompt_ids
                single = BatchedStreams(self.model, [i], pad_id=self.pad_token_id, precision=self.precision, lean=lean)
                hit = self.prefix_cache.lookup(ids) if self.prefix_cache else None
                if hit is not None:
                    seed_prefixes(single, [hit])
                    row.reused = hit.length
                    self.prefix_cache_hits += 1
                    self.cached_tokens_reused += hit.length
                self.prompt_tokens_encoded += len(ids) - row.reused
                logits[i] = single.append({i: ids[row.reused :]})[i]
                kv = tuple((layer.keys[0].clone(), layer.values[0].clone()) for layer in single.cache.layers)
                prompts[i] = PrefixHit(len(ids), kv)
                if self.prefix_cache is not None and self.prefix_cache.fits(len(ids)):
                    self.prefix_cache.store(ids, kv)
        seed_prefixes(streams, [prompts[key] for key in streams.keys])
        return logits

    def _row_done(self, row: _Row, token: int) -> bool:
        """End of turn, budget spent, or a stop string in the text so far."""
        if token in self.end_of_turn or len(row.tokens) >= row.limit:
            return True
        stops = row.item.request.stop
        return bool(stops) and _cut_at_stop(self.formatter.decode(row.tokens), stops) is not None

    def _remember(self, streams: BatchedStreams, key: int, row: _Row) -> None:
        """Store a finished row's KV (every fed token: the prompt and all generated tokens but the last)."""
        ids = row.item.prompt_ids + row.tokens[:-1]
        if self.prefix_cache is None or not self.prefix_cache.fits(len(ids)):
            return
        r = streams.row_of(key)
        real = streams.mask[r]
        self.prefix_cache.store(
            ids, [(layer.keys[r][:, real], layer.values[r][:, real]) for layer in streams.cache.layers]
        )

    def _finish(self, item: _Prepared, generated: list[int]) -> ChatOutput:
        """Cut one row at its end-of-turn token or stop string and count its tokens."""
        end = next((i for i, token in enumerate(generated) if token in self.end_of_turn), None)
        if end is not None:
            text = self.formatter.decode(generated[:end])
            cut = _cut_at_stop(text, item.request.stop)
            if cut is None:
                return ChatOutput(text, len(item.prompt_ids), end + 1, "stop")
        text = self.formatter.decode(generated)
        cut = _cut_at_stop(text, item.request.stop)
        if cut is not None:
            used = next(
                (
                    k
                    for k in range(1, len(generated) + 1)
                    if _cut_at_stop(self.formatter.decode(generated[:k]), item.request.stop) is not None
                ),
                len(generated),
            )
            return ChatOutput(cut, len(item.prompt_ids), used, "stop")
        return ChatOutput(text, len(item.prompt_ids), len(generated), "length")


def _cut_at_stop(text: str, stops: Sequence[str]) -> str | None:
    """``text`` up to its earliest stop string, or None when no stop string occurs."""
    positions = [text.find(s) for s in stops if s and s in text]
    return text[: min(positions)] if positions else None
