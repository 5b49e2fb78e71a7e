"""Test-time rehearsal with the tiny model on the real tool world, at the configured defaults (tracker
issue 12, points 1 and 4).

* ``test_parallel_attempts_differ``: N=3 parallel attempts, built from the default composition as the
  ``rehearsal_sweep`` stage builds them, are not all the same — on the tiny random model and on a tiny
  model initialised from another seed. Their first ACT requests share one prompt and differ in their seeds.
* ``test_turn_scope_no_future_turns``: by default (scope ``turn``) no request that rehearsal sends before
  user turn t holds a user turn after t; under scope ``task`` the rehearsal before turn 0 holds the later
  turns (so the check can fail).

The seats are the real tiny backend behind a recording wrapper (it forwards every request unchanged and
logs it). Requests are told apart by their token budgets: the committed execution's ACT budget differs
from every rehearsal budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch

from envace.config.load import compose, typed_config
from envace.core.env import Task
from envace.core.rehearsal import RehearsalConfig, RehearsalMode, RehearsalScope
from envace.envs.toolworld import ToolWorldEnv
from envace.envs.toolworld.evaluation import ToolWorldAdapter
from envace.evaluation import build_policy
from envace.evaluation.episode import ActLoopConfig
from envace.inference.base import ChatBackend, ChatOutput, ChatRequest
from envace.rehearsal import RehearsalSettings, evaluate_with_rehearsal
from envace.stages.rehearsal_sweep import rehearsal_settings

torch.set_num_threads(1)

COMMITTED_BUDGET = 11  # the committed execution's ACT max_new_tokens; no rehearsal generation uses it
BUDGETS = dict(
    act_max_new_tokens=8,
    rehearse_max_new_tokens=9,
    critique_max_new_tokens=10,
    summary_max_new_tokens=12,
    max_steps_per_turn=2,
)


class Recording:
    """Forwards to a real backend, logging each request in call order."""

    def __init__(self, inner: ChatBackend, log: list[ChatRequest]) -> None:
        self.inner, self.log = inner, log
        self.name = getattr(inner, "name", "recorded")

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.log.extend(requests)
        return self.inner.generate(requests)


@pytest.fixture(scope="module")
def backends() -> dict[str, ChatBackend]:
    return {
        "tiny": build_policy("hf", model={"kind": "tiny"}, name="tiny"),
        "seeded": build_policy("hf", model={"kind": "tiny", "seed": 3}, name="tiny-seed3"),
    }


@pytest.fixture(scope="module")
def multi_turn_task() -> Task:
    return next(t for t in ToolWorldEnv().tasks("test") if len(t.user_turns) >= 3)


def configured(**changes: Any) -> RehearsalSettings:
    """The rehearsal settings of the default composition (what the sweep stage runs), small budgets."""
    settings = rehearsal_settings(typed_config(compose()))
    return replace(settings, config=replace(settings.config, **BUDGETS, **changes))


def run(backend: ChatBackend, task: Task, settings: RehearsalSettings) -> tuple[Any, list[ChatRequest]]:
    log: list[ChatRequest] = []
    seat = Recording(backend, log)
    adapter = ToolWorldAdapter(ActLoopConfig(max_steps_per_turn=2, max_new_tokens=COMMITTED_BUDGET))
    record = evaluate_with_rehearsal(adapter, seat, seat, [task], settings, progress=False).records[0]
    assert record.error is None, record.error
    return record, log


@pytest.mark.parametrize("model", ["tiny", "seeded"])
def test_parallel_attempts_differ(backends: dict[str, ChatBackend], multi_turn_task: Task, model: str) -> None:
    settings = configured(n_attempts=3, mode=RehearsalMode.parallel)
    assert settings.config.act_temperature > 0
    task = replace(
        multi_turn_task, user_turns=multi_turn_task.user_turns[:1], gold_calls=multi_turn_task.gold_calls[:1]
    )  # one user turn: one rehearsal
    record, log = run(backends[model], task, settings)
    attempts = record.info["rehearsal"]["outcomes"][0]["attempts"]
    assert [a["index"] for a in attempts] == [0, 1, 2]
    assert len({json.dumps(a["turns"], sort_keys=True) for a in attempts}) > 1, "all parallel attempts identical"
    firsts = [r for r in log if r.max_new_tokens == BUDGETS["act_max_new_tokens"]][:3]
    assert len({json.dumps(r.messages, sort_keys=True) for r in firsts}) == 1  # one shared prompt ...
    assert len({r.seed for r in firsts}) == 3 and all(r.temperature > 0 for r in firsts)  # ... own seeds


def user_turns_in(request: ChatRequest, user_turns: Sequence[str]) -> set[int]:
    text = "\n".join(str(m.get("content") or "") for m in request.messages)
    return {i for i, turn in enumerate(user_turns) if turn[:40] in text}


def future_turn_leaks(log: Sequence[ChatRequest], user_turns: Sequence[str]) -> list[tuple[int, int]]:
    """(allowed, shown) for every rehearsal request showing a user turn after the one it rehearses before.
    Rehearsal runs before the committed execution's next turn, so it may show one turn past the last the
    committed execution has been shown."""
    reached, leaks = -1, []
    for request in log:
        shown = user_turns_in(request, user_turns)
        if request.max_new_tokens == COMMITTED_BUDGET:
            reached = max([reached, *shown])
        else:
            leaks += [(reached + 1, t) for t in sorted(shown) if t > reached + 1]
    return leaks


def test_turn_scope_no_future_turns(backends: dict[str, ChatBackend], multi_turn_task: Task) -> None:
    settings = configured(n_attempts=2)
    assert settings.config.scope is RehearsalScope.turn and RehearsalConfig().scope is RehearsalScope.turn
    record, log = run(backends["tiny"], multi_turn_task, settings)
    n_turns = len(multi_turn_task.user_turns)
    outcomes = record.info["rehearsal"]["outcomes"]
    assert record.info["rehearsal"]["scope"] == "turn"
    assert [o["turn_index"] for o in outcomes] == list(range(n_turns))  # rehearsed before every turn
    rehearsal = [r for r in log if r.max_new_tokens != COMMITTED_BUDGET]
    assert any(n_turns - 1 in user_turns_in(r, multi_turn_task.user_turns) for r in rehearsal)  # not vacuous
    assert future_turn_leaks(log, multi_turn_task.user_turns) == []
    # the same check on task scope: its rehearsal before turn 0 reads every later turn
    record, log = run(backends["tiny"], multi_turn_task, configured(n_attempts=2, scope=RehearsalScope.task))
    assert [o["turn_index"] for o in record.info["rehearsal"]["outcomes"]] == [0]
    leaks = future_turn_leaks(log, multi_turn_task.user_turns)
    assert {shown for _, shown in leaks} == set(range(1, n_turns)) and all(allowed == 0 for allowed, _ in leaks)
