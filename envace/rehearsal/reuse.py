"""Identical generations are generated once per rehearsal sweep (common random numbers across cells).

Every generation a sweep asks for is a function of its request: the messages, tools, temperature, token
budget and the request's own seed (derived from the task, the attempt index and the purpose, never from
the cell). So the cells of one sweep ask for many identical generations:

* attempt ``k`` of parallel N=4 is attempt ``k`` of parallel N=2 and of N=1 (same context, same seed),
  and so is its critique (temperature 0, same transcript);
* attempts 1..2 of sequential N=4 are sequential N=2's (attempt 2 reads attempt 1's note either way),
  and sequential attempt 1 is parallel attempt 1 (no earlier attempt to read);
* a committed step whose request carries the same memory (or none) as an earlier cell's.

``GenerationReuse`` keeps, per backend, the output of every request answered in the sweep; a request seen
before is answered from it instead of being generated again. That makes the nesting exact (N=4's first
two attempts *are* N=2's, instead of re-sampling them in a different batch, where batch composition moves
bf16 rounding and hence sampled tokens): the cells differ only in what a larger N adds, which pairs the
comparison between N values, and a sweep costs the generations it needs rather than a full re-run per
cell. Each cell's outcome is still a proper draw of its own setting: reusing changes which random numbers
two cells share, not what either cell computes.

Costs stay honest: a reused output carries the backend seconds it cost when it was generated
(``TimedOutput.seconds``) and is marked ``reused``; ``ReuseAwareLedger`` books those seconds and counts
reused calls per purpose, so a cell's generation cost is what it would have cost alone, and the number of
reused generations is reported next to it. Wall time measured around rehearsal is the marginal time.
Failed generations are never stored.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from envace.evaluation.programs import GenerationCall, GenerationLedger, GenerationReply
from envace.inference.base import ChatBackend, ChatOutput, ChatRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimedOutput(ChatOutput):
    """A backend output with the seconds attributed to it when generated, and whether it was reused."""

    seconds: float = 0.0
    reused: bool = False


def request_key(request: ChatRequest) -> str:
    """A canonical text of everything a generation depends on (JSON, keys sorted)."""
    return json.dumps(
        [
            list(request.messages),
            None if request.tools is None else list(request.tools),
            request.temperature,
            request.max_new_tokens,
            request.seed,
            list(request.stop),
        ],
        sort_keys=True,
        default=repr,
        ensure_ascii=False,
    )


class GenerationReuse:
    """Outputs by (backend, request) for one sweep; ``wrap`` gives each backend a reusing front."""

    def __init__(self) -> None:
        self._outputs: dict[tuple[int, str], TimedOutput] = {}
        self._fronts: dict[int, ReusingBackend] = {}
        self.generated = 0
        self.reused = 0

    def wrap(self, backend: ChatBackend) -> ChatBackend:
        """The reusing front of ``backend`` (one per backend object, so seats sharing a model share outputs)."""
        if isinstance(backend, ReusingBackend):
            return backend
        front = self._fronts.get(id(backend))
        if front is None:
            front = self._fronts[id(backend)] = ReusingBackend(backend, self)
        return front

    def answer(self, backend: ChatBackend, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        keys = [(id(backend), request_key(r)) for r in requests]
        todo: dict[tuple[int, str], ChatRequest] = {}
        for key, request in zip(keys, requests):
            if key not in self._outputs and key not in todo:
                todo[key] = request
        fresh: set[tuple[int, str]] = set()
        if todo:
            start = time.perf_counter()
            outputs = backend.generate(list(todo.values()))
            if len(outputs) != len(todo):
                raise RuntimeError(
                    f"backend {getattr(backend, 'name', backend)!r} returned {len(outputs)} outputs for "
                    f"{len(todo)} requests; ChatBackend.generate must answer every request in order"
                )
            share = (time.perf_counter() - start) / len(todo)
            for key, out in zip(todo, outputs):
                base = {f.name: getattr(out, f.name) for f in fields(ChatOutput)}
                self._outputs[key] = TimedOutput(**base, seconds=share)
            fresh = set(todo)
        answers: list[ChatOutput] = []
        for key in keys:
            stored = self._outputs[key]
            if key in fresh:
                fresh.discard(key)  # a duplicate later in this batch counts as reused
                answers.append(stored)
                self.generated += 1
            else:
                answers.append(replace(stored, reused=True))
                self.reused += 1
        return answers

    def summary(self) -> str:
        total = self.generated + self.reused
        return f"{self.reused} of {total} generations reused ({100.0 * self.reused / max(1, total):.0f}%)"


class ReusingBackend:
    """A ``ChatBackend`` that answers requests seen before in the sweep from ``GenerationReuse``."""

    def __init__(self, inner: ChatBackend, reuse: GenerationReuse) -> None:
        self._inner = inner
        self._reuse = reuse

    @property
    def name(self) -> str:
        return str(getattr(self._inner, "name", type(self._inner).__name__))

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return self._reuse.answer(self._inner, requests)

    def __getattr__(self, attr: str) -> Any:  # anything else (close, model, ...) is the inner backend's
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._inner, attr)


class ReuseAwareLedger(GenerationLedger):
    """A ledger that books a ``TimedOutput`` at its own generation seconds and counts reused calls."""

    def __init__(self) -> None:
        super().__init__()
        self.reused: dict[str, int] = defaultdict(int)

    def add(self, call: GenerationCall, reply: GenerationReply) -> None:
        out = reply.output
        if isinstance(out, TimedOutput):
            reply = replace(reply, seconds=out.seconds)
            if out.reused:
                self.reused[call.purpose] += 1
        super().add(call, reply)

    def reused_calls(self, purposes: Sequence[str]) -> int:
        return sum(self.reused.get(p, 0) for p in purposes)

    def seconds(self, purposes: Sequence[str]) -> float:
        costs = self.snapshot()
        return sum(costs[p].seconds for p in purposes if p in costs)
