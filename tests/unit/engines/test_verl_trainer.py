"""The ``envace`` trainer mode: role ids etc. from the agent loop's rows reach the role-wise estimator.

Rows come from the real agent loop (tiny model, scripted gold/short trajectories) and are stored the way
verl's TransferQueue worker stores them (``AgentLoopOutput.as_dict()`` + uid, packed with verl's own
``list_of_dict_to_tensordict``) in a small in-memory key-value store standing in for TransferQueue
(the trainer only calls ``kv_batch_get`` / ``kv_batch_put``). ``EnvacePPOTrainer._compute_advantage``
then runs unchanged; its advantages are compared with ``compute_rolewise_advantages`` on the outputs.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from test_verl_agent_loop import build_world, gold_texts, play

from envace.core.advantages import compute_rolewise_advantages
from envace.core.records import NO_ROLE, Role
from envace.engines.verl.rows import ROLE_KEY, row_inputs


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_world(tmp_path_factory.mktemp("verl"))


class MemoryKV:
    """The two TransferQueue calls the trainer makes, over a dict of rows (one dict per key)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> Any:
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        present = [f for f in select_fields if all(f in self.rows[k] for k in keys)]
        return list_of_dict_to_tensordict([{f: self.rows[k][f] for f in present} for k in keys])

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> Any:
        for i, key in enumerate(keys):
            for name in fields.keys():  # noqa: SIM118 - a TensorDict, not a dict
                self.rows[key][name] = fields[name][i]
        return self._meta(keys, partition_id)

    @staticmethod
    def _meta(keys: list[str], partition_id: str) -> Any:
        from transfer_queue import KVBatchMeta

        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id)


def store_rows(kv: MemoryKV, uid: str, session: int, outputs: list) -> list[str]:
    keys = []
    for index, output in enumerate(outputs):
        field = output.as_dict()
        field["uid"] = uid
        field["old_log_probs"] = field["rollout_log_probs"].clone()
        key = f"{uid}_{session}_{index}"
        kv.rows[key] = field
        keys.append(key)
    return keys


def add_padding_row(kv: MemoryKV, like: str) -> str:
    """What verl's upsampling appends: a copy of a real row with a 1-token, mask-0 response."""
    row = dict(kv.rows[like])
    row.update(
        responses=torch.tensor([0]),
        response_mask=torch.tensor([0]),
        rm_scores=torch.tensor([0.0]),
        rollout_log_probs=torch.tensor([0.0]),
        old_log_probs=torch.tensor([0.0]),
    )
    kv.rows["padding_0_0"] = row
    return "padding_0_0"


@pytest.fixture(scope="module")
def batch(world: dict) -> dict:
    """g1: a gold trajectory (R=1) and a reply-only one (R=0.5); g2: two gold ones (R=1)."""
    kv = MemoryKV()
    gold, spec = gold_texts(world["spec"]), world["spec"]
    plan = [("g1", 0, gold), ("g1", 1, {"act": [spec.gold_answers[0]]}), ("g2", 0, gold), ("g2", 1, gold)]
    keys, outputs = [], []
    for uid, session, script in plan:
        rows, _, _ = play(world, scripts=script, uid=uid, session=session)
        keys += store_rows(kv, uid, session, rows)
        outputs.append(rows)
    keys.append(add_padding_row(kv, keys[0]))
    return {"kv": kv, "keys": keys, "outputs": outputs}


def trainer_with(world: dict, kv: MemoryKV, monkeypatch: pytest.MonkeyPatch, **envace: Any) -> Any:
    import envace.engines.verl.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "tq", kv)
    trainer = trainer_module.EnvacePPOTrainer.__new__(trainer_module.EnvacePPOTrainer)
    trainer.config = OmegaConf.merge(world["verl"], {"envace": envace}) if envace else world["verl"]
    return trainer


def expected_advantages(batch: dict, baseline: str) -> dict[tuple[str, int, int], float]:
    """compute_rolewise_advantages over every output: {(uid, session, role): A}."""
    rewards, groups, roles, trajs, names = [], [], [], [], []
    for (uid, session), rows in zip([("g1", 0), ("g1", 1), ("g2", 0), ("g2", 1)], batch["outputs"]):
        for row in rows:
            for _ in range(row.extra_fields["envace_num_outputs"]):
                rewards.append(row.reward_score)
                groups.append(uid)
                roles.append(row.extra_fields[ROLE_KEY])
                trajs.append(f"{uid}_{session}")
                names.append((uid, session, row.extra_fields[ROLE_KEY]))
    adv = compute_rolewise_advantages(torch.tensor(rewards), groups, roles, baseline=baseline, trajectory_ids=trajs)
    return dict(zip(names, adv.tolist()))


@pytest.mark.parametrize("baseline", ["output_mean", "trajectory_mean"])
def test_compute_advantage_uses_roles_from_the_rows(
    world: dict, batch: dict, baseline: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = batch["kv"]
    trainer = trainer_with(world, kv, monkeypatch, baseline=baseline)
    metrics: dict = {}
    trainer._compute_advantage(MemoryKV._meta(batch["keys"], "train"), metrics)
    expected = expected_advantages(batch, baseline)
    if baseline == "output_mean":  # g1 ACT: outputs {1, 1, 0.5} → μ = 5/6; g1 REHEARSE: a single output → 0
        assert expected[("g1", 0, int(Role.ACT))] == pytest.approx(1 / 6)
        assert expected[("g1", 1, int(Role.ACT))] == pytest.approx(-1 / 3)
    else:  # one member per trajectory: μ = 0.75
        assert expected[("g1", 0, int(Role.ACT))] == pytest.approx(0.25)
    for key in batch["keys"][:-1]:
        row = kv.rows[key]
        uid, session, _ = key.rsplit("_", 2)
        mask = row["response_mask"].bool()
        adv = row["advantages"]
        want = expected[(uid, int(session), row["extra_fields"][ROLE_KEY])]
        assert torch.allclose(adv[mask], torch.full_like(adv[mask], want), atol=1e-6), key
        assert torch.all(adv[~mask] == 0) and torch.equal(row["returns"], adv)
    assert torch.all(kv.rows[batch["keys"][-1]]["advantages"] == 0)  # the padding row
    assert metrics["envace/act/rows"] == 4 and metrics["envace/rehearse/rows"] == 3
    assert metrics["envace/act/outputs"] == 7 and metrics["envace/excluded_rows"] == 0


def test_kl_in_reward_is_refused(world: dict, batch: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = trainer_with(world, batch["kv"], monkeypatch)
    trainer.config = OmegaConf.merge(trainer.config, {"algorithm": {"use_kl_in_reward": True}})
    with pytest.raises(ValueError, match="use_kl_loss"):
        trainer._compute_advantage(MemoryKV._meta(batch["keys"], "train"), {})


def test_trainer_mode_behaves_as_sync(world: dict) -> None:
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    cls = get_trainer_cls("envace")
    assert cls.__name__ == "EnvacePPOTrainer" and get_trainer_cls("sync").__name__ == "PPOTrainerSync"
    trainer = cls(config=OmegaConf.create(OmegaConf.to_container(world["verl"], resolve=True)))
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer


# Where verl 0.9.1 reads the *configured* mode name (``trainer.v1.trainer_mode``, "envace" for us): once to pick the
# trainer class (main_ppo), once into ``self.trainer_mode`` (PPOTrainer.__init__, which EnvacePPOTrainer renames to
# "sync" before anything compares it), and in rollout_skip's optional per-mode lookup (default 1 = sync's value).
MODE_READS = {"trainer/main_ppo.py": 1, "trainer/ppo/v1/trainer_base.py": 1, "utils/skip/rollout_skip.py": 1}
_MODE_READ = re.compile(r"v1\.trainer_mode\b|v1\.get\(\s*[\"']trainer_mode")


def test_envace_mode_renames_itself_to_sync_before_verl_reads_it(world: dict) -> None:
    """Pins the verl internals the ``envace`` mode relies on: a verl upgrade that changes them fails here, by name,
    instead of silently running the async code paths (or crashing) in a GPU job."""
    import verl
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    port = (
        f"verl {verl.__version__}: the envace trainer mode (envace/engines/verl/trainer.py) renames itself to 'sync' "
        "in _build_replay_buffer because verl compares the mode *name*; port that trick before moving the verl pin"
    )
    init = inspect.getsource(PPOTrainer.__init__)
    set_at, built_at = init.find("self.trainer_mode = "), init.find("self._build_replay_buffer()")
    assert 0 <= set_at < built_at, f"PPOTrainer.__init__ no longer sets trainer_mode before the replay buffer. {port}"
    root = Path(verl.__file__).parent
    reads = {}
    for path in root.rglob("*.py"):
        found = len(_MODE_READ.findall(path.read_text(encoding="utf-8")))
        if found:
            reads[path.relative_to(root).as_posix()] = found
    assert reads == MODE_READS, f"verl reads trainer.v1.trainer_mode in new places {reads}. {port}"
    trainer = get_trainer_cls("envace")(config=OmegaConf.create(OmegaConf.to_container(world["verl"], resolve=True)))
    assert trainer.trainer_mode == "sync", f"the rename did not stick (trainer_mode={trainer.trainer_mode!r}). {port}"
    assert type(trainer.replay_buffer) is ReplayBuffer and trainer.replay_buffer.trainer_mode == "sync", port
    assert trainer.parameter_sync_step == 1, f"sync mode updates weights every step. {port}"


def test_row_inputs_fallbacks_and_errors() -> None:
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    extras = [
        {ROLE_KEY: 1, "envace_role_ids": [1, 1, NO_ROLE, 1], "envace_trajectory_id": "t0", "envace_num_outputs": 2},
        {ROLE_KEY: 0, "envace_role_ids": [0] * 9},  # padding copy: list longer than the row
        {ROLE_KEY: 0},  # no per-token list: the row's role on its generated tokens
    ]
    inputs = row_inputs(extras, ["a_0_0", "pad_0_0", "b_3_1"], mask)
    assert inputs.role_ids.tolist() == [[1, 1, NO_ROLE, 1], [NO_ROLE] * 4, [0, NO_ROLE, NO_ROLE, NO_ROLE]]
    assert inputs.trajectory_ids == ["t0", "pad_0", "b_3"] and inputs.outputs_per_row.tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="default_agent_loop=envace_act_rehearse"):
        row_inputs([{}], ["k_0_0"], torch.tensor([[1]]))
