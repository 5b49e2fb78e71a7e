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
from envace.runtime.kv import BatchedStreams


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
    # replay: a forced output (strength None) is fed in one forward instead of token by token, and
    # its recorded log-probs are NaN (nothing scores them: the SFT warm-up's gold replay)
    replay: bool = False

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


def sample_next_tokens(
    logits: torch.Tensor, temperatures: Sequence[float], generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """Next token per row: argmax where temperature <= 0, else an inverse-CDF draw from softmax(logits / T).

    One softmax and one cumulative sum for all sampled rows together; each sampled row draws a single
    uniform u from its own generator and takes the first token whose cumulative probability exceeds
    u (exact categorical sampling; what a row draws does not depend on the other rows).

    Args:
        logits: ``[rows, vocab]`` on the CPU, any float dtype (the softmax runs in float32).
        temperatures: ``[rows]``.
        generators: row r's generator draws its one uniform; ignored (may be None) for greedy rows.
    Returns:
        ``[rows]`` long token ids.
    """
    tokens = logits.argmax(dim=-1)
    sampled = [r for r, t in enumerate(temperatures) if t > 0]
    if not sampled:
        return tokens
    index = torch.tensor(sampled)
    temps = torch.tensor([float(temperatures[r]) for r in sampled], dtype=torch.float32)
    cdf = torch.softmax(logits[index].float() / temps[:, None], dim=-1).cumsum(dim=-1)
    uniform = torch.cat([torch.rand(1, generator=generators[r]) for r in sampled])
    drawn = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    tokens[index] = drawn.clamp_(max=logits.shape[-1] - 1)
    return tokens


def pick_tokens(
    logits: torch.Tensor, requests: Sequence[DecodeRequest], guide: DecodeGuide | None
) -> tuple[list[int], list[float]]:
    """Next token of every row of ``logits`` (``[R, V]`` float32) with the policy's log-prob of it.

    Batched over rows (``sample_next_tokens``); a guide's logit bonus is added on the tempered scale
    (softmax(logits / T + bonus)); forced rows take their target. The log-prob is always the
    unguided one, at the row's effective temperature.
    """
    temps = torch.tensor([effective_temperature(r.temperature) for r in requests], dtype=logits.dtype)
    logp = torch.log_softmax(logits / temps.unsqueeze(-1), dim=-1)
    scores = logits.clone()
    forced: dict[int, int] = {}
    for i, r in enumerate(requests):
        target = guide.targets(r.output_key) if guide is not None else None
        position = len(r.tokens)
        if target is None or position >= len(target):
            continue
        strength = guide.strength_for(r.output_key.role)  # type: ignore[union-attr]
        if strength is None:
            forced[i] = int(target[position])
        else:
            scores[i, int(target[position])] += float(strength) * float(temps[i])
    live = [0.0 if i in forced else r.temperature for i, r in enumerate(requests)]
    tokens = sample_next_tokens(scores, live, [r.generator for r in requests])
    for i, token in forced.items():
        tokens[i] = token
    return tokens.tolist(), logp[torch.arange(len(requests)), tokens].tolist()


def pick_token(logits: torch.Tensor, request: DecodeRequest, guide: DecodeGuide | None) -> tuple[int, float]:
    """``pick_tokens`` for one row (``logits``: ``(V,)``)."""
    tokens, logprobs = pick_tokens(logits.unsqueeze(0), [request], guide)
    return tokens[0], logprobs[0]


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
        raise ValueError(
            f"decode: rows {empty} have no unfed prompt tokens; a stream must end with a generation prompt"
        )
    for row, r in list(live.items()) if guide is not None and guide.replay else ():
        tokens = _replayed(r, guide, stop_ids)
        if tokens is not None:
            r.tokens, r.logprobs, r.finished = tokens, [float("nan")] * len(tokens), tokens[-1] in stop_ids
            feed[row] = feed[row] + tokens[:-1]  # the last token is fed by the stream's next append
            del live[row]
    forwards = 0
    if not live and any(feed.values()):  # every row replayed: one forward feeds them all
        streams.append(feed)
        return 1
    index = {key: r for r, key in enumerate(streams.keys)}
    while live:
        logits = streams.append_logits(feed)
        forwards += 1
        feed = {}
        rows = list(live.items())
        at = [index[row] for row, _ in rows]
        if at != list(range(len(index))):
            logits = logits[torch.tensor(at)]
        tokens, logprobs = pick_tokens(logits, [r for _, r in rows], guide)
        for (row, r), token, lp in zip(rows, tokens, logprobs):
            r.tokens.append(token)
            r.logprobs.append(lp)
            if token in stop_ids:
                r.finished = True
            if r.finished or len(r.tokens) >= r.max_new_tokens:
                del live[row]
            else:
                feed[row] = [token]
    return forwards


def _replayed(request: DecodeRequest, guide: DecodeGuide, stop_ids: frozenset[int]) -> list[int] | None:
    """The forced tokens of a replayed output (up to its first stop id and its budget), or None when
    the output is not forced (no target, or a finite strength)."""
    target = guide.targets(request.output_key)
    if target is None or not len(target) or guide.strength_for(request.output_key.role) is not None:
        return None
    tokens = []
    for token in list(target)[: request.max_new_tokens]:
        tokens.append(int(token))
        if token in stop_ids:
            break
    return tokens
