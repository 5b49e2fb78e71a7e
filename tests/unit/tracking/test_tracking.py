"""Tracking against a real SQLite MLflow store: nested stage runs, FAILED on error, parent-run
resolution (env var, one parent per dvc process), runs_table; stable metric keys, stage summaries on the
parent, the experiment kind, comparisons by variant; rollout tables, data-set inputs, the model round trip,
episode traces and system metrics (envace.tracking.mlflow_logging, envace.tracking.traces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.tracking import runs as tracking_runs
from envace.tracking import store as tracking_store
from envace.tracking.runs import ENV_PARENT_RUN_ID, stage_run, start_pipeline_run
from envace.tracking.store import MlflowStore, runs_table
from envace.tracking.tracker import NullTracker, numeric_items


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_PARENT_RUN_ID, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_stage_run_nests_under_the_parent_from_the_environment(store_uri, experiment, in_tmp, monkeypatch):
    store = MlflowStore(experiment, store_uri)
    parent = start_pipeline_run(store, "smoke", ["profile=smoke"], flow_run_id="flow-123")
    monkeypatch.setenv(ENV_PARENT_RUN_ID, parent)
    (in_tmp / "stats.json").write_text('{"rows": 3}')
    with stage_run(
        "train",
        {"algo.name": "envace", "rehearsal.n_attempts_grid": [0, 2]},
        profile="smoke",
        experiment=experiment,
        tracking_uri=store_uri,
    ) as run:
        for step in (1, 2, 3):
            run.log_metrics({"reward/mean": step / 10, "note": "skipped"}, step=step)
        run.log_artifact(in_tmp / "stats.json", "data")
    child = client(store_uri).get_run(run.run_id)
    assert child.info.status == "FINISHED"
    assert child.data.tags["mlflow.parentRunId"] == parent
    assert child.data.tags["envace.stage"] == "train"
    assert child.data.params["algo.name"] == "envace"
    assert json.loads(child.data.params["rehearsal.n_attempts_grid"]) == [0, 2]
    history = client(store_uri).get_metric_history(run.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "note" not in child.data.metrics
    assert [a.path for a in client(store_uri).list_artifacts(run.run_id, "data")] == ["data/stats.json"]
    parent_run = client(store_uri).get_run(parent)
    assert parent_run.data.tags["prefect.flow_run_id"] == "flow-123"
    assert json.loads(parent_run.data.tags["envace.overrides"]) == ["profile=smoke"]
    assert parent_run.info.status == "RUNNING"  # the flow that owns it ends it, not the stage


def test_a_failing_stage_ends_failed_with_the_error_recorded(store_uri, experiment, in_tmp):
    with pytest.raises(ValueError, match="no rows"):
        with stage_run("prepare_data", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
            raise ValueError("no rows survived")
    failed = client(store_uri).get_run(run.run_id)
    assert failed.info.status == "FAILED"
    assert failed.data.tags["error"] == "ValueError: no rows survived"
    text = client(store_uri).download_artifacts(run.run_id, "error.txt", str(in_tmp))
    assert "no rows survived" in Path(text).read_text()
    parent = failed.data.tags["mlflow.parentRunId"]
    assert client(store_uri).get_run(parent).info.status == "FAILED"


def test_nested_runs_are_children_of_the_stage_run_and_record_failures(store_uri, experiment, in_tmp):
    with stage_run("rehearsal_sweep", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        with run.nested("toolworld/n1-parallel-trained", {"envace.cell": "n1-parallel-trained"}) as cell:
            cell.log_params({"n_attempts": 1, "mode": "parallel"})
            cell.log_metrics({"success_rate": 0.5, "cost/real_env_calls": 2.0})
        with pytest.raises(RuntimeError, match="boom"):
            with run.nested("toolworld/n2-parallel-trained") as broken:
                raise RuntimeError("boom")
    c = client(store_uri)
    ok, bad = c.get_run(cell.run_id), c.get_run(broken.run_id)
    assert ok.info.status == "FINISHED" and bad.info.status == "FAILED"
    assert ok.data.tags["mlflow.parentRunId"] == run.run_id == bad.data.tags["mlflow.parentRunId"]
    assert ok.data.tags["envace.kind"] == "cell" and ok.data.tags["envace.profile"] == "smoke"
    assert ok.data.params == {"n_attempts": "1", "mode": "parallel"}
    assert ok.data.metrics == {"success_rate": 0.5, "cost/real_env_calls": 2.0}
    assert bad.data.tags["error"] == "RuntimeError: boom"
    assert c.get_run(run.run_id).info.status == "FINISHED"
    with NullTracker().nested("anything") as null_child:
        assert isinstance(null_child, NullTracker)


def test_stages_of_one_dvc_process_share_one_parent(store_uri, experiment, in_tmp, monkeypatch):
    monkeypatch.setattr(tracking_runs, "_dvc_ancestor_key", lambda: "4242-1000-")
    ids = []
    for stage in ("prepare_data", "train"):
        with stage_run(stage, {}, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
            pass
        ids.append(client(store_uri).get_run(run.run_id).data.tags["mlflow.parentRunId"])
    assert ids[0] == ids[1]
    assert json.loads((in_tmp / tracking_runs.PIPELINE_RUN_FILE).read_text())["run_id"] == ids[0]
    assert client(store_uri).get_run(ids[0]).info.status == "FINISHED"
    monkeypatch.setattr(tracking_runs, "_dvc_ancestor_key", lambda: "4343-1001-")  # the next `dvc repro`
    with stage_run("prepare_data", {}, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
        pass
    assert client(store_uri).get_run(run.run_id).data.tags["mlflow.parentRunId"] != ids[0]


def test_a_stage_run_by_hand_gets_its_own_parent(store_uri, experiment, in_tmp, monkeypatch):
    monkeypatch.setattr(tracking_runs, "_dvc_ancestor_key", lambda: None)
    parents = set()
    for _ in range(2):
        with stage_run("report", {}, profile="cpu", experiment=experiment, tracking_uri=store_uri) as run:
            pass
        parents.add(client(store_uri).get_run(run.run_id).data.tags["mlflow.parentRunId"])
    assert len(parents) == 2
    assert not (in_tmp / tracking_runs.PIPELINE_RUN_FILE).exists()


def test_runs_table_compares_runs(store_uri, experiment, in_tmp, monkeypatch):
    store = MlflowStore(experiment, store_uri)
    parent = start_pipeline_run(store, "smoke")
    monkeypatch.setenv(ENV_PARENT_RUN_ID, parent)
    for stage, value in (("train", 0.25), ("report", 1.0)):
        with stage_run(stage, {"seed": 0}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
            run.log_metrics({"score": value})
    table = runs_table(experiment, tracking_uri=store_uri, parent_run_id=parent, include_params=True)
    assert sorted(table["stage"]) == ["report", "train"]
    assert set(table["parent_run_id"]) == {parent}
    assert table.set_index("stage").loc["train", "metrics.score"] == 0.25
    assert "params.seed" in table.columns
    only = runs_table(experiment, tracking_uri=store_uri, stage="report")
    assert list(only["metrics.score"]) == [1.0]
    pipelines = runs_table(experiment, tracking_uri=store_uri, kind="pipeline")
    assert list(pipelines["run_id"]) == [parent]
    assert runs_table("no-such-experiment", tracking_uri=store_uri).empty


def test_tracking_none_logs_nothing(in_tmp):
    with stage_run("train", {"a": 1}, profile="smoke", backend="none") as run:
        assert isinstance(run, NullTracker) and run.run_id is None
        run.log_metrics({"x": 1.0}, step=1)
    assert not (in_tmp / "mlflow.db").exists()


def test_default_store_is_sqlite_at_the_dvc_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking_store.default_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_store.default_tracking_uri() == "http://127.0.0.1:5000"


def test_numeric_items_keeps_finite_numbers_only():
    got = numeric_items({"a": 1, "b": 0.5, "c": True, "d": "x", "e": float("nan"), "f g(h)": 2, "l": [1]})
    assert got == {"a": 1.0, "b": 0.5, "c": 1.0, "f_g_h": 2.0}


def test_env_overrides_reach_the_parent_tags(monkeypatch):
    monkeypatch.setenv(tracking_runs.ENV_OVERRIDES, json.dumps(["algo=grpo"]))
    monkeypatch.setenv(tracking_runs.ENV_FLOW_RUN_ID, "abc")
    tags = tracking_runs.pipeline_tags("cpu")
    assert json.loads(tags["envace.overrides"]) == ["algo=grpo"] and tags["prefect.flow_run_id"] == "abc"
    assert tags["envace.profile"] == "cpu" and tags["git_commit"]


# ---- stable names, summaries on the parent, the experiment kind, comparisons ------------------------------
def test_unstable_metric_keys_are_renamed_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="envace.tracking.tracker"):
        got = numeric_items({"overall.envace (smollm2-135m)": 0.5, "reward/mean": 1, "final/kl_coef": 0.1})
    assert got == {"overall.envace_smollm2-135m": 0.5, "reward/mean": 1.0, "final/kl_coef": 0.1}
    assert "not a stable name" in caplog.text and "overall.envace (smollm2-135m)" in caplog.text


def test_stage_summary_is_mirrored_on_the_parent_and_the_experiment_opens_on_runs(
    store_uri, experiment, in_tmp, monkeypatch
):
    store = MlflowStore(experiment, store_uri)
    parent = start_pipeline_run(store, "smoke")
    monkeypatch.setenv(ENV_PARENT_RUN_ID, parent)
    with stage_run("evaluate@toolworld", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        run.log_metrics({"reward/mean": 0.1}, step=1)  # per-step: the stage run only
        run.log_metrics({"policy.success_rate": 0.5, "n_tasks": 4})  # the summary: also on the parent
    metrics = client(store_uri).get_run(parent).data.metrics
    assert metrics == {"evaluate.toolworld/policy.success_rate": 0.5, "evaluate.toolworld/n_tasks": 4.0}
    exp = client(store_uri).get_experiment_by_name(experiment)
    assert exp.tags[tracking_store.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_two_variants_compare_in_runs_table_on_the_same_metric_names(store_uri, experiment, in_tmp, monkeypatch):
    store = MlflowStore(experiment, store_uri)
    for variant, seed, reward in (("envace", 0, 0.6), ("envace", 1, 0.8), ("grpo", 0, 0.3)):
        monkeypatch.setenv(ENV_PARENT_RUN_ID, start_pipeline_run(store, "smoke"))
        params = {"algo.name": variant, "seed": seed, "model.display": f"{variant} (tiny)"}
        with stage_run("train", params, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
            run.log_metrics({"final/reward_mean": reward, "steps_done": 2})
    table = runs_table(experiment, tracking_uri=store_uri, stage="train", group_by="params.algo.name")
    table = table.set_index("params.algo.name")
    assert sorted(table.index) == ["envace", "grpo"]
    assert table.loc["envace", "final/reward_mean.mean"] == pytest.approx(0.7)
    assert table.loc["envace", "final/reward_mean.n"] == 2 and table.loc["grpo", "n_runs"] == 1
    assert table.loc["grpo", "final/reward_mean.mean"] == pytest.approx(0.3)
    by_seed = tracking_store.compare_runs(
        "final/reward_mean",
        by=["params.algo.name", "params.seed"],
        experiment=experiment,
        tracking_uri=store_uri,
        stage="train",
    )
    assert len(by_seed) == 3 and list(by_seed.columns[-3:]) == [
        "final/reward_mean.mean",
        "final/reward_mean.std",
        "final/reward_mean.n",
    ]
    pipelines = runs_table(
        experiment, tracking_uri=store_uri, kind="pipeline", group_by="profile", metrics=["train/final/reward_mean"]
    )  # the parents hold the same summary
    assert pipelines.loc[0, "train/final/reward_mean.n"] == 3


# ---- envace.tracking.mlflow_logging, envace.tracking.traces ---------------------------------------------------------
def _trajectory(prompt: str, sample: int, reward: float):
    from envace.core.records import Role, Segment, Stream, ToolCall, Trajectory, Turn

    act, reh = (
        Segment((1, 2), Role.ACT, text=f"<tool_call>{prompt}</tool_call>"),
        Segment((3,), Role.REHEARSE, text='{"ok": 1}'),
    )
    turns = (Turn(act.text, (ToolCall("lookup", {"q": prompt}),), ({"ok": 1},), rehearsed=False),)
    return Trajectory(prompt, sample, streams=(Stream(Role.ACT, (act, reh)),), turns=turns, reward=reward)


def test_rollout_tables_are_logged_per_step_and_bounded(store_uri, experiment, in_tmp):
    from types import SimpleNamespace

    import torch

    from envace.tracking.mlflow_logging import RolloutSampler, global_tracking_uri

    trajs = [_trajectory(f"{g}@{g}", s, float(s)) for g in range(3) for s in range(4)]  # 3 groups x 4 samples
    # engines.local.trainer.OutputAdvantages' values: one per output, in trajectory/output order
    adv = SimpleNamespace(values=torch.tensor([v for i in range(len(trajs)) for v in (0.1 * i, -0.1 * i)]))
    with stage_run("train", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        sampler = RolloutSampler(run, group_size=4, limit=8)
        sampler(3, trajs, adv)
    c = client(store_uri)
    assert [a.path for a in c.list_artifacts(run.run_id, "rollouts")] == ["rollouts/step_0003.json"]
    with global_tracking_uri(store_uri):  # load_table searches runs through the fluent API
        table = c.load_table(
            experiment_id=c.get_run(run.run_id).info.experiment_id,
            artifact_file="rollouts/step_0003.json",
            run_ids=[run.run_id],
        )
    assert len(table) == 8 and set(table["prompt_id"]) == {"0@0", "1@1", "2@2"}  # every group sampled
    row = table.set_index(["prompt_id", "sample_index"]).loc[("1@1", 0)]
    assert row["advantage_act"] == pytest.approx(0.4) and row["advantage_rehearse"] == pytest.approx(-0.4)
    assert row["act_output"].startswith("<tool_call>") and row["rehearse_output"] == '{"ok": 1}'
    assert json.loads(row["real_response"]) == [{"tool": "lookup", "response": {"ok": 1}}]


def test_data_sets_are_logged_as_run_inputs(store_uri, experiment, in_tmp):
    from envace.tracking.mlflow_logging import log_datasets

    for split, n in (("train", 3), ("val", 2)):
        (in_tmp / f"{split}.jsonl").write_text(
            "".join(json.dumps({"uuid": f"{split}{i}", "messages": [{}], "tools": []}) + "\n" for i in range(n))
        )
    with stage_run("train", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        names = log_datasets(
            run,
            {s: in_tmp / f"{s}.jsonl" for s in ("train", "val", "test")},
            {"train": ["train0"]},
            prefix="toolworld-",
        )
    assert names == ["toolworld-train", "toolworld-val"]
    inputs = client(store_uri).get_run(run.run_id).inputs.dataset_inputs
    by_name = {i.dataset.name: i for i in inputs}
    assert set(by_name) == set(names)
    train = by_name["toolworld-train"]
    assert train.dataset.digest == tracking_digest(in_tmp / "train.jsonl")
    assert json.loads(train.dataset.source)["uri"].endswith("train.jsonl")
    assert json.loads(train.dataset.profile)["num_rows"] == 3
    assert {t.key: t.value for t in train.tags}["mlflow.data.context"] == "train"


def test_data_sets_are_named_by_the_source_value_not_the_enum(store_uri, experiment, in_tmp):
    """``train_logging`` names the splits ``toolworld-train``, not ``DataSourceName.toolworld-train``."""
    from types import SimpleNamespace

    from envace.config.load import compose, typed_config
    from envace.tracking.mlflow_logging import train_logging

    cfg = typed_config(compose(["profile=smoke", f"paths.prepared={in_tmp}", f"paths.prompts={in_tmp}"]))
    (in_tmp / "train.jsonl").write_text(json.dumps({"uuid": "a", "messages": [], "tools": []}) + "\n")
    with stage_run("train", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        with train_logging(cfg, run, SimpleNamespace(), checkpoints=in_tmp / "none"):
            pass
    inputs = client(store_uri).get_run(run.run_id).inputs.dataset_inputs
    assert [i.dataset.name for i in inputs] == [f"{cfg.data.source.value}-train"] == ["toolworld-train"]


def tracking_digest(path):
    from envace.tracking.mlflow_logging import file_digest

    return file_digest(path)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from envace.models import ModelSpec, load_model_and_tokenizer

    root = tmp_path_factory.mktemp("checkpoints")
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    model.save_pretrained(root / "final" / "policy")
    tokenizer.save_pretrained(root / "final" / "policy")
    manifest = {"roles": {"act": "final/policy", "rehearse": "final/policy"}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root, manifest


def test_the_trained_checkpoint_round_trips_as_an_mlflow_transformers_model(
    store_uri, experiment, in_tmp, tiny_checkpoint
):
    import mlflow.transformers

    from envace.tracking.mlflow_logging import global_tracking_uri, log_policy_model

    root, manifest = tiny_checkpoint
    with stage_run("train", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        for step in (1, 2):
            run.log_metrics({"reward/mean": step / 4}, step=step)
        logged = log_policy_model(run, root, manifest)
    assert logged == {"policy": str(root / "final" / "policy")}  # one directory plays both roles
    tags = client(store_uri).get_run(run.run_id).data.tags
    assert tags["model.uri"] == f"runs:/{run.run_id}/policy"
    # the experiment's Models tab: a logged model named policy, from this run, with the run's latest metrics
    exp_id = client(store_uri).get_run(run.run_id).info.experiment_id
    (model,) = client(store_uri).search_logged_models(experiment_ids=[exp_id])
    assert model.name == "policy" and model.source_run_id == run.run_id and model.model_id == tags["model.id.policy"]
    assert [(m.key, m.value, m.step) for m in model.metrics] == [("reward/mean", 0.5, 2)]
    outputs = client(store_uri).get_run(run.run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(model.model_id, 2)]
    with global_tracking_uri(store_uri):
        pipe = mlflow.transformers.load_model(f"runs:/{run.run_id}/policy")
    out = pipe("hello", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("hello") and len(out[0]["generated_text"]) > len("hello")
    import mlflow

    assert mlflow.get_tracking_uri() != store_uri  # the global URI is restored


def test_a_checkpoint_over_the_size_limit_is_not_logged_as_a_model(store_uri, experiment, in_tmp, tiny_checkpoint):
    from envace.tracking.mlflow_logging import log_policy_model

    root, manifest = tiny_checkpoint
    with stage_run("train", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        assert log_policy_model(run, root, manifest, max_bytes=1000) == {}
        assert log_policy_model(run, root, manifest, enabled=False) == {}
    tags = client(store_uri).get_run(run.run_id).data.tags
    assert "tracking.model_max_bytes=1000" in tags["model.skipped"]
    assert not client(store_uri).list_artifacts(run.run_id, "policy")


def _episode(i: int, rehearsed: bool):
    from envace.core.records import ToolCall, Turn
    from envace.core.rehearsal import turn_to_json
    from envace.evaluation.records import EpisodeRecord

    turn = Turn(f"act {i}", (ToolCall("get_weather", {"city": "Oslo"}),), ({"temp": i},), rehearsed=False)
    info = {}
    if rehearsed:
        imagined = turn_to_json(Turn("act imagined", (ToolCall("get_weather", {"city": "Oslo"}),), ({"temp": -1},)))
        info = {
            "rehearsal": {
                "n_attempts": 1,
                "outcomes": [
                    {
                        "turn_index": 0,
                        "memory": "m",
                        "attempts": [
                            {"index": 0, "turns": [imagined], "final_answers": ["x"], "critique_text": "fine"}
                        ],
                    }
                ],
            }
        }
    return EpisodeRecord(
        benchmark="toolworld",
        task_id=f"t{i}",
        domain="weather",
        split="test",
        held_out=False,
        score=float(i % 2),
        success=bool(i % 2),
        turns=(turn,),
        final_answers=("done",),
        info=info,
    )


def test_episodes_are_logged_as_bounded_traces(store_uri, experiment, in_tmp):
    import mlflow

    from envace.tracking.traces import log_episode_traces

    records = [_episode(i, rehearsed=i == 0) for i in range(4)]
    with stage_run("rehearsal_sweep", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run:
        first = log_episode_traces(run, records, tags={"envace.stage": "rehearsal_sweep"}, limit=3, max_traces=5)
        second = log_episode_traces(run, records, max_traces=5)  # the run's budget: 5 in all
    assert len(first) == 3 and len(second) == 2
    exp_id = client(store_uri).get_run(run.run_id).info.experiment_id
    traces = client(store_uri).search_traces(locations=[exp_id], max_results=50)
    assert len(traces) == 5
    assert {t.info.request_metadata.get("mlflow.sourceRun") for t in traces} == {run.run_id}
    rehearsed = next(t for t in traces if t.info.trace_id == first[0])
    names = [s.name for s in rehearsed.data.spans]
    assert names[0] == "episode t0" and "rehearsal (turn 0)" in names and "attempt 0" in names
    assert names.count("get_weather") == 2 and "REHEARSE answer" in names and "real response" in names
    assert names.count("ACT 0") == 2
    root = rehearsed.data.spans[0]
    assert root.attributes["envace.score"] == 0.0 and rehearsed.info.tags["envace.stage"] == "rehearsal_sweep"
    scores = [a for a in rehearsed.info.assessments if a.name == "score"]
    assert len(scores) == 1 and scores[0].value == 0.0
    assert mlflow.get_tracking_uri() != store_uri


def test_trace_ids_unique_across_runs(store_uri, experiment, in_tmp):
    """Every stage seeds Python's ``random``; trace ids must not follow it, or the second run with the
    same seed overwrites the first run's traces and stacks its assessments on them."""
    import random

    from envace.config.load import compose
    from envace.stages import runner
    from envace.tracking.traces import trace_episodes

    cfg = compose(["profile=smoke", f"tracking.experiment={experiment}", "seed=0", "tracking.max_traces=3"])
    records = [_episode(i, rehearsed=False) for i in range(3)]
    seen: dict[str, list[str]] = {}

    def run(cfg, tracker):
        draws = [random.random() for _ in range(3)]  # the stage's own seeded randomness
        seen.setdefault("draws", []).append(draws)
        seen.setdefault("traces", []).extend(trace_episodes(cfg, tracker, records))
        return {"n": 1}

    for _ in range(2):
        runner.execute("demo", run, cfg, in_tmp / "metrics" / "demo.json", tracking_uri=store_uri)
    assert seen["draws"][0] == seen["draws"][1]  # the seed still makes the stage reproducible
    assert len(seen["traces"]) == len(set(seen["traces"])) == 6
    c = client(store_uri)
    exp_id = c.get_experiment_by_name(experiment).experiment_id
    traces = c.search_traces(locations=[exp_id], max_results=50)
    assert len(traces) == 6 and len({t.info.request_metadata.get("mlflow.sourceRun") for t in traces}) == 2
    for trace in traces:
        assert len([a for a in trace.info.assessments if a.name == "score"]) == 1


def test_system_metrics_are_recorded_on_the_run(store_uri, experiment, in_tmp):
    import time

    from envace.tracking.mlflow_logging import system_metrics

    with (
        stage_run("train", {}, profile="smoke", experiment=experiment, tracking_uri=store_uri) as run,
        system_metrics(run, interval_s=0.5),
    ):
        time.sleep(1.6)
    metrics = client(store_uri).get_run(run.run_id).data.metrics
    assert any(k.startswith("system/cpu_utilization") for k in metrics), metrics
    with system_metrics(NullTracker()) as monitor:
        assert monitor is None


@pytest.mark.slow
def test_the_local_engine_exposes_each_steps_rollouts_without_changing_training(guided_tiny_world):
    from dataclasses import replace

    import torch

    from envace.engines import get_engine
    from envace.engines.local import LocalEngineConfig, OptimConfig, RolloutConfig
    from envace.models import ModelSpec

    cfg = LocalEngineConfig(
        model=ModelSpec(kind="tiny", seed=3),
        steps=2,
        prompts_per_step=2,
        seed=5,
        progress=False,
        rollout=RolloutConfig(samples_per_prompt=2, max_act_tokens=24, max_rehearse_tokens=16, max_stream_tokens=512),
        optim=OptimConfig(lr=1e-3),
    )
    seen = []
    results = []

    def record(step, trajs, adv):
        seen.append((step, len(trajs), len(adv.values) == sum(len(t.outputs()) for t in trajs)))

    for hook in (None, record):
        engine = get_engine("local")
        engine.sample_hook = hook
        results.append(engine.train(replace(cfg), guided_tiny_world))
    assert seen == [(1, 4, True), (2, 4, True)]  # the step's trajectories with one advantage per output
    plain, hooked = (r.models["policy"].state_dict() for r in results)
    assert all(torch.equal(plain[k], hooked[k]) for k in plain)
    assert [h.get("reward/mean") for h in results[0].history] == [h.get("reward/mean") for h in results[1].history]


@pytest.fixture(scope="module")
def guided_tiny_world():
    from envace.data.specs import episode_spec_from_task
    from envace.envs.toolworld import ToolWorldEnv

    env = ToolWorldEnv()
    tasks = [t for t in env.tasks("train") if len(t.user_turns) == 1][:2]
    return [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
