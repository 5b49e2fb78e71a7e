"""Test-time rehearsal runs what docs/method.md §12 describes (tracker issue 12, points 1 and 8), at config
level and on the real tool world with scripted seats.

* ``parallel`` with N > 1 at ACT temperature 0 would decode N copies of one attempt: it is refused when the
  ``RehearsalConfig`` is built, when the Hydra config loads (every cell of the sweep grid is checked) and
  by ``run_rehearsal_sweep`` before its first cell runs. ``sequential`` at temperature 0 and a single
  attempt stay allowed; a sampling REHEARSE role alone does not lift the refusal.
* ``committed_executions`` is counted from the real executions the adapter's episode opened: it equals the
  number of executors a recording tool world built per task — 1 normally, 2 for an episode that commits
  twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from envace.config.load import ConfigError, compose, to_plain
from envace.core.env import Task
from envace.core.rehearsal import RehearsalConfig, RehearsalScope
from envace.core.wire import render_rehearsal
from envace.envs.toolworld import ToolWorldEnv, ToolWorldExecutor
from envace.envs.toolworld.evaluation import ToolWorldAdapter
from envace.evaluation import OracleBackend
from envace.evaluation.episode import ActLoopConfig, TurnHook
from envace.evaluation.programs import GenerationLedger, Program
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatOutput, ChatRequest
from envace.rehearsal import RehearsalSettings, evaluate_with_rehearsal, run_rehearsal_sweep

REFUSAL = (
    r"rehearsal\.act_temperature=0\.0 with mode=parallel and n_attempts=3 gives 3 identical attempts.*"
    r"set rehearsal\.act_temperature > 0 \(default 0\.7\) or use mode=sequential"
)


class RecordingToolWorldEnv(ToolWorldEnv):
    """The real tool world; remembers every executor it builds, with the task it was built for."""

    def __init__(self) -> None:
        super().__init__()
        self.executors: list[tuple[str, ToolWorldExecutor]] = []

    def make_executor(self, task: Task) -> ToolWorldExecutor:
        executor = super().make_executor(task)
        self.executors.append((task.task_id, executor))
        return executor

    def built_for(self, task: Task) -> int:
        return sum(task_id == task.task_id for task_id, _ in self.executors)


class ConfirmingRehearser:
    name = "confirming-rehearser"

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(render_rehearsal({"status": "ok"}), completion_tokens=2) for _ in requests]


class CommitsTwice(ToolWorldAdapter):
    """A faulty adapter: its episode runs the real episode twice (say, a retry) and keeps the second."""

    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        yield from super().episode_program(task, ledger=ledger)
        return (yield from super().episode_program(task, ledger=ledger, turn_hook=turn_hook))


# ---- point 1: parallel attempts at temperature 0 are refused, with keys and fix named ------------------
def test_parallel_attempts_at_temperature_zero_are_refused() -> None:
    with pytest.raises(ValueError, match=REFUSAL):
        RehearsalConfig(n_attempts=3, mode="parallel", act_temperature=0.0)
    with pytest.raises(ValueError, match=REFUSAL):  # sampled imagined responses do not make attempts differ
        RehearsalConfig(n_attempts=3, mode="parallel", act_temperature=0.0, rehearse_temperature=1.0)
    with pytest.raises(ValueError, match="act_temperature=-0.5"):
        RehearsalConfig(act_temperature=-0.5)
    # allowed: sequential attempts differ through their prompts; one attempt; no rehearsal
    assert RehearsalConfig(n_attempts=3, mode="sequential", act_temperature=0.0).n_attempts == 3
    assert RehearsalConfig(n_attempts=1, mode="parallel", act_temperature=0.0).n_attempts == 1
    assert RehearsalConfig(n_attempts=0, act_temperature=0.0).n_attempts == 0


def test_library_defaults_sample_attempts_in_turn_scope() -> None:
    cfg = compose()
    r = cfg.rehearsal
    default = RehearsalConfig()
    assert float(r.act_temperature) == default.act_temperature == 0.7
    assert float(r.rehearse_temperature) == default.rehearse_temperature
    assert to_plain(r.scope) == default.scope.value == RehearsalScope.turn.value
    for profile in ("smoke", "cpu", "paper"):
        assert float(compose([f"profile={profile}"]).rehearsal.act_temperature) > 0


def test_sweep_with_parallel_cells_at_temperature_zero_fails_at_config_load() -> None:
    with pytest.raises(
        ConfigError,
        match=r"rehearsal\.act_temperature=0\.0 with mode=parallel and n_attempts=2.*"
        r"rehearsal\.modes",
    ):
        compose(["rehearsal.act_temperature=0.0"])  # the grid holds n2-parallel and n3-parallel
    with pytest.raises(ConfigError, match="n_attempts=3"):
        compose(["rehearsal.act_temperature=0.0", "rehearsal.n_attempts_grid=[0,1,3]"])
    # the n=1 and sequential cells alone are fine at temperature 0
    assert compose(["rehearsal.act_temperature=0.0", "rehearsal.modes=[sequential]"]).rehearsal.n_attempts_grid
    assert compose(["rehearsal.act_temperature=0.0", "rehearsal.n_attempts_grid=[0,1]"]).rehearsal.modes


def test_library_sweep_refuses_before_running_any_cell() -> None:
    env = RecordingToolWorldEnv()
    adapter = ToolWorldAdapter(ActLoopConfig(max_steps_per_turn=3), env=env)
    tasks = adapter.tasks("test", limit=1, seed=0)
    oracle = OracleBackend(tasks, make_executor=ToolWorldExecutor)
    greedy = RehearsalSettings(RehearsalConfig(n_attempts=0, act_temperature=0.0, summarizer="structured"))
    with pytest.raises(ValueError, match=REFUSAL):
        run_rehearsal_sweep(
            adapter,
            oracle,
            {"scripted": ConfirmingRehearser()},
            [0, 1, 3],
            ["sequential", "parallel"],
            tasks,
            greedy,
            progress=False,
        )
    assert env.executors == []  # not even the N=0 baseline ran


# ---- point 8: committed executions are counted from the real executors ---------------------------------
@pytest.mark.parametrize("adapter_kind, expected", [(ToolWorldAdapter, 1), (CommitsTwice, 2)])
def test_committed_executions_are_counted(adapter_kind: Any, expected: int) -> None:
    env = RecordingToolWorldEnv()
    adapter = adapter_kind(ActLoopConfig(max_steps_per_turn=4), env=env)
    tasks = adapter.tasks("test", limit=2, seed=0)
    oracle = OracleBackend(tasks, make_executor=ToolWorldExecutor)  # its own executors, not env's
    settings = RehearsalSettings(RehearsalConfig(n_attempts=2, summarizer="structured"))
    run = evaluate_with_rehearsal(adapter, oracle, ConfirmingRehearser(), tasks, settings, progress=False)
    assert len(env.executors) == expected * len(tasks)
    for task, record in zip(tasks, run.records):
        assert record.error is None, record.error
        costs = record.info["rehearsal"]["costs"]
        assert costs["committed_executions"] == env.built_for(task) == expected
        calls = [c for turn in record.turns for c in turn.tool_calls]
        assert costs["real_env_calls"] == record.real_calls == len(calls)
    # no rehearsal: still exactly the executors built
    plain = evaluate_with_rehearsal(
        adapter, oracle, None, tasks, RehearsalSettings(RehearsalConfig(n_attempts=0)), progress=False
    )
    assert [r.info["rehearsal"]["costs"]["committed_executions"] for r in plain.records] == [expected] * len(tasks)


# ---- point 4: the sweep records its scope; the report labels task scope --------------------------------
@pytest.mark.parametrize("scope, label", [("turn", "turn"), ("task", "task (sees future turns)")])
def test_sweep_rows_record_the_scope_and_label_task_scope(scope: str, label: str) -> None:
    from envace.reporting.tables import testtime_table
    from envace.stages.rehearsal_sweep import grid_rows

    adapter = ToolWorldAdapter(ActLoopConfig(max_steps_per_turn=3))
    tasks = adapter.tasks("test", limit=1, seed=0)
    oracle = OracleBackend(tasks, make_executor=ToolWorldExecutor)
    settings = RehearsalSettings(RehearsalConfig(n_attempts=0, scope=scope, summarizer="structured"))
    cells = run_rehearsal_sweep(
        adapter, oracle, {"scripted": ConfirmingRehearser()}, [0, 1], ["parallel"], tasks, settings, progress=False
    )
    assert [(c.to_json()["scope"], c.to_json()["scope_label"]) for c in cells] == [("none", "none"), (scope, label)]
    rows = grid_rows(cells, "toolworld")
    assert [(r["scope"], r["scope_label"]) for r in rows] == [("none", "none"), (scope, label)]
    table = testtime_table({"rehearsal_sweep": {"cells": rows}})
    assert table["scope"].tolist() == ["none", label]
    assert table["cost/committed_executions"].tolist() == [1.0, 1.0]
