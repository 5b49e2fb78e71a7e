"""``LocalHFBackend``: a ``ChatBackend`` over an in-process Hugging Face causal LM.

Requests are rendered with a ``ChatFormatter`` (the tokenizer's tool-capable chat template), sorted
by prompt length, left-padded into batches and decoded with ``model.generate``. Sampling is done
per row by a logits processor: each request has its own temperature (0 = greedy) and its own
``torch.Generator`` seeded with ``request.seed``, so a request's output depends on its seed and
not on which other requests share its batch (up to floating-point effects of padding). The chosen
token is forced through greedy decoding, so ``generate`` itself draws no random numbers.

Generation stops at an end-of-turn token (``ChatFormatter.end_of_turn_token_ids``), at the
request's ``max_new_tokens``, or at one of its ``stop`` strings (the text is cut before it).
``completion_tokens`` counts generated tokens including the end-of-turn token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from envace.core.prompts import ChatFormatter
from envace.inference.base import ChatOutput, ChatRequest
from envace.models import ModelSpec, load_model_and_tokenizer

logger = logging.getLogger(__name__)


class PerRowSampler(LogitsProcessor):
    """Samples each row with its own temperature and generator; returns logits that force the sample.

    Rows with temperature <= 0 are left untouched (greedy decoding takes their argmax).
    """

    def __init__(self, temperatures: Sequence[float], generators: Sequence[torch.Generator]) -> None:
        self.temperatures = list(temperatures)
        self.generators = list(generators)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        forced = scores.clone()
        for row, (temperature, generator) in enumerate(zip(self.temperatures, self.generators, strict=True)):
            if temperature <= 0:
                continue
            probs = torch.softmax(scores[row].float() / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
            forced[row] = float("-inf")
            forced[row, token] = 0.0
        return forced


class PerRowLimits(StoppingCriteria):
    """Marks a row done once it generated its own ``max_new_tokens`` or produced one of its stop strings."""

    def __init__(self, prompt_length: int, max_new: Sequence[int], stops: Sequence[tuple[str, ...]],
                 formatter: ChatFormatter) -> None:
        self.prompt_length = prompt_length
        self.max_new = list(max_new)
        self.stops = list(stops)
        self.formatter = formatter

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        done = [generated >= limit for limit in self.max_new]
        for row, stops in enumerate(self.stops):
            if stops and not done[row]:
                text = self.formatter.decode(input_ids[row, self.prompt_length:].tolist())
                done[row] = any(stop in text for stop in stops)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


@dataclass(frozen=True)
class _Prepared:
    index: int
    request: ChatRequest
    prompt_ids: list[int]


class LocalHFBackend:
    """Batched chat generation with a local HF model (``ChatBackend``).

    Args:
        model: a causal LM (moved nowhere: inputs go to ``model.device``).
        tokenizer: its tokenizer (chat template must render tools; see ``envace.models``).
        name: backend name reported to callers.
        batch_size: requests per ``generate`` call.
        formatter: a ``ChatFormatter`` to use instead of one built from ``tokenizer``.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: object, *, name: str = "local", batch_size: int = 8,
                 formatter: ChatFormatter | None = None) -> None:
        if isinstance(model, str) or isinstance(tokenizer, str):
            raise TypeError(
                "LocalHFBackend(model, tokenizer) takes loaded objects; for a name or directory use "
                "LocalHFBackend.from_spec(envace.models.model_spec_from_string(text))"
            )
        if batch_size < 1:
            raise ValueError(f"LocalHFBackend: batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        self.formatter = formatter or ChatFormatter(tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else self.formatter.end_of_turn_token_ids[0]
        # the model's context window: longer prompts are refused (finish_reason "context_overflow"),
        # never fed past the positions it was trained on; completions are clipped to fit
        self.context_window = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0)
        self.context_overflows = 0  # refused requests so far (callers report it)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **kwargs: object) -> LocalHFBackend:
        """Load ``spec`` (``envace.models``) and wrap it; kwargs go to the constructor."""
        model, tokenizer = load_model_and_tokenizer(spec)
        kwargs.setdefault("name", f"local:{spec.kind}")
        return cls(model, tokenizer, **kwargs)  # type: ignore[arg-type]

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
                logger.warning("%s: prompt of %d tokens does not fit the model's %d-token window; answered "
                               "with an empty reply (finish_reason=context_overflow)", self.name,
                               len(p.prompt_ids), self.context_window)
                outputs[p.index] = ChatOutput("", len(p.prompt_ids), 0, "context_overflow")
            prepared = [p for p in prepared if outputs[p.index] is None]
        prepared.sort(key=lambda p: (-len(p.prompt_ids), p.index))
        n_batches = (len(prepared) + self.batch_size - 1) // self.batch_size
        for b in range(n_batches):
            batch = prepared[b * self.batch_size:(b + 1) * self.batch_size]
            started = time.perf_counter()
            results = self._generate_batch(batch)
            for item, output in zip(batch, results, strict=True):
                outputs[item.index] = output
            logger.info("%s: batch %d/%d (%d requests, %d generated tokens) in %.1f s", self.name, b + 1,
                        n_batches, len(batch), sum(o.completion_tokens for o in results),
                        time.perf_counter() - started)
        return [o for o in outputs if o is not None]

    def _generate_batch(self, batch: Sequence[_Prepared]) -> list[ChatOutput]:
        """One left-padded ``model.generate`` call for ``batch``."""
        device = getattr(self.model, "device", torch.device("cpu"))
        width = max(len(p.prompt_ids) for p in batch)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, item in enumerate(batch):
            input_ids[row, width - len(item.prompt_ids):] = torch.tensor(item.prompt_ids, dtype=torch.long)
            attention[row, width - len(item.prompt_ids):] = 1
        generators = [torch.Generator(device=device).manual_seed(int(p.request.seed)) for p in batch]
        room = self.context_window - width if self.context_window else None
        max_new = [int(p.request.max_new_tokens) if room is None else min(int(p.request.max_new_tokens), room)
                   for p in batch]
        config = GenerationConfig(
            do_sample=False, max_new_tokens=max(max_new), eos_token_id=list(self.formatter.end_of_turn_token_ids),
            pad_token_id=self.pad_token_id,
        )
        sampler = PerRowSampler([float(p.request.temperature) for p in batch], generators)
        limits = PerRowLimits(width, max_new, [tuple(p.request.stop) for p in batch], self.formatter)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                logits_processor=LogitsProcessorList([sampler]), stopping_criteria=StoppingCriteriaList([limits]),
            )
        return [
            self._finish(item, out[row, width:].tolist()[:limit])
            for row, (item, limit) in enumerate(zip(batch, max_new, strict=True))
        ]

    def _finish(self, item: _Prepared, generated: list[int]) -> ChatOutput:
        """Cut one row at its end-of-turn token or stop string and count its tokens."""
        eot = set(self.formatter.end_of_turn_token_ids)
        end = next((i for i, token in enumerate(generated) if token in eot), None)
        if end is not None:
            text = self.formatter.decode(generated[:end])
            cut = _cut_at_stop(text, item.request.stop)
            if cut is None:
                return ChatOutput(text, len(item.prompt_ids), end + 1, "stop")
        text = self.formatter.decode(generated)
        cut = _cut_at_stop(text, item.request.stop)
        if cut is not None:
            used = next((k for k in range(1, len(generated) + 1)
                         if _cut_at_stop(self.formatter.decode(generated[:k]), item.request.stop) is not None),
                        len(generated))
            return ChatOutput(cut, len(item.prompt_ids), used, "stop")
        return ChatOutput(text, len(item.prompt_ids), len(generated), "length")


def _cut_at_stop(text: str, stops: Sequence[str]) -> str | None:
    """``text`` up to its earliest stop string, or None when no stop string occurs."""
    positions = [text.find(s) for s in stops if s and s in text]
    return text[:min(positions)] if positions else None
