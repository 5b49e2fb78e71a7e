"""verl's real agent-loop worker on CPU, through the ``envace`` trainer's step up to the FSDP update (issue 43, 8).

What runs, all verl 0.9.1's own code unless marked:

- a local Ray (127.0.0.1, 4 logical CPUs: with 2, ``tq.init()`` waits forever for its storage actors) and a real
  TransferQueue (``tq.init(config.transfer_queue)``, as ``TaskRunnerV1.run`` does);
- ``EnvacePPOTrainer(config)`` with its real tokenizer and data loader (``_init_tokenizer``, ``_init_dataloader``:
  ``RLHFDataset`` over the parquet ``envace.engines.verl.episodes`` writes) and its sync replay buffer;
- ``AgentLoopManagerTQ.create`` starting one ``AgentLoopWorkerTQ`` Ray actor, which instantiates the
  ``envace_act_rehearse`` loop registered by the plugin in that process. Stand-in: the LLM server client,
  ``ScriptedTokenClient`` (tests/verl_scripted_client.py: scripted token ids, log-prob -0.25 each, one aborted
  request), in place of vLLM;
- the trainer's step: ``prepare_step`` (data loader → TransferQueue → workers), ``replay_buffer.sample``,
  ``_balance_batch`` (envace's fatal-row check, then verl's upsampling with padding rows and its sequence-length
  balancing; stand-in: the actor worker group's dispatch info, 4 data-parallel ranks), ``_compute_old_log_prob``
  in verl's bypass mode (old = rollout log-probs: the recomputation needs the FSDP actor), ``_compute_advantage``;
  and, at the end, a row flagged by the agent loop's judge budget (``run_failure.FATAL_KEY``) stops ``_balance_batch``;
- the actor's data preparation as ``update_actor`` receives it: the batch split over the data-parallel ranks
  (``_split_args_kwargs_data_proto``), fetched from TransferQueue (``transferqueue_utils._meta_to_realdata``, what
  ``tqbridge`` does in the worker), cut into mini-batches (``tu.make_iterator``, as ``train_mini_batch``) and into
  token-budgeted micro-batches (``prepare_micro_batches``, as the engine's ``train_batch``).

Where it stops, and why: the next call is the FSDP engine's forward/backward (``FSDPEngine.train_batch`` →
``forward_backward_batch``), which needs a model sharded by FSDP over an initialised process group on a device
platform; verl 0.9.1 has no CPU platform for it, so the update itself (and the actor's log-prob recomputation that
bypass mode skips) stays GPU-only (``scripts/gpu_smoke.sh verl``).

Plan: two prompts (uids ``g1``, ``g2``; rollout.n = 2) of one tool-world task. g1: a gold trajectory (R = 1, an ACT
and a REHEARSE row) and a reply-only one (R = 0.5, one ACT row); g2: a gold one and one whose first request the server
aborts (excluded: mask 0, out of every baseline). 6 rows, padded by verl to 8.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from envace.config.load import compose
from envace.core.advantages import compute_rolewise_advantages
from envace.core.records import NO_ROLE, Role
from envace.engines.verl.config_builder import build_overrides, compose_verl_config
from envace.engines.verl.rows import EXCLUDE_KEY, NUM_OUTPUTS_KEY, ROLE_IDS_KEY, ROLE_KEY, TRAJECTORY_KEY
from envace.engines.verl.run_failure import FATAL_KEY
from envace.judges.budget import JudgeFailureBudgetExceeded

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DP_RANKS = 4
UIDS = ("g1", "g2")
N = 2


def tiny_model_dir(out: Path) -> Path:
    from envace.models import ModelSpec, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    path = out / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_data(out: Path) -> tuple[Path, Any, dict]:
    """One one-call tool-world task, twice (two prompts), in verl's parquet; returns (file, spec, row)."""
    from envace.engines.verl.episodes import dataset_record, spec_from_row, write_dataset
    from envace.envs.toolworld import generate_tasks, to_cm2_row

    tasks = generate_tasks(seed=0, n_train=12, n_val=0, n_test=0)["train"]
    task = next(t for t in tasks if len(t.user_turns) == 1 and len(t.gold_calls[0]) == 1)
    row = to_cm2_row(task, include_state=True)
    spec = spec_from_row(row, "toolworld")
    path = out / "train.parquet"
    write_dataset(path, [dataset_record(spec, i, "train", "toolworld", row) for i in range(len(UIDS))])
    return path, spec, row


def verl_config(out: Path, model: Path, data: Path) -> Any:
    cfg = OmegaConf.to_container(
        compose(
            [
                "profile=smoke",
                "tracking=none",
                "rollout.max_act_tokens=160",
                "rollout.max_rehearse_tokens=160",
                "rollout.max_stream_tokens=4096",
                "rollout.max_prompt_tokens=2048",
                f"rollout.prompts_per_step={len(UIDS)}",
                f"rollout.samples_per_prompt={N}",
            ]
        ),
        resolve=True,
    )
    overrides = build_overrides(
        cfg, train_files=[str(data)], val_files=[str(data)], output_dir=out, model_path=str(model)
    )
    overrides += [
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "algorithm.rollout_correction.bypass_mode=true",  # old log-probs = rollout log-probs (no FSDP actor here)
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    ]
    config = compose_verl_config(overrides)
    with open_dict(config):
        config.transfer_queue.enable = True  # what TaskRunnerV1.run sets
    OmegaConf.resolve(config)
    return config


def scripts(model: Path, spec: Any) -> dict[str, list]:
    """Token scripts per request id ``{uid}_{session}-{role}`` (module docstring's plan)."""
    from transformers import AutoTokenizer
    from verl_hf_server import gold_texts
    from verl_scripted_client import aborted

    from envace.engines.verl.agent_loop import chat_formatter

    formatter = chat_formatter(AutoTokenizer.from_pretrained(model), "auto")
    eot = formatter.end_of_turn_token_ids[0]

    def encode(texts: list[str]) -> list[list[int]]:
        return [formatter.encode(text) + [eot] for text in texts]

    gold = gold_texts(spec)
    act, rehearse = encode(gold["act"]), encode(gold["rehearse"])
    return {
        "g1_0-act": act,
        "g1_0-rehearse": rehearse,
        "g1_1-act": encode([spec.gold_answers[0]]),
        "g2_0-act": act,
        "g2_0-rehearse": rehearse,
        "g2_1-act": [aborted(act[0][:5])],
    }


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch):
    """A Ray on 127.0.0.1 with 4 logical CPUs whose workers import this tree's envace (and the tests' helpers), in a
    temp directory of its own, removed afterwards. Token authentication off: with RAY_AUTH_MODE unset, Ray 2.60's
    ``ray.init`` writes ~/.ray/auth_token, which later local Ray heads on the machine would pick up."""
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must stay under 107 chars
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        "VERL_USE_EXTERNAL_MODULES": "envace.engines.verl.plugin",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    ray.init(
        address="local",
        num_cpus=4,
        num_gpus=0,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": env},
        log_to_driver=False,
        _temp_dir=temp,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def expected_advantages(rows: dict[str, dict]) -> dict[str, float]:
    """``compute_rolewise_advantages`` over every output of the non-excluded rows: {row key: A}."""
    rewards, groups, roles, trajectories, keys = [], [], [], [], []
    for key, row in rows.items():
        extra = row["extra_fields"]
        if extra[EXCLUDE_KEY]:
            continue
        for _ in range(extra[NUM_OUTPUTS_KEY]):
            rewards.append(float(row["rm_scores"].sum()))
            groups.append(row["uid"])
            roles.append(extra[ROLE_KEY])
            trajectories.append(extra[TRAJECTORY_KEY])
            keys.append(key)
    adv = compute_rolewise_advantages(torch.tensor(rewards), groups, roles, trajectory_ids=trajectories)
    return dict(zip(keys, adv.tolist()))


def test_verl_agent_loop_worker_on_cpu(tmp_path: Path, local_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    import transfer_queue as tq
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    from transfer_queue import KVBatchMeta
    from verl.single_controller.base.decorator import _split_args_kwargs_data_proto
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.utils.transferqueue_utils import _meta_to_realdata
    from verl.workers.engine.utils import prepare_micro_batches
    from verl_scripted_client import LOGPROB, ScriptedTokenClient

    from envace.engines.verl.trainer import EnvacePPOTrainer

    started = time.time()
    model = tiny_model_dir(tmp_path)
    data, spec, _ = write_data(tmp_path)
    config = verl_config(tmp_path, model, data)
    names = iter(UIDS)  # the trainer names prompts by uuid4: fixed names, so the scripts can address them
    monkeypatch.setattr(trainer_base, "uuid", SimpleNamespace(uuid4=lambda: next(names)))

    tq.init(config.transfer_queue)
    try:
        trainer = EnvacePPOTrainer(config=config)
        trainer._init_tokenizer()
        trainer._init_dataloader()
        trainer.global_steps = 1
        client = ScriptedTokenClient(scripts(model, spec), global_steps=1)
        trainer.agent_loop_manager = AgentLoopManagerTQ.create(
            config=config, llm_client=client, teacher_client=None, reward_loop_worker_handles=None
        )
        trainer.prepare_step()  # the step's prompts: data loader -> TransferQueue -> the agent-loop worker
        batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=len(UIDS))
        real_keys = list(batch.keys)
        assert sorted(real_keys) == sorted(["g1_0_0", "g1_0_1", "g1_1_0", "g2_0_0", "g2_0_1", "g2_1_0"])

        # the actor worker group's dispatch info (stand-in): 4 data-parallel ranks
        trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(DP_RANKS))})
        metrics: dict = {}
        batch = trainer._balance_batch(batch, metrics=metrics)
        pad_keys = [k for k in batch.keys if k not in real_keys]
        assert len(batch) == 8 and len(pad_keys) == 2
        assert all(tag.get("is_padding", False) == (key in pad_keys) for key, tag in zip(batch.keys, batch.tags))
        batch = trainer._compute_old_log_prob(batch, metrics=metrics)
        batch = trainer._compute_advantage(batch, metrics=metrics)

        rows = tq.kv_batch_get(keys=batch.keys, partition_id="train")
        by_key = {key: rows[i] for i, key in enumerate(batch.keys)}
        stored = {key: _row_dict(by_key[key]) for key in real_keys}
        check_rows(stored, spec)
        expected = expected_advantages(stored)
        assert expected["g1_0_1"] == pytest.approx(1 / 6) and expected["g1_1_0"] == pytest.approx(-1 / 3)
        assert expected["g2_0_1"] == pytest.approx(0.0)  # the aborted trajectory is in no baseline
        for key, row in stored.items():
            mask = row["response_mask"].bool()
            want = 0.0 if row["extra_fields"][EXCLUDE_KEY] else expected[key]
            assert torch.allclose(row["advantages"][mask], torch.full_like(row["advantages"][mask], want)), key
            assert torch.all(row["advantages"][~mask] == 0) and torch.equal(row["returns"], row["advantages"])
            assert torch.equal(row["old_log_probs"], row["rollout_log_probs"])
        for key in pad_keys:  # verl's padding rows: one masked token, no reward, no advantage
            pad = _row_dict(by_key[key])
            assert pad["response_mask"].sum() == 0 and pad["rm_scores"].sum() == 0
            assert torch.all(pad["advantages"] == 0) and torch.all(pad["returns"] == 0)
        assert metrics["envace/act/rows"] == 3 and metrics["envace/rehearse/rows"] == 2
        assert metrics["envace/act/outputs"] == 5 and metrics["envace/excluded_rows"] == 1

        # the actor's data preparation, as update_actor receives the batch (module docstring)
        mini = config.actor_rollout_ref.actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n
        batch.extra_info.update(
            {"mini_batch_size": mini, "epochs": 1, "seed": 0, "dataloader_kwargs": {"shuffle": False}}
        )
        (per_rank,), _ = _split_args_kwargs_data_proto(DP_RANKS, batch)
        seen: list[tuple[str, float]] = []
        for meta in per_rank:
            data = _meta_to_realdata(meta)
            per_gpu = tu.pop(data, key="mini_batch_size") // DP_RANKS
            for key in ("epochs", "seed", "dataloader_kwargs"):
                tu.pop(data, key=key)
            for mini_batch in tu.make_iterator(data, mini_batch_size=per_gpu, epochs=1, seed=0):
                tu.assign_non_tensor(
                    mini_batch,
                    use_dynamic_bsz=True,
                    max_token_len_per_gpu=config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu,
                )
                micro_batches, _ = prepare_micro_batches(mini_batch)
                for micro in micro_batches:
                    for i in range(len(micro)):
                        uid, session = micro["uid"][i], micro["session_id"][i]
                        adv, mask = micro["advantages"][i], micro["response_mask"][i].bool()
                        lps = micro["old_log_probs"][i]
                        assert adv.shape == mask.shape == lps.shape == micro["responses"][i].shape
                        assert torch.all(adv[~mask] == 0)
                        seen.append((f"{uid}_{session}", float(adv[mask].sum())))
                        if mask.any():
                            assert torch.allclose(lps[mask], torch.full_like(lps[mask], LOGPROB))
        assert len(seen) == 8, seen  # every row, padding included, reached a micro-batch
        assert sorted(t for t, _ in seen if not t.startswith("pad")) == sorted(k.rsplit("_", 1)[0] for k in real_keys)
        total = sum(v * int(stored[k]["response_mask"].sum()) for k, v in expected.items())
        assert sum(v for _, v in seen) == pytest.approx(total, abs=1e-4)

        # a row flagged by the agent loop (judge budget spent: run_failure) stops the step, through the real TQ
        flagged = {**stored["g1_1_0"]["extra_fields"], FATAL_KEY: "judge failure budget exhausted: 5 of the last 5"}
        tq.kv_batch_put(
            keys=["g1_1_0"], partition_id="train", fields=list_of_dict_to_tensordict([{"extra_fields": flagged}])
        )
        with pytest.raises(JudgeFailureBudgetExceeded, match="5 of the last 5"):
            trainer._balance_batch(KVBatchMeta(keys=real_keys, tags=[{}] * len(real_keys), partition_id="train"), {})
    finally:
        tq.close()
    print(f"test_verl_agent_loop_worker_on_cpu: {time.time() - started:.1f} s")


def _row_dict(row: Any) -> dict[str, Any]:
    """One TransferQueue row as {field: tensor or python value}."""
    out = {}
    for key in row.keys():
        value = row[key]
        out[key] = value.data if hasattr(value, "data") and not isinstance(value, torch.Tensor) else value
    return out


def check_rows(rows: dict[str, dict], spec: Any) -> None:
    """Rows, masks, role ids, trajectory ids, rewards and exclusions of the plan (module docstring)."""
    for key, row in rows.items():
        extra, mask = row["extra_fields"], row["response_mask"]
        uid, session, index = key.split("_")
        assert row["uid"] == uid and extra[TRAJECTORY_KEY] == f"{uid}_{session}"
        assert len(extra[ROLE_IDS_KEY]) == mask.shape[0] == row["responses"].shape[0]
        role_ids = torch.tensor(extra[ROLE_IDS_KEY])
        assert torch.equal(role_ids != NO_ROLE, mask.bool()), key
        assert set(role_ids[mask.bool()].tolist()) <= {extra[ROLE_KEY]}, key  # one role per row
    gold_rows = ("g1_0", "g2_0")
    for trajectory in gold_rows:
        reh, act = rows[f"{trajectory}_0"], rows[f"{trajectory}_1"]  # the ACT row last
        assert reh["extra_fields"][ROLE_KEY] == int(Role.REHEARSE) and act["extra_fields"][ROLE_KEY] == int(Role.ACT)
        assert act["extra_fields"][NUM_OUTPUTS_KEY] == 2 and reh["extra_fields"][NUM_OUTPUTS_KEY] == 1
        for row in (reh, act):
            assert float(row["rm_scores"].sum()) == 1.0 and row["extra_fields"][EXCLUDE_KEY] is False
    reply = rows["g1_1_0"]
    assert reply["extra_fields"][ROLE_KEY] == int(Role.ACT) and float(reply["rm_scores"].sum()) == pytest.approx(0.5)
    cut = rows["g2_1_0"]
    assert cut["extra_fields"][EXCLUDE_KEY] is True and cut["response_mask"].sum() == 0
    assert cut["extra_fields"]["reward_extra_info"]["envace_aborted"] == 1.0
