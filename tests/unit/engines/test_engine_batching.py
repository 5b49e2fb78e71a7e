"""Training rows: alignment of targets/roles/advantages, log-probs vs a plain forward, advantages per output."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envace.core.records import Role, Segment, Stream, Trajectory, TrajectoryStatus
from envace.engines import get_variant
from envace.engines.local import OptimConfig
from envace.engines.local.batching import (
    build_rows,
    collate,
    output_index,
    stream_row,
    token_logprobs,
)
from envace.engines.local.trainer import compute_output_advantages

torch.set_num_threads(1)


def _stream(role: Role, parts) -> Stream:
    segs = []
    for tokens, seg_role in parts:
        lps = tuple(-0.1 * (i + 1) for i in range(len(tokens))) if seg_role is not None else None
        segs.append(Segment(tuple(tokens), role=seg_role, logprobs=lps))
    return Stream(role, tuple(segs))


ACT = _stream(Role.ACT, [([1, 2, 3], None), ([4, 5], Role.ACT), ([6], None), ([7, 8, 9], Role.ACT)])
REH = _stream(Role.REHEARSE, [([10, 11], None), ([12, 13], Role.REHEARSE)])
TEMPS = {Role.ACT: 0.5, Role.REHEARSE: 1.0}


def test_stream_row_alignment():
    row = stream_row(ACT, frozenset(Role), [0.5, -1.0], TEMPS)
    assert row.positions.tolist() == [2, 3, 5, 6, 7]  # position i predicts token i+1
    assert row.targets.tolist() == [row.input_ids[i + 1].item() for i in row.positions.tolist()] == [4, 5, 7, 8, 9]
    assert row.advantages.tolist() == [0.5, 0.5, -1.0, -1.0, -1.0]
    assert row.temperatures.tolist() == [0.5] * 5
    assert row.sampling_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.1, -0.2, -0.3])
    assert stream_row(ACT, frozenset({Role.REHEARSE}), [0.5, -1.0], TEMPS) is None  # frozen role: no row
    with pytest.raises(ValueError, match="advantages"):
        stream_row(ACT, frozenset(Role), [0.5], TEMPS)


def _traj(i, reward, status=TrajectoryStatus.OK):
    return Trajectory(prompt_id="p", sample_index=i, streams=(ACT, REH), reward=reward, status=status)


def test_advantages_rolewise_grpo_and_exclusion():
    trajs = [_traj(0, 1.0), _traj(1, 0.0), _traj(2, 0.5, TrajectoryStatus.JUDGE_FAILED)]
    assert [r for _, r in output_index(trajs)] == [Role.ACT, Role.ACT, Role.REHEARSE] * 3
    cfg = OptimConfig()
    adv = compute_output_advantages(trajs, [0, 0, 0], get_variant("envace"), cfg)
    # the judge-failed trajectory is out of the baselines and gets 0
    assert adv.values.tolist() == pytest.approx([0.5] * 3 + [-0.5] * 3 + [0.0] * 3)
    assert adv.excluded == (False, False, True)
    rows = build_rows(trajs, adv.values.tolist(), frozenset(Role), TEMPS, adv.excluded)
    assert [r.meta["trajectory"] for r in rows] == [0, 0, 1, 1]
    grpo = compute_output_advantages(trajs, [0, 0, 0], get_variant("grpo"), cfg)
    assert grpo.values.tolist() == pytest.approx([0.5, 0.5, 0.0, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0])


def test_token_logprobs_match_full_forward():
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    ).eval()
    rows = [stream_row(ACT, frozenset(Role), [1.0, 1.0], TEMPS), stream_row(REH, frozenset(Role), [1.0], TEMPS)]
    batch = collate(rows, pad_id=0)
    assert batch.keep.tolist() == [1, 2, 3, 5, 6, 7]
    with torch.no_grad():
        got = token_logprobs(model, batch)
    for b, row in enumerate(rows):
        with torch.no_grad():
            logits = model(row.input_ids[None]).logits[0]
        for pos, tgt, temp in zip(row.positions.tolist(), row.targets.tolist(), row.temperatures.tolist()):
            want = torch.log_softmax(logits[pos] / temp, -1)[tgt]
            col = batch.keep.tolist().index(pos)
            assert float(got[b, col]) == pytest.approx(float(want), abs=1e-5)
    assert int(batch.mask.sum()) == sum(r.n_tokens for r in rows)
