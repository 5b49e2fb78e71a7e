"""CM2 ``required_for_next_turn`` enforced during rollouts (online gate) and after judging (truncation)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from envace.core.prompts import ChatFormatter
from envace.core.records import GoldStep, Role, Termination, truncate_after_turn
from envace.data.specs import episode_spec_from_task
from envace.engines.local import ResponseSource, RolloutConfig, RolloutRunner
from envace.engines.local.batching import build_rows
from envace.engines.local.sft import gold_guide
from envace.envs.toolworld import ToolWorldEnv
from envace.judges.reward import required_items_gate
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)
CFG = RolloutConfig(samples_per_prompt=1, max_act_tokens=128, max_rehearse_tokens=128, max_stream_tokens=8192)


@pytest.fixture(scope="module")
def world():
    env = ToolWorldEnv()
    task = next(t for t in env.tasks("train") if len(t.user_turns) >= 2 and t.gold_calls[0])
    spec = episode_spec_from_task(task, env.make_executor(task))
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    return {"spec": spec, "model": model, "fmt": ChatFormatter(tokenizer)}


def _wrong_first_turn(spec):
    """The spec with turn 0's gold calls pointed at an argument value the checklist does not accept."""
    steps = []
    for step in spec.gold[0]:
        calls = tuple(
            replace(c, arguments={k: f"{v}-wrong" if isinstance(v, str) else v for k, v in c.arguments.items()})
            for c in step.calls
        )
        steps.append(GoldStep(calls, step.responses))
    return replace(spec, gold=(tuple(steps), *spec.gold[1:]))


def _play(world, guide_spec, gate):
    fmt = world["fmt"]
    runner = RolloutRunner(fmt, CFG, guide=gold_guide({0: guide_spec}, fmt), turn_gate=gate)
    return runner.run([world["spec"]], world["model"], ResponseSource(model=world["model"])).trajectories[0]


def test_required_item_stops_rollout(world):
    gate = required_items_gate()
    good = _play(world, world["spec"], gate)
    assert good.termination is Termination.FINAL_REPLY
    assert max(t.user_turn for t in good.turns) == len(world["spec"].user_turns) - 1
    bad_spec = _wrong_first_turn(world["spec"])
    assert any(
        step.calls[0].arguments != good_step.calls[0].arguments
        for step, good_step in zip(bad_spec.gold[0], world["spec"].gold[0])
    )
    bad = _play(world, bad_spec, gate)
    assert bad.termination is Termination.REQUIRED_ITEM_FAILED
    assert {t.user_turn for t in bad.turns} == {0}  # turn 1 was never replayed
    ungated = _play(world, bad_spec, None)  # without the gate the rollout plays on (the old behaviour)
    assert max(t.user_turn for t in ungated.turns) >= 1


def test_gate_abstains_where_the_rule_judge_cannot_tell(world):
    spec = world["spec"]
    items = [dict(it) for it in spec.checklists[0]]
    for it in items:
        it.pop("rule", None)
        it["pass_condition"] = "The assistant is polite."  # no machine-checkable rule
    vague = replace(spec, checklists=(tuple(items), *spec.checklists[1:]))
    assert required_items_gate()(vague, (), 0) is None


def test_truncate_after_turn_drops_later_outputs_from_loss_and_baselines(world):
    traj = _play(world, world["spec"], None)
    cut = truncate_after_turn(traj, 0)
    assert cut.termination is Termination.REQUIRED_ITEM_FAILED and cut.info["truncated_after_turn"] == 0
    assert {t.user_turn for t in cut.turns} == {0}
    kept = [t for t in traj.turns if t.user_turn == 0]
    counts = {r: sum(1 for role, _ in cut.outputs() if role is r) for r in Role}
    assert counts[Role.ACT] == len(kept) and counts[Role.REHEARSE] == sum(len(t.tool_calls) for t in kept)
    full_rows = build_rows([traj], [1.0] * len(traj.outputs()), frozenset(Role), {r: 1.0 for r in Role})
    cut_rows = build_rows([cut], [1.0] * len(cut.outputs()), frozenset(Role), {r: 1.0 for r in Role})
    assert sum(r.n_tokens for r in cut_rows) < sum(r.n_tokens for r in full_rows)
    for full, short in zip(traj.streams, cut.streams):  # a prefix of the original streams
        assert full.segments[: len(short.segments)] == short.segments
