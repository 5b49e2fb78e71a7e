"""Generation programs: episodes written as generators, so many of them can share batched backend calls.

An episode (plain evaluation, a private rehearsal attempt, a committed execution) is a *program*: a
generator that yields a list of ``GenerationCall`` (which backend seat, why, what request) and receives
the matching list of ``GenerationReply``. The program itself never touches a backend. That gives:

* batching — ``gather`` steps several programs in lock-step and merges their pending calls into one
  ``generate`` call per seat (parallel rehearsal attempts, or several tasks at once);
* seats — programs name the role of a backend (``ACTOR``, ``REHEARSER``), and the driver maps seats to
  real backends, so the rehearser can be a different model than the actor (docs/method.md §12: the SFT-start control);
* crash isolation — ``drive`` retries a failing batch one request at a time and hands the exception to
  the program that owns the failing request; ``gather(isolate=True)`` turns a crashed program into a
  ``Failed`` value instead of aborting its siblings;
* costs — every reply carries the seconds attributed to it (batch time split evenly over its requests);
  a ``GenerationLedger`` owned by a program adds up calls, tokens and seconds per purpose.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from envace.inference.base import ChatBackend, ChatOutput, ChatRequest

logger = logging.getLogger(__name__)

ACTOR = "actor"
REHEARSER = "rehearser"

T = TypeVar("T")


@dataclass(frozen=True)
class GenerationCall:
    seat: str  # which backend answers: ACTOR | REHEARSER
    purpose: str  # cost label: "act", "rehearsal_act", "rehearse", "critique", "summary", "fidelity"
    request: ChatRequest


@dataclass(frozen=True)
class GenerationReply:
    output: ChatOutput | None
    error: BaseException | None = None
    seconds: float = 0.0


Program = Generator[list[GenerationCall], list[GenerationReply], T]


class GenerationFailed(RuntimeError):
    """The backend raised while answering one of this program's requests."""


@dataclass(frozen=True)
class Failed:
    """The outcome of a program that raised (kept instead of aborting the batch)."""

    error: str
    traceback: str


@dataclass(frozen=True)
class PurposeCost:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    failures: int = 0

    def plus(self, other: PurposeCost) -> PurposeCost:
        return PurposeCost(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.seconds + other.seconds,
            self.failures + other.failures,
        )


class GenerationLedger:
    """Mutable per-program accumulator of generation costs, keyed by purpose.

    ``real_executions`` counts the real executions an episode program opened on this ledger: an adapter's
    episode calls ``count_real_execution`` where it builds the episode's real executor (or, for a
    benchmark without one, where it starts the real answer). Rehearse-then-commit reports it as
    ``committed_executions``; private rehearsal never opens one.
    """

    def __init__(self) -> None:
        self._costs: dict[str, PurposeCost] = {}
        self.real_executions = 0

    def count_real_execution(self) -> None:
        self.real_executions += 1

    def add(self, call: GenerationCall, reply: GenerationReply) -> None:
        out = reply.output
        cost = PurposeCost(
            calls=1,
            prompt_tokens=out.prompt_tokens if out else 0,
            completion_tokens=out.completion_tokens if out else 0,
            seconds=reply.seconds,
            failures=0 if reply.error is None else 1,
        )
        self._costs[call.purpose] = self._costs.get(call.purpose, PurposeCost()).plus(cost)

    def snapshot(self) -> dict[str, PurposeCost]:
        return dict(self._costs)

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {k: vars_of(v) for k, v in sorted(self._costs.items())}


def vars_of(cost: PurposeCost) -> dict[str, Any]:
    return {
        "calls": cost.calls,
        "prompt_tokens": cost.prompt_tokens,
        "completion_tokens": cost.completion_tokens,
        "seconds": round(cost.seconds, 6),
        "failures": cost.failures,
    }


def generate_one(call: GenerationCall, ledger: GenerationLedger | None = None) -> Program[ChatOutput]:
    """Leaf program: one request, one reply; raises ``GenerationFailed`` when the backend failed."""
    replies = yield [call]
    reply = replies[0]
    if ledger is not None:
        ledger.add(call, reply)
    if reply.error is not None or reply.output is None:
        raise GenerationFailed(
            f"{call.seat} backend failed on a {call.purpose} request: {reply.error!r}"
        ) from reply.error
    return reply.output


def _advance(program: Program[Any], value: list[GenerationReply] | None) -> tuple[str, Any]:
    """Send ``value`` (None primes): ('pending', calls) | ('done', result) | ('failed', exception)."""
    try:
        calls = next(program) if value is None else program.send(value)
        while not calls:  # a program may yield an empty list; answer it at once
            calls = program.send([])
        return "pending", calls
    except StopIteration as stop:
        return "done", stop.value
    except Exception as exc:  # noqa: BLE001 - isolated per program by the caller
        return "failed", exc


def gather(
    programs: Iterable[Program[Any]],
    *,
    isolate: bool = False,
    limit: int | None = None,
    on_done: Callable[[int, Any], None] | None = None,
) -> Program[list[Any]]:
    """Run programs in lock-step, merging their pending calls; results in input order.

    ``isolate``: a program that raises yields ``Failed`` instead of propagating. ``limit``: at most
    this many programs in flight (the rest start as earlier ones finish). ``on_done(i, result)`` is
    called as each finishes (progress bars).
    """
    source = iter(enumerate(programs))
    results: dict[int, Any] = {}
    live: dict[int, tuple[Program[Any], list[GenerationCall]]] = {}

    def settle(i: int, program: Program[Any], state: str, payload: Any) -> None:
        if state == "pending":
            live[i] = (program, payload)
            return
        if state == "failed":
            if not isolate:
                raise payload
            payload = Failed(f"{type(payload).__name__}: {payload}", "".join(traceback.format_exception(payload)))
        results[i] = payload
        if on_done is not None:
            on_done(i, payload)

    def refill() -> None:
        while limit is None or len(live) < limit:
            nxt = next(source, None)
            if nxt is None:
                return
            i, program = nxt
            settle(i, program, *_advance(program, None))

    refill()
    while live:
        order = sorted(live)
        batch = [call for i in order for call in live[i][1]]
        replies = yield batch
        pos = 0
        for i in order:
            program, calls = live.pop(i)
            mine = replies[pos : pos + len(calls)]
            pos += len(calls)
            settle(i, program, *_advance(program, mine))
        refill()
    return [results[i] for i in range(len(results))]


def _answer_chunk(backend: ChatBackend, requests: Sequence[ChatRequest]) -> list[GenerationReply]:
    start = time.perf_counter()
    try:
        outputs = backend.generate(list(requests))
        if len(outputs) != len(requests):
            raise RuntimeError(
                f"backend {getattr(backend, 'name', backend)!r} returned {len(outputs)} outputs for "
                f"{len(requests)} requests; ChatBackend.generate must answer every request in order"
            )
    except Exception as exc:  # noqa: BLE001 - attributed to the request(s) that caused it
        if len(requests) == 1:
            return [GenerationReply(None, exc, time.perf_counter() - start)]
        logger.warning("batch of %d failed (%s); retrying one by one to isolate the failure", len(requests), exc)
        return [reply for r in requests for reply in _answer_chunk(backend, [r])]
    share = (time.perf_counter() - start) / max(1, len(requests))
    return [GenerationReply(out, None, share) for out in outputs]


def dispatch(
    calls: Sequence[GenerationCall], backends: Mapping[str, ChatBackend], max_batch: int | None = None
) -> list[GenerationReply]:
    """Answer calls with one ``generate`` per seat (chunked by ``max_batch``); order preserved."""
    by_seat: dict[str, list[int]] = defaultdict(list)
    for index, call in enumerate(calls):
        if call.seat not in backends:
            raise KeyError(
                f"no backend for seat {call.seat!r} (purpose {call.purpose!r}); seats given: {sorted(backends)}"
            )
        by_seat[call.seat].append(index)
    replies: list[GenerationReply | None] = [None] * len(calls)
    for seat, indices in by_seat.items():
        step = max_batch or len(indices)
        for lo in range(0, len(indices), step):
            chunk = indices[lo : lo + step]
            answered = _answer_chunk(backends[seat], [calls[i].request for i in chunk])
            for i, reply in zip(chunk, answered):
                replies[i] = reply
    return [r for r in replies if r is not None]


def drive(program: Program[T], backends: Mapping[str, ChatBackend], max_batch: int | None = None) -> T:
    """Run a program to completion against real backends."""
    state, payload = _advance(program, None)
    while state == "pending":
        state, payload = _advance(program, dispatch(payload, backends, max_batch))
    if state == "failed":
        raise payload
    return payload


def no_generation(value: T) -> Program[T]:
    """A program that returns ``value`` without generating (for optional hooks)."""
    return value
    yield []  # pragma: no cover - makes this function a generator
