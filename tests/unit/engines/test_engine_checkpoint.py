"""Checkpoints: round trip of weights/optimiser/RNG, atomic writes, pruning; seeded data order."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from envace.engines.local import step_examples
from envace.engines.local.checkpoint import (
    CorruptCheckpointError,
    list_checkpoints,
    load_latest,
    save_checkpoint,
)

torch.set_num_threads(1)


def _model_and_opt(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def test_round_trip_weights_optimizer_rng(tmp_path):
    model, opt = _model_and_opt()
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    save_checkpoint(tmp_path, 3, {"policy": model}, {"policy": opt}, {"data_position": 6})
    expected = (torch.rand(3), random.random(), np.random.rand())
    ckpt = load_latest(tmp_path)
    assert ckpt.step == 3 and ckpt.state["data_position"] == 6 and ckpt.model_names() == ["policy"]
    other, other_opt = _model_and_opt(seed=1)
    other.load_state_dict(ckpt.model_state("policy"))
    other_opt.load_state_dict(ckpt.optimizer_state("policy"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert torch.equal(other_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    ckpt.restore_rng()
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt = _model_and_opt()
    save_checkpoint(tmp_path, 1, {"policy": model}, {"policy": opt}, {})

    def crash(src, dst):
        raise OSError("killed while renaming")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, {"policy": model}, {"policy": opt}, {})
    monkeypatch.undo()
    assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # the partial write is left behind…
    assert load_latest(tmp_path).step == 1  # …and ignored
    (tmp_path / "step_00000005").mkdir()  # a directory without state.json is not a checkpoint
    assert load_latest(tmp_path).step == 1
    save_checkpoint(tmp_path, 2, {"policy": model}, {"policy": opt}, {})
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # cleaned by the next save
    assert load_latest(tmp_path).step == 2


def test_pruning_keeps_newest(tmp_path):
    model, opt = _model_and_opt()
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, {"policy": model}, {"policy": opt}, {}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    assert load_latest(tmp_path).step == 4
    assert load_latest(tmp_path / "missing") is None


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_corrupt_checkpoint_falls_back(tmp_path, caplog):
    """A truncated file in the newest checkpoint: the previous kept one is used, with a warning naming both;
    with every kept checkpoint bad, the error names the bad file and what to delete."""
    model, opt = _model_and_opt()
    for step in (1, 2):
        save_checkpoint(tmp_path, step, {"policy": model}, {"policy": opt}, {}, keep=2)
    newest = tmp_path / "step_00000002" / "models" / "policy.pt"
    _truncate(newest)
    with caplog.at_level("WARNING"):
        ckpt = load_latest(tmp_path)
    assert ckpt.step == 1 and ckpt.model_state("policy").keys() == model.state_dict().keys()
    assert str(newest) in caplog.text and "step_00000001" in caplog.text
    _truncate(tmp_path / "step_00000001" / "optim" / "policy.pt")
    with pytest.raises(CorruptCheckpointError, match=r"optim/policy\.pt.*Delete " + str(tmp_path)):
        load_latest(tmp_path)


def test_step_examples_is_a_seeded_permutation_per_epoch():
    first_epoch = [i for step in range(3) for i in step_examples(step, 6, 2, seed=0)]
    assert sorted(first_epoch) == list(range(6))
    assert step_examples(4, 6, 2, seed=0) == step_examples(4, 6, 2, seed=0)
    assert first_epoch != [i for step in range(3) for i in step_examples(step, 6, 2, seed=1)]


def test_metrics_history_round_trips_and_old_checkpoints_have_none(tmp_path):
    model, opt = _model_and_opt()
    history = [{"sft/loss": 1.5}, {"step": 0.0, "fidelity/exact_match": 0.25}, {"step": 1.0, "reward/mean": 0.5}]
    path = save_checkpoint(tmp_path, 1, {"policy": model}, {"policy": opt}, {}, history=history)
    assert load_latest(tmp_path).history() == history
    (path / "history.json").unlink()  # a checkpoint written before histories (and checksums) were saved
    state = json.loads((path / "state.json").read_text())
    del state["checksums"]
    (path / "state.json").write_text(json.dumps(state))
    assert load_latest(tmp_path).history() == []
