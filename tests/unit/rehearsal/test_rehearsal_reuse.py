"""Generation reuse across the cells of a rehearsal sweep: exact, nested, and booked at its real cost.

The backends here answer as a pure function of the request (a hash of its canonical text picks the
imagined value and the critique wording), which is what a seeded sampler promises; so a sweep with
reuse must produce exactly what the same sweep produces without it.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from typing import Any

import pytest
from test_rehearsal_controller import PROMPTS, TASKS, ScriptedPolicy, adapter_for, settings_for

from envace.core.critique import Critique, render_critique
from envace.core.wire import render_rehearsal
from envace.evaluation.programs import GenerationCall, GenerationReply
from envace.inference.base import ChatOutput, ChatRequest
from envace.rehearsal import run_rehearsal_sweep
from envace.rehearsal.reuse import GenerationReuse, ReuseAwareLedger, TimedOutput, request_key


def _digest(request: ChatRequest) -> int:
    return zlib.crc32(request_key(request).encode())


class HashPolicy(ScriptedPolicy):
    """The scripted policy, with critiques that depend only on the request (not on a call counter)."""

    def _answer(self, request: ChatRequest) -> str:
        if request.messages[0]["content"] == PROMPTS.critique_system.format():
            h = _digest(request) % 1000
            return render_critique(Critique(f"assessment {h}", h % 2 == 0, f"revision-{h}"))
        return super()._answer(request)


class HashRehearser:
    """``batch_sensitive``: the answer also depends on the batch size, as sampled tokens do on a real
    backend whose rounding depends on what else is in the batch."""

    def __init__(self, name: str, batch_sensitive: bool = False) -> None:
        self.name, self.requests, self.batch_sensitive = name, [], batch_sensitive

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.requests.extend(requests)
        salt = len(requests) if self.batch_sensitive else 0
        return [
            ChatOutput(render_rehearsal({"ok": True, "h": (_digest(r) + salt) % 97}), completion_tokens=2)
            for r in requests
        ]


def _sweep(reuse: bool, batch_sensitive: bool = False) -> tuple[list[Any], HashPolicy, dict[str, HashRehearser]]:
    adapter, _ = adapter_for()
    actor = HashPolicy(TASKS)
    rehearsers = {name: HashRehearser(name, batch_sensitive) for name in ("trained", "base")}
    cells = run_rehearsal_sweep(
        adapter,
        actor,
        rehearsers,
        [0, 1, 2, 4],
        ["parallel", "sequential"],
        TASKS,
        settings_for(1),
        progress=False,
        reuse_generations=reuse,
    )
    return cells, actor, rehearsers


def _outcomes(cell: Any) -> list[list[dict[str, Any]]]:
    """Each task's rehearsal outcomes without their wall times."""
    return [
        [{k: v for k, v in o.items() if k != "wall_s"} for o in r.info.get("rehearsal", {}).get("outcomes", [])]
        for r in cell.records
    ]


def test_reuse_gives_the_same_cells_as_generating_everything():
    with_reuse, actor, rehearsers = _sweep(True)
    without, actor_all, rehearsers_all = _sweep(False)
    assert [c.key for c in with_reuse] == [c.key for c in without]
    for a, b in zip(with_reuse, without):
        assert a.metrics == b.metrics, a.key
        assert _outcomes(a) == _outcomes(b), a.key
        assert [(r.turns, r.final_answers, r.final_state) for r in a.records] == [
            (r.turns, r.final_answers, r.final_state) for r in b.records
        ]
        assert a.costs.rehearsal_completion_tokens == b.costs.rehearsal_completion_tokens  # reused ones count too
    # with reuse no backend is asked the same request twice, and the sweep asks for fewer generations
    for backend in (actor, *rehearsers.values()):
        keys = [request_key(r) for r in backend.requests]
        assert len(keys) == len(set(keys)), backend.name
    asked = len(actor.requests) + sum(len(r.requests) for r in rehearsers.values())
    asked_all = len(actor_all.requests) + sum(len(r.requests) for r in rehearsers_all.values())
    assert asked < asked_all * 0.8, (asked, asked_all)


def _nested(by_key: dict[str, Any], mode: str, rehearser: str) -> bool:
    small, large = by_key[f"n2-{mode}-{rehearser}"], by_key[f"n4-{mode}-{rehearser}"]
    return all(
        task_large[0]["attempts"][:2] == task_small[0]["attempts"]
        for task_small, task_large in zip(_outcomes(small), _outcomes(large))
    )


def test_larger_n_extends_the_smaller_ns_attempts():
    cells, _, _ = _sweep(True, batch_sensitive=True)
    by_key = {c.key: c for c in cells}
    assert all(_nested(by_key, m, r) for m in ("parallel", "sequential") for r in ("trained", "base"))
    # without reuse, a batch-sensitive backend re-samples the shared attempts differently
    unshared = {c.key: c for c in _sweep(False, batch_sensitive=True)[0]}
    assert not _nested(unshared, "parallel", "trained")
    # the first cell that rehearses reuses nothing; the N=2 cells reuse N=1's first attempt
    assert by_key["n1-parallel-trained"].costs.rehearsal_reused_calls == 0
    assert by_key["n2-parallel-trained"].costs.rehearsal_reused_calls > 0
    assert by_key["n4-sequential-base"].costs.rehearsal_reused_calls > 0


class SlowCounter:
    """Sleeps 20 ms per request; records each batch; can be told to fail."""

    name = "slow"

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.fail = False

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        if self.fail:
            raise RuntimeError("backend down")
        self.batches.append([r.seed for r in requests])
        time.sleep(0.02 * len(requests))
        return [ChatOutput(f"out-{r.seed}", prompt_tokens=3, completion_tokens=r.seed) for r in requests]


def _req(seed: int, temperature: float = 0.7) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": "hi"},), temperature=temperature, seed=seed)


def test_reuse_answers_repeats_from_the_store_with_their_original_cost():
    inner, reuse = SlowCounter(), GenerationReuse()
    front = reuse.wrap(inner)
    assert reuse.wrap(inner) is front and reuse.wrap(front) is front and front.name == "slow"
    first = front.generate([_req(1), _req(2), _req(1)])  # a duplicate inside one batch is generated once
    assert inner.batches == [[1, 2]]
    assert [o.text for o in first] == ["out-1", "out-2", "out-1"]
    assert [o.reused for o in first] == [False, False, True]
    assert all(isinstance(o, TimedOutput) and o.seconds >= 0.015 for o in first)
    second = front.generate([_req(2), _req(3), _req(2, temperature=0.0)])  # another temperature: another request
    assert inner.batches == [[1, 2], [3, 2]]
    assert [o.reused for o in second] == [True, False, False]
    assert second[0].seconds == first[1].seconds and second[0].completion_tokens == 2
    assert reuse.generated == 4 and reuse.reused == 2 and "2 of 6 generations reused" in reuse.summary()
    inner.fail = True
    with pytest.raises(RuntimeError, match="backend down"):
        front.generate([_req(9)])
    assert front.generate([_req(3)])[0].reused  # stored outputs still answer; the failure stored nothing
    inner.fail = False
    assert not front.generate([_req(9)])[0].reused


def test_ledger_books_reused_outputs_at_their_generation_seconds():
    ledger = ReuseAwareLedger()
    call = GenerationCall("actor", "critique", _req(1))
    ledger.add(call, GenerationReply(TimedOutput("a", completion_tokens=5, seconds=2.0), None, seconds=0.001))
    ledger.add(call, GenerationReply(TimedOutput("a", completion_tokens=5, seconds=2.0, reused=True), None, 0.0))
    ledger.add(GenerationCall("actor", "act", _req(2)), GenerationReply(ChatOutput("b"), None, seconds=0.5))
    assert ledger.seconds(["critique"]) == 4.0 and ledger.seconds(["act", "summary"]) == 0.5
    assert ledger.reused_calls(["critique", "act"]) == 1
    assert ledger.snapshot()["critique"].completion_tokens == 10
