"""Config builder and launcher on CPU: our config → verl overrides that compose with verl's own Hydra config
(as ``main_ppo`` composes it) and pass verl's ``validate_config``; data preparation; commands; MLflow env."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envace.config.load import ConfigError, compose, hydra_value
from envace.engines.verl.config_builder import (
    VerlConfigError,
    build_overrides,
    compose_verl_config,
    loop_settings,
)
from envace.engines.verl.episodes import spec_from_json, spec_from_row, spec_to_json
from envace.engines.verl.launcher import (
    PLUGIN_MODULE,
    absolute_tracking_uri,
    launch_verl_training,
    multinode_commands,
    plan_launch,
    prepare_verl_data,
)
from envace.engines.verl.settings import LoopSettings


def plain_cfg(*overrides: str) -> dict:
    return OmegaConf.to_container(compose(list(overrides)), resolve=True)


def overrides_for(cfg: dict, out: Path) -> list[str]:
    return build_overrides(
        cfg,
        train_files=[str(out / "train.parquet")],
        val_files=[str(out / "val.parquet")],
        output_dir=out,
        model_path="/models/Qwen3-8B",
        env_vars={"MLFLOW_TRACKING_URI": "sqlite:////runs/mlflow.db", "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE},
    )


def test_paper_recipe_composes_and_passes_verl_validation(tmp_path: Path) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = plain_cfg("profile=paper")
    vc = compose_verl_config(overrides_for(cfg, tmp_path))
    validate_config(vc, use_reference_policy=need_reference_policy(vc), use_critic=need_critic(vc))
    actor, rollout = vc.actor_rollout_ref.actor, vc.actor_rollout_ref.rollout
    assert vc.algorithm.adv_estimator == "envace_rolewise" and vc.algorithm.norm_adv_by_std_in_grpo is False
    assert (rollout.n, vc.data.train_batch_size, actor.optim.lr) == (4, 16, 1e-6)
    assert actor.ppo_mini_batch_size == 32  # 16 prompts x 2 rows (ACT + REHEARSE): one update per step
    assert (vc.trainer.total_training_steps, vc.trainer.nnodes, vc.trainer.n_gpus_per_node) == (470, 2, 8)
    assert list(vc.trainer.logger) == ["console", "mlflow"] and vc.trainer.v1.trainer_mode == "envace"
    assert rollout.agent.default_agent_loop == "envace_act_rehearse" and rollout.calculate_log_probs
    assert (rollout.prompt_length + rollout.response_length, rollout.max_model_len) == (20480, 20480)
    assert actor.use_kl_loss is False and actor.loss_agg_mode == "token-mean" and actor.clip_ratio == 0.2
    assert not need_reference_policy(vc) and not need_critic(vc)
    # checkpoint / resume through verl's own checkpointing, under the stage's output directory
    assert (vc.trainer.save_freq, vc.trainer.resume_mode) == (5, "auto")  # train.checkpoint_every
    assert vc.trainer.default_local_dir == str(tmp_path.resolve() / "checkpoints")
    assert "hf_model" in actor.checkpoint.save_contents and "hf_model" not in actor.checkpoint.load_contents
    assert LoopSettings.from_mapping(OmegaConf.to_container(vc.envace)) == loop_settings(cfg)
    assert vc.envace.variant == "envace" and vc.envace.reward == "llm" and vc.envace.data_source == "cm2"
    assert dict(vc.ray_kwargs.ray_init.runtime_env.env_vars)["VERL_USE_EXTERNAL_MODULES"] == PLUGIN_MODULE


@pytest.mark.parametrize(
    ("algo", "estimator", "rows", "responses"),
    [
        ("grpo", "envace_grpo", 1, "executor"),
        ("frozen_rehearse", "envace_rolewise", 1, "policy"),
        ("frozen_act", "envace_rolewise", 2, "policy"),
    ],
)
def test_variants(tmp_path: Path, algo: str, estimator: str, rows: int, responses: str) -> None:
    cfg = plain_cfg(
        "profile=smoke", f"algo={algo}", "train.resume=false", "train.checkpoint_every=0", "algo.kl_coef=0.001"
    )
    vc = compose_verl_config(overrides_for(cfg, tmp_path))
    assert vc.algorithm.adv_estimator == estimator and vc.envace.responses == responses
    assert vc.actor_rollout_ref.actor.ppo_mini_batch_size == cfg["rollout"]["prompts_per_step"] * rows
    assert (vc.trainer.resume_mode, vc.trainer.save_freq) == ("disable", cfg["train"]["steps"])
    assert vc.actor_rollout_ref.actor.use_kl_loss is True and vc.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"


def test_unsupported_configurations_say_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(VerlConfigError, match="engine=local"):
        overrides_for(plain_cfg("profile=smoke", "algo=per_role"), tmp_path)
    with pytest.raises(VerlConfigError, match="model.kind=path"):
        plan_launch(plain_cfg("profile=smoke"), output_dir=tmp_path, dry_run=True)  # tiny: no directory


@pytest.mark.parametrize("algo", ["envace", "frozen_act"])
def test_trained_rehearse_rows_need_the_act_temperature(tmp_path: Path, algo: str) -> None:
    """verl scores every row at the ACT temperature: a different REHEARSE one is refused when REHEARSE trains."""
    cfg = plain_cfg("profile=smoke", f"algo={algo}", "rollout.act_temperature=1.0", "rollout.rehearse_temperature=0.5")
    with pytest.raises(VerlConfigError) as info:
        overrides_for(cfg, tmp_path)
    message = str(info.value)
    assert "rollout.rehearse_temperature=0.5" in message and "rollout.act_temperature=1.0" in message
    assert "engine=local" in message
    with pytest.raises(VerlConfigError, match="rollout.rehearse_temperature"):
        plan_launch(cfg, output_dir=tmp_path, dry_run=True)


def test_rehearse_temperature_may_differ_where_rehearse_rows_do_not_train(tmp_path: Path) -> None:
    """grpo / frozen_rehearse train no REHEARSE rows: the REHEARSE temperature only sets how responses are sampled."""
    for algo in ("grpo", "frozen_rehearse"):
        cfg = plain_cfg("profile=smoke", f"algo={algo}", "rollout.rehearse_temperature=0.5")
        vc = compose_verl_config(overrides_for(cfg, tmp_path))
        assert vc.envace.rehearse_temperature == 0.5 and vc.actor_rollout_ref.rollout.temperature == 1.0


def test_default_temperatures_pass_on_every_shipped_recipe(tmp_path: Path) -> None:
    """The shipped defaults (1.0 / 1.0, docs/method.md §8) do not trip the temperature check on any variant
    verl runs."""
    cm2_grpo = ("algo.grpo_responses=simulator", "engine.simulator.base_url=http://sim/v1", "engine.simulator.model=m")
    for profile in ("smoke", "cpu", "paper"):
        for algo in ("envace", "grpo", "frozen_act", "frozen_rehearse"):
            simulator = cm2_grpo if (profile, algo) == ("paper", "grpo") else ()  # CM2 has no real executor
            cfg = plain_cfg(f"profile={profile}", f"algo={algo}", "engine=verl", *simulator)
            assert cfg["rollout"]["act_temperature"] == cfg["rollout"]["rehearse_temperature"]
            overrides_for(cfg, tmp_path)


def test_hydra_values_round_trip_through_compose(tmp_path: Path) -> None:
    weird = 'it\'s a "model", with ${braces} and spaces: http://h:1/v1'
    cfg = plain_cfg("profile=smoke", f"judge.model={hydra_value(weird)}", "judge.name=llm")
    assert cfg["judge"]["model"] == weird
    vc = compose_verl_config(overrides_for(cfg, tmp_path))
    assert vc.envace.judge.model == weird and vc.envace.judge.timeout_s == 60.0
    assert vc.data.train_files == [str(tmp_path / "train.parquet")]
    assert [hydra_value(v) for v in (None, True, 3, 1e-06, "null", "a-b/c", [1, "x y"])] == [
        "null",
        "true",
        "3",
        "1e-06",
        "'null'",
        "a-b/c",
        "[1,'x y']",
    ]
    with pytest.raises(ConfigError, match="non-finite"):
        hydra_value(float("nan"))


def test_dry_run_prints_a_composable_command_and_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = plain_cfg("profile=smoke", "model.kind=path", f"model.path={tmp_path / 'model'}")
    out = tmp_path / "run"
    assert launch_verl_training(cfg, dry_run=True, output_dir=out, parent_run_id="abc123") == 0
    printed = capsys.readouterr().out
    assert "-m verl.trainer.main_ppo" in printed and "trainer.v1.trainer_mode=envace" in printed
    assert "trainer.logger=[console,mlflow,file]" in printed and not out.exists()
    plan = plan_launch(cfg, output_dir=out, dry_run=True, parent_run_id="abc123")
    assert plan.env_vars["MLFLOW_TRACKING_URI"] == absolute_tracking_uri("sqlite:///mlflow.db")
    assert plan.env_vars["MLFLOW_TRACKING_URI"].startswith("sqlite:////") and "MLFLOW_RUN_ID" not in plan.env_vars
    assert any("child run of abc123" in note for note in plan.notes)
    assert plan.env_vars["VERL_FILE_LOGGER_PATH"].startswith(str(out / "metrics"))
    commands = multinode_commands(plan.overrides, head="10.0.0.1")
    assert commands["head"].startswith("ray start --head") and "--address=10.0.0.1:6379" in commands["worker"]
    assert "ray job submit --address=http://10.0.0.1:8265" in commands["submit"]
    assert "-- python -m verl.trainer.main_ppo" in commands["submit"] and PLUGIN_MODULE in commands["submit"]


@pytest.fixture(scope="module")
def pipeline_files(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """prepare_data / template_prompts outputs in their real layout (tool world rows, ACT + REHEARSE records)."""
    from envace.engines.verl.episodes import write_dataset  # noqa: F401  (same parquet engine)
    from envace.envs.toolworld import generate_tasks, to_cm2_row
    from envace.stages.template_prompts import write_parquet

    root = tmp_path_factory.mktemp("pipeline")
    tasks = generate_tasks(seed=1, n_train=4, n_val=1, n_test=0)
    rows = {split: [to_cm2_row(t, include_state=True) for t in tasks[split]] for split in ("train", "val")}
    (root / "prepared").mkdir()
    (root / "prompts").mkdir()
    for split, split_rows in rows.items():
        (root / "prepared" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split_rows))
        records = []
        for row in split_rows:
            for role in ("ACT", "REHEARSE"):
                records.append(
                    {
                        "uuid": row["uuid"],
                        "role": role,
                        "turn": 0,
                        "index": len(records),
                        "n_tokens": 5,
                        "split": split,
                        "tools": row["tools"] if role == "ACT" else None,
                        "messages": [{"role": "user", "content": "x"}],
                    }
                )
        write_parquet(root / "prompts" / f"{split}.parquet", records, "toolworld")
    paths = {"prepared": str(root / "prepared"), "prompts": str(root / "prompts")}
    return {"root": root, "rows": rows, "paths": paths}


def test_prepare_verl_data_builds_one_row_per_instruction(pipeline_files: dict, tmp_path: Path) -> None:
    import pandas as pd

    cfg = plain_cfg("profile=smoke", "rollout.prompts_per_step=2")
    cfg["paths"].update(pipeline_files["paths"])
    keep = [r["uuid"] for r in pipeline_files["rows"]["train"][:3]]
    files = prepare_verl_data(cfg, tmp_path, uuids=keep)
    train = pd.read_parquet(files["train"])
    assert list(train["extra_info"].map(lambda e: e["uuid"])) == keep  # REHEARSE records are not instructions
    assert set(train["agent_name"]) == {"envace_act_rehearse"}
    first = pipeline_files["rows"]["train"][0]
    assert spec_from_json(train["envace_episode"][0]) == spec_from_row(first, "toolworld")
    assert json.loads(train["envace_row"][0]) == json.loads(json.dumps(first))
    assert len(pd.read_parquet(files["val"])) == 1
    with pytest.raises(VerlConfigError, match="prompts_per_step"):
        prepare_verl_data({**cfg, "rollout": {**cfg["rollout"], "prompts_per_step": 4}}, tmp_path, uuids=keep)


def test_verl_dataset_reads_our_parquet(pipeline_files: dict, tmp_path: Path) -> None:
    """verl's own RLHFDataset passes our columns through to the agent loop's kwargs."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from envace.models import build_tiny_tokenizer

    cfg = plain_cfg("profile=smoke", "rollout.prompts_per_step=2")
    cfg["paths"].update(pipeline_files["paths"])
    files = prepare_verl_data(cfg, tmp_path)
    overrides = overrides_for(cfg, tmp_path)
    data_config = compose_verl_config(overrides).data
    dataset = RLHFDataset([str(files["train"])], build_tiny_tokenizer(), data_config, max_samples=-1)
    item = dataset[0]
    assert item["agent_name"] == "envace_act_rehearse" and item["raw_prompt"][-1]["role"] == "user"
    assert spec_from_json(item["envace_episode"]).user_turns[0] == item["raw_prompt"][-1]["content"]


def test_spec_json_round_trip_for_cm2_rows() -> None:
    from envace.data.specs import to_episode_spec

    sample = Path(__file__).resolve().parents[4] / "shared" / "data" / "cm2" / "checklist_annotated_sample.json"
    if not sample.is_file():
        pytest.skip(f"no public CM2 sample at {sample}")
    rows = json.loads(sample.read_text())
    spec = to_episode_spec(rows[0])
    assert spec_from_json(json.dumps(spec_to_json(spec))) == spec


def test_engine_is_registered_and_reads_step_metrics(tmp_path: Path) -> None:
    from envace.engines import get_engine
    from envace.engines.verl.engine import VerlEngine, latest_hf_weights, read_step_metrics

    assert isinstance(get_engine("verl"), VerlEngine)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "a.jsonl").write_text('{"step": 1, "data": {"actor/loss": 0.5, "x": "s"}}\n')
    (tmp_path / "metrics" / "b.jsonl").write_text(
        '{"step": 1, "data": {"actor/loss": 0.25}}\n{"step": 2, "data": {"actor/loss": 0.125}}\n'
    )
    assert read_step_metrics(tmp_path / "metrics") == {1: {"actor/loss": 0.25}, 2: {"actor/loss": 0.125}}
    for step in (5, 10, 15):
        hf = tmp_path / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text("{}")
        if step < 15:  # verl writes config + tokenizer always, the weights only with hf_model
            (hf / "model.safetensors").write_bytes(b"")
    assert latest_hf_weights(tmp_path).parent.parent.name == "global_step_10"


@pytest.mark.slow
def test_mlflow_child_run_under_the_parent(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from envace.engines.verl.launcher import finish_child_run, mlflow_env

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("envace")).info.run_id
    env, _ = mlflow_env(plain_cfg("profile=smoke"), tracking_uri=uri, parent_run_id=parent, create=True)
    child = client.get_run(env["MLFLOW_RUN_ID"])
    assert child.data.tags["mlflow.parentRunId"] == parent and env["MLFLOW_TRACKING_URI"] == uri
    finish_child_run(env, returncode=3)
    assert client.get_run(env["MLFLOW_RUN_ID"]).info.status == "FAILED"


def test_cli_dry_run_and_multinode_scripts(pipeline_files: dict, tmp_path: Path, capsys) -> None:
    from envace.engines.verl.engine import VerlEngine, VerlEngineConfig
    from envace.engines.verl.launcher import main

    cfg = plain_cfg(
        "profile=smoke",
        "model.kind=path",
        f"model.path={tmp_path / 'model'}",
        "tracking=none",
        "rollout.prompts_per_step=2",
    )
    cfg["paths"].update(pipeline_files["paths"])
    params = tmp_path / "params.yaml"
    OmegaConf.save(OmegaConf.create(cfg), params)
    assert (
        main(
            [
                "--params",
                str(params),
                "--dry-run",
                "--output-dir",
                str(tmp_path / "dry"),
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
            ]
        )
        == 0
    )
    assert "gpu_memory_utilization=0.5" in capsys.readouterr().out.strip().split(" ")[-1]
    assert main(["--params", str(params), "--multinode", "10.0.0.1", "--output-dir", str(tmp_path / "mn")]) == 0
    assert (tmp_path / "mn" / "data" / "train.parquet").is_file()
    submit = (tmp_path / "mn" / "submit.sh").read_text()
    assert "ray job submit --address=http://10.0.0.1:8265" in submit and "trainer.v1.trainer_mode=envace" in submit
    result = VerlEngine().train(
        VerlEngineConfig(cfg=cfg, output_dir=str(tmp_path / "engine"), dry_run=True),
        [spec_from_row(r, "toolworld") for r in pipeline_files["rows"]["train"]],
    )
    assert result.steps_done == 0 and result.checkpoint_dir == str((tmp_path / "engine" / "checkpoints").resolve())


def test_multinode_creates_metrics_dir(pipeline_files: dict, tmp_path: Path) -> None:
    """``--multinode`` creates ``<out>/metrics/`` (verl's file logger does not), and its submit.sh runs once:
    a second submission would truncate the first run's metrics file, so it is refused."""
    from envace.engines.verl.launcher import main

    cfg = plain_cfg("profile=smoke", "model.kind=path", f"model.path={tmp_path / 'model'}", "tracking=none")
    cfg["rollout"]["prompts_per_step"] = 2
    cfg["paths"].update(pipeline_files["paths"])
    params, out = tmp_path / "params.yaml", tmp_path / "mn"
    OmegaConf.save(OmegaConf.create(cfg), params)
    assert main(["--params", str(params), "--multinode", "10.0.0.1", "--output-dir", str(out)]) == 0
    assert (out / "metrics").is_dir(), "verl's file logger opens <out>/metrics/<launch>.jsonl without creating it"
    submit = (out / "submit.sh").read_text()
    metrics = Path(submit.split("VERL_FILE_LOGGER_PATH=", 1)[1].split()[0].strip("'\""))
    assert metrics.parent == out / "metrics"
    fake_bin, calls = tmp_path / "bin", tmp_path / "ray_calls.txt"
    fake_bin.mkdir()
    (fake_bin / "ray").write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    (fake_bin / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    first = subprocess.run(["bash", str(out / "submit.sh")], env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0 and calls.read_text().startswith("job submit"), first.stderr
    metrics.write_text('{"step": 1, "data": {"actor/loss": 0.5}}\n')  # what the first run's file logger wrote
    again = subprocess.run(["bash", str(out / "submit.sh")], env=env, capture_output=True, text=True, check=False)
    assert again.returncode != 0 and str(metrics) in again.stderr and "--multinode" in again.stderr
    assert metrics.read_text() == '{"step": 1, "data": {"actor/loss": 0.5}}\n'
    assert len(calls.read_text().splitlines()) == 1, "the second submission reached ray"


def test_config_may_come_as_dict_dictconfig_or_dataclass(tmp_path: Path) -> None:
    composed = compose(["profile=paper"])
    as_dict = overrides_for(OmegaConf.to_container(composed, resolve=True), tmp_path)
    assert overrides_for(composed, tmp_path) == as_dict
    assert overrides_for(OmegaConf.to_object(composed), tmp_path) == as_dict


def test_lora_maps_to_verl_fsdp_model_keys(tmp_path: Path) -> None:
    """Composes in verl's struct config (verl's validate_config checks a LoRA rank against vLLM's, which needs vllm)."""
    full = compose_verl_config(overrides_for(plain_cfg("profile=paper"), tmp_path)).actor_rollout_ref.model
    assert full.lora_rank == 0 and full.target_modules == "all-linear"  # full fine-tuning: verl's defaults
    cfg = plain_cfg(
        "profile=paper", "algo.lora_rank=32", "algo.lora_alpha=64", "algo.lora_target_modules=[q_proj,v_proj]"
    )
    model = compose_verl_config(overrides_for(cfg, tmp_path)).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (32, 64, ["q_proj", "v_proj"])
    with pytest.raises(VerlConfigError, match="algo.lora_dropout"):
        overrides_for(plain_cfg("profile=paper", "algo.lora_rank=8", "algo.lora_dropout=0.1"), tmp_path)
    with pytest.raises(VerlConfigError, match="algo.lora_rank"):
        overrides_for(plain_cfg("profile=paper", "algo.lora_rank=-1"), tmp_path)
