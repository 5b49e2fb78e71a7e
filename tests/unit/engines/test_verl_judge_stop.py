"""A dead judge stops a verl run within the step, with the cause, and its MLflow run ends FAILED (issue 43, point 3).

The agent loop runs for real (tiny model behind the transformers token server, ``test_verl_agent_loop.play``) with a
reward function whose judge budget is spent; its rows go into the in-memory TransferQueue stand-in of
``test_verl_trainer`` as verl's worker stores them, and the ``envace`` trainer's first hook after sampling raises
the worker's message. MLflow: a real SQLite store; the run is created or resumed by verl's own ``Tracking`` (the
launcher's child run through ``MLFLOW_RUN_ID``, as single-node launches and the multi-node ``submit.sh`` pass it,
or a run of verl's own), and verl's ``TaskRunnerV1`` clean-up (``Tracking.finish``) runs after the failure.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_verl_agent_loop import gold_texts, play
from test_verl_trainer import MemoryKV, store_rows, trainer_with, world  # noqa: F401 - world is a fixture

from envace.engines.verl import reward_sources
from envace.engines.verl.rows import EXCLUDE_KEY
from envace.engines.verl.run_failure import FAILURE_TAG, FATAL_KEY
from envace.judges.budget import FailureBudget, JudgeFailureBudgetExceeded


def spent_budget_message() -> str:
    budget = FailureBudget(0.2, 5, where="http://judge.invalid/v1")
    with pytest.raises(JudgeFailureBudgetExceeded) as info:
        for _ in range(5):
            budget.record(True, "ConnectError: connection refused")
    return str(info.value)


@pytest.fixture
def dead_judge(monkeypatch: pytest.MonkeyPatch) -> str:
    """The loop's reward function raises the budget's own message (as ``envace.judges`` does once it is spent)."""
    message = spent_budget_message()

    def build(settings: Any):
        def reward(spec, trajectory):
            raise JudgeFailureBudgetExceeded(message)

        return reward

    monkeypatch.setitem(reward_sources.REWARD_BUILDERS, "verifiable", build)
    monkeypatch.setattr(reward_sources, "_CACHE", {})
    return message


def test_budget_exceeded_rows_stop_the_trainer_step_with_the_cause(
    world: dict,  # noqa: F811
    dead_judge: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kv = MemoryKV()
    rows, _, _ = play(world, scripts=gold_texts(world["spec"]), uid="g1", session=0)
    assert len(rows) == 2 and all(r.extra_fields[FATAL_KEY] == dead_judge for r in rows)
    assert all(r.extra_fields[EXCLUDE_KEY] is True and sum(r.response_mask) == 0 for r in rows)  # never trained on
    keys = store_rows(kv, "g1", 0, rows)
    monkeypatch.setattr(reward_sources, "_CACHE", {})
    monkeypatch.undo()  # a healthy judge again: this session's rows carry no flag
    healthy, _, _ = play(world, scripts=gold_texts(world["spec"]), uid="g1", session=1)
    assert all(FATAL_KEY not in r.extra_fields for r in healthy)
    clean = store_rows(kv, "g1", 1, healthy)
    trainer = trainer_with(world, kv, monkeypatch)
    trainer.global_steps = 7
    trainer._stop_on_fatal_rows(MemoryKV._meta(clean, "train"))  # nothing flagged: the step goes on
    called = []
    monkeypatch.setattr("verl.trainer.ppo.v1.trainer_base.PPOTrainer._balance_batch", lambda *a, **k: called.append(1))
    with pytest.raises(JudgeFailureBudgetExceeded) as info:
        trainer._balance_batch(MemoryKV._meta(clean + keys, "train"), {})  # the first hook after sampling
    assert str(info.value).startswith(dead_judge) and "training step 7" in str(info.value)
    assert "judge.max_failure_rate" in str(info.value) and "connection refused" in str(info.value)
    assert not called, "verl's balancing (and everything after it in the step) must not run"
    with pytest.raises(JudgeFailureBudgetExceeded, match="judge failure budget exhausted"):
        trainer._compute_advantage(MemoryKV._meta(clean + keys, "train"), {})  # the second line of defence


def test_sync_step_calls_balance_batch_right_after_sampling() -> None:
    """Pins the verl internal the stop relies on: ``_step_once`` samples, then (before any log-prob pass or
    update) calls ``_balance_batch``; a verl upgrade that moves it fails here."""
    import inspect

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    source = inspect.getsource(PPOTrainer._step_once)
    sample, balance = source.find("self.replay_buffer.sample("), source.find("self._balance_batch(")
    first_pass = min(source.find(f"self.{name}(") for name in ("_compute_old_log_prob", "_update_actor"))
    assert 0 <= sample < balance < first_pass, "verl's _step_once order changed: move envace's fatal-row check"


def _fail_fit(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def fit(self, agent_loop_manager):
        raise error

    monkeypatch.setattr("verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync.fit", fit)


@pytest.mark.parametrize("created_by", ["launcher child run (MLFLOW_RUN_ID)", "verl"])
def test_a_dying_trainer_ends_its_mlflow_run_failed(
    created_by: str, store_uri: str, experiment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient
    from verl.utils.tracking import Tracking

    from envace.engines.verl.launcher import create_child_run
    from envace.engines.verl.trainer import EnvacePPOTrainer

    client = MlflowClient(store_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    parent = child = None
    if created_by != "verl":  # what plan_launch does with a parent run, for a single node and for submit.sh
        parent = client.create_run(client.create_experiment(experiment)).info.run_id
        child = create_child_run(store_uri, parent)
        monkeypatch.setenv("MLFLOW_RUN_ID", child)
    message = spent_budget_message()
    _fail_fit(monkeypatch, JudgeFailureBudgetExceeded(message))
    trainer = EnvacePPOTrainer.__new__(EnvacePPOTrainer)
    try:
        tracking = Tracking(project_name=experiment, experiment_name="run", default_backend=["mlflow"], config={"a": 1})
        run_id = mlflow.active_run().info.run_id
        with pytest.raises(JudgeFailureBudgetExceeded):
            trainer.fit(agent_loop_manager=None)
        tracking.finish(exit_code=1)  # verl's TaskRunnerV1.run clean-up, which would end the run FINISHED
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == f"JudgeFailureBudgetExceeded: {message}"
    if parent is not None:  # verl attached to the launcher's child run
        assert run_id == child and run.data.tags["mlflow.parentRunId"] == parent
    else:
        assert run.info.run_name == "run" and run.data.params["a"] == "1"  # verl's own run


def test_without_an_active_run_fit_just_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from envace.engines.verl.trainer import EnvacePPOTrainer

    assert mlflow.active_run() is None
    _fail_fit(monkeypatch, RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        EnvacePPOTrainer.__new__(EnvacePPOTrainer).fit(agent_loop_manager=None)
