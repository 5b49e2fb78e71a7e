"""Token sampling and the batched decode loop over ``BatchedStreams``.

- Seeds: every trajectory owns a ``torch.Generator`` seeded with ``derive_seed(seed, step, example,
  sample)`` (``envace.core.seeds``), so what a trajectory samples does not depend on the other rows of the batch
  or on the global RNG.
- Temperature: tokens are drawn from softmax(logits / T); ``T == 0`` means greedy. The recorded
  sampling log-prob is log softmax(logits / T) at the drawn token (T == 0 records it at T = 1); the
  trainer scores tokens with the same per-role temperature (``effective_temperature``).
- Guides (optional) steer decoding toward target token sequences: ``strength=None`` forces them
  exactly (teacher forcing, used by the rollout benchmark so that two implementations do identical
  work), a finite strength adds a logit bonus (used by tests to make a random tiny model emit
  well-formed outputs with some variation). The recorded log-prob is always the *policy's* own
  (unguided) log-prob of the chosen token, which is what PPO ratios are computed against.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from envace.core.records import Role
from envace.core.seeds import derive_seed as derive_seed  # re-exported; defined in core.seeds
from envace.engines.local.kv import BatchedStreams


def effective_temperature(temperature: float) -> float:
    """Temperature used for log-probs: T itself, or 1.0 for greedy decoding (T == 0)."""
    return temperature if temperature > 0 else 1.0


@dataclass(frozen=True)
class OutputKey:
    """Names one output of one rollout: which example, which sample, which role, which of its outputs."""

    example: Hashable
    sample: int
    role: Role
    index: int


@dataclass(frozen=True)
class DecodeGuide:
    """Steers outputs toward ``targets(key)`` (None = sample freely).

    ``strength``: None forces the target tokens; a float adds that logit bonus; a mapping gives one
    of those per role.
    """

    targets: Callable[[OutputKey], Sequence[int] | None]
    strength: float | None | Mapping[Role, float | None] = None

    def strength_for(self, role: Role) -> float | None:
        return self.strength.get(role) if isinstance(self.strength, Mapping) else self.strength


@dataclass
class DecodeRequest:
    """One row to generate for: its cache key, its full stream so far, limits and identity."""

    row: Hashable
    stream: list[int]  # every token of the stream so far (the tail not yet fed is fed first)
    max_new_tokens: int
    temperature: float
    generator: torch.Generator
    output_key: OutputKey
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False  # saw an end-of-turn token (kept as the output's last token)


def pick_token(
    logits: torch.Tensor, request: DecodeRequest, guide: DecodeGuide | None
) -> tuple[int, float]:
    """Choose the next token of one row and return it with the policy's log-prob of it."""
    temp = request.temperature
    logp = torch.log_softmax(logits / effective_temperature(temp), dim=-1)
    target = guide.targets(request.output_key) if guide is not None else None
    position = len(request.tokens)
    if target is not None and position >= len(target):
        target = None
    strength = guide.strength_for(request.output_key.role) if guide is not None and target is not None else None
    if target is not None and strength is None:
        token = int(target[position])
    else:
        scores = logits / temp if temp > 0 else logits.clone()
        if target is not None and strength is not None:
            scores = scores.clone()
            scores[int(target[position])] += float(strength)
        if temp > 0:
            probs = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=request.generator))
        else:
            token = int(torch.argmax(scores))
    return token, float(logp[token])


def decode(
    streams: BatchedStreams,
    requests: Sequence[DecodeRequest],
    stop_ids: frozenset[int],
    guide: DecodeGuide | None = None,
) -> int:
    """Generate for all requests together until each hits a stop id or its budget.

    Feeds every request's unfed stream tail first (a prompt continuation), then decodes one token per
    step for the rows still running. Generated tokens are appended to ``request.tokens`` (not to the
    stream; the caller records them). A row's last sampled token is not fed: the next ``append`` of
    that stream feeds it. Returns the number of forward passes run.
    """
    live = {r.row: r for r in requests if r.max_new_tokens > 0}
    feed = {row: r.stream[streams.fed_count(row) :] for row, r in live.items()}
    empty = [row for row, piece in feed.items() if not piece]
    if empty:
        raise ValueError(f"decode: rows {empty} have no unfed prompt tokens; a stream must end with a generation prompt")
    forwards = 0
    while live:
        logits = streams.append(feed)
        forwards += 1
        feed = {}
        for row, r in list(live.items()):
            token, lp = pick_token(logits[row], r, guide)
            r.tokens.append(token)
            r.logprobs.append(lp)
            if token in stop_ids:
                r.finished = True
            if r.finished or len(r.tokens) >= r.max_new_tokens:
                del live[row]
            else:
                feed[row] = [token]
    return forwards
