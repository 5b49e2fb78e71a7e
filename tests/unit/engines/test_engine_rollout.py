"""Rollout stream building on the tiny model and tool-world tasks: streams, masks, role ids, caches."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from envace.core.prompts import (
    DEFAULT_ROLE_PROMPTS,
    ChatFormatter,
    act_messages,
    act_observation_messages,
    compact_json,
    sft_rehearse_target,
)
from envace.core.records import NO_ROLE, Role, Termination
from envace.core.rehearse_context import conversation_events, rehearse_context
from envace.core.wire import as_result_object
from envace.data.specs import episode_spec_from_task, executor_factory_for
from envace.engines.local import ResponseSource, RolloutConfig, RolloutRunner
from envace.engines.local.sft import gold_guide
from envace.envs.toolworld import ToolWorldEnv
from envace.envs.toolworld.reward import toolworld_verifiable_reward
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.decode import DecodeGuide
from envace.runtime.kv import BatchedStreams

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world():
    env = ToolWorldEnv()
    tasks = env.tasks("train")
    multi = next(t for t in tasks if len(t.user_turns) >= 2 and any(len(s) > 1 for s in t.gold_calls[-1]))
    single = next(t for t in tasks if len(t.user_turns) == 1)
    chosen = [multi, single]
    specs = [episode_spec_from_task(t, env.make_executor(t)) for t in chosen]
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    return {"env": env, "tasks": chosen, "specs": specs, "model": model, "fmt": ChatFormatter(tokenizer)}


CFG = RolloutConfig(samples_per_prompt=2, max_act_tokens=96, max_rehearse_tokens=96, max_stream_tokens=4096)


def _gold_run(world, **cfg):
    runner = RolloutRunner(
        world["fmt"], replace(CFG, **cfg), guide=gold_guide(dict(enumerate(world["specs"])), world["fmt"])
    )
    return runner.run(world["specs"], world["model"], ResponseSource(model=world["model"]))


def _expected_act_text(fmt, spec, traj):
    messages = act_messages(DEFAULT_ROLE_PROMPTS, spec.system_prompt, spec.user_turns[0])
    for turn in traj.turns:
        if turn.user_turn >= 1 and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
            messages.append({"role": "user", "content": spec.user_turns[turn.user_turn]})
        if turn.tool_calls:
            calls = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.tool_calls
            ]
            messages.append({"role": "assistant", "content": turn.act_text, "tool_calls": calls})
            messages.extend(act_observation_messages(turn.tool_calls, turn.responses))
        else:
            messages.append({"role": "assistant", "content": turn.act_text})
    return fmt.render(messages, spec.tools, add_generation_prompt=False)


def test_gold_replay_builds_the_chat_template_streams(world):
    fmt, batch = world["fmt"], _gold_run(world)
    assert len(batch.trajectories) == 2 * CFG.samples_per_prompt
    for traj, spec in zip(batch.trajectories, [s for s in world["specs"] for _ in range(2)]):
        assert traj.termination is Termination.FINAL_REPLY
        assert toolworld_verifiable_reward(spec, traj).reward == pytest.approx(1.0)
        act = traj.stream(Role.ACT).flat()
        assert fmt.decode(act["input_ids"]) + "\n" == _expected_act_text(fmt, spec, traj)
        calls = [c for t in traj.turns for c in t.tool_calls]
        reh_outputs = traj.stream(Role.REHEARSE).outputs()
        assert len(reh_outputs) == len(calls)  # one REHEARSE generation per tool call


def test_rehearse_stream_is_the_builder_over_its_own_history(world):
    fmt, spec = world["fmt"], world["specs"][0]
    traj = _gold_run(world).trajectories[0]
    calls = [(k, j) for k, t in enumerate(traj.turns) for j in range(len(t.tool_calls))]
    k, j = calls[-1]
    turn = traj.turns[k]
    history = conversation_events(
        spec.user_turns,
        [*traj.turns[:k], replace(turn, tool_calls=turn.tool_calls[:j], responses=turn.responses[:j])],
        upto_turn=turn.user_turn,
    )
    messages = rehearse_context(DEFAULT_ROLE_PROMPTS, spec.tools, history, turn.tool_calls[j])
    messages.append({"role": "assistant", "content": sft_rehearse_target(as_result_object(turn.responses[j]))})
    stream = traj.stream(Role.REHEARSE)
    assert fmt.decode(stream.flat()["input_ids"]) + "\n" == fmt.render(messages, None, add_generation_prompt=False)
    prompt = stream.segments[0].text  # the system prompt: must hold no reference response at all
    responses = [r for steps in spec.gold for st in steps for r in st.responses]
    assert responses and not any(json.dumps(r) in prompt or compact_json(r) in prompt for r in responses)


def test_masks_role_ids_and_logprobs(world):
    traj = _gold_run(world).trajectories[0]
    for stream in traj.streams:
        flat = stream.flat()
        n_out = sum(len(s.token_ids) for s in stream.outputs())
        assert sum(flat["response_mask"]) == n_out
        assert {r for r, m in zip(flat["role_ids"], flat["response_mask"]) if m} == {int(stream.role)}
        assert all(r == NO_ROLE for r, m in zip(flat["role_ids"], flat["response_mask"]) if not m)
        for seg in stream.outputs():
            assert len(seg.logprobs) == len(seg.token_ids) and all(lp <= 0 for lp in seg.logprobs)
            assert seg.token_ids[-1] in world["fmt"].end_of_turn_token_ids


def test_a_stop_on_another_eos_is_dropped_and_the_end_of_turn_appended(world):
    """A tokenizer whose eos differs from the template's end of turn (Qwen3's ``<|endoftext|>``): an output that
    stops on that eos loses it (and its log-prob) and the stream gets the end-of-turn token as untrained
    scaffold (``envace.core.turn_end``, OTHER_END_TOKEN), so the stream reads as the template's would."""
    fmt = copy.copy(world["fmt"])
    eot = fmt.end_of_turn_token_ids[0]
    other = next(i for i in range(eot + 1, eot + 1000) if fmt.decode([i]).strip())  # an ordinary token as eos
    fmt.end_of_turn_token_ids = (eot, other)
    gold = gold_guide(dict(enumerate(world["specs"])), fmt)

    def with_other_eos(key):
        target = gold.targets(key)
        return None if target is None else [*target[:-1], other] if target[-1] == eot else target

    runner = RolloutRunner(fmt, CFG, guide=DecodeGuide(with_other_eos))
    batch = runner.run(world["specs"], world["model"], ResponseSource(model=world["model"]))
    plain = _gold_run(world)
    for traj, ref, spec in zip(batch.trajectories, plain.trajectories, [s for s in world["specs"] for _ in range(2)]):
        assert traj.termination is Termination.FINAL_REPLY
        assert toolworld_verifiable_reward(spec, traj).reward == pytest.approx(1.0)
        for stream, ref_stream in zip(traj.streams, ref.streams):
            flat, ref_flat = stream.flat(), ref_stream.flat()
            assert flat["input_ids"] == ref_flat["input_ids"] and other not in flat["input_ids"]
            outputs = stream.outputs()
            assert all(seg.token_ids[-1] != eot and len(seg.logprobs) == len(seg.token_ids) for seg in outputs)
            # the appended end of turn is the one token per output the plain run trains and this one does not
            assert sum(flat["response_mask"]) == sum(ref_flat["response_mask"]) - len(outputs)
            after = [stream.segments[stream.segments.index(seg) + 1] for seg in outputs]
            assert all(seg.token_ids == (eot,) and seg.role is None for seg in after)


@pytest.mark.parametrize("share", [True, False], ids=["shared-prompt-kv", "copied-prompt-kv"])
def test_kv_reuse_matches_naive_reencoding(world, share, monkeypatch):
    # the tiny model's prompts may be too small to be shared by default: sharing is forced where tested
    monkeypatch.setattr(BatchedStreams, "SHARE_MIN_BYTES", 0)
    reuse, naive = _gold_run(world, share_prompt_kv=share), _gold_run(world, reuse_kv=False)
    for a, b in zip(reuse.trajectories, naive.trajectories):
        for sa, sb in zip(a.streams, b.streams):
            fa, fb = sa.flat(), sb.flat()
            assert fa["input_ids"] == fb["input_ids"]
            torch.testing.assert_close(torch.tensor(fa["logprobs"]), torch.tensor(fb["logprobs"]), atol=1e-4, rtol=0)
    assert reuse.fed_tokens < naive.fed_tokens / 2


def test_sampling_is_seeded_and_samples_differ(world):
    runner = RolloutRunner(world["fmt"], replace(CFG, max_act_tokens=12))
    run = lambda seed: runner.run(world["specs"][:1], world["model"], ResponseSource(model=world["model"]), seed=seed)
    a, b, c = run(3), run(3), run(4)
    ids = lambda batch: [t.stream(Role.ACT).flat()["input_ids"] for t in batch.trajectories]
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert ids(a)[0] != ids(a)[1]  # the K samples of one prompt differ
    assert all(t.termination is Termination.MAX_TOKENS for t in a.trajectories)  # random model never stops


def test_parse_errors_and_step_limit_end_trajectories(world):
    fmt, spec = world["fmt"], world["specs"][1]
    eot = list(fmt.end_of_turn_token_ids)
    bad_act = DecodeGuide(lambda k: fmt.encode("<tool_call>\n{oops\n</tool_call>") + eot)
    runner = RolloutRunner(fmt, CFG, guide=bad_act)
    traj = runner.run([spec], world["model"], ResponseSource(model=world["model"])).trajectories[0]
    assert traj.termination is Termination.ACT_PARSE_ERROR and traj.info["parse_errors"][0][0] == "ACT"
    call = fmt.encode(f'<tool_call>\n{{"name": "{spec.tool_names[0]}", "arguments": {{}}}}\n</tool_call>') + eot
    bad_reh = DecodeGuide(lambda k: call if k.role is Role.ACT else fmt.encode("no tags") + eot)
    traj = (
        RolloutRunner(fmt, CFG, guide=bad_reh)
        .run([spec], world["model"], ResponseSource(model=world["model"]))
        .trajectories[0]
    )
    assert traj.termination is Termination.REHEARSE_PARSE_ERROR
    ok_reh = DecodeGuide(
        lambda k: call if k.role is Role.ACT else fmt.encode("<execution_result>\n{}\n</execution_result>") + eot
    )
    limited = RolloutRunner(fmt, replace(CFG, max_steps_per_turn=2), guide=ok_reh)
    traj = limited.run([spec], world["model"], ResponseSource(model=world["model"])).trajectories[0]
    assert traj.termination is Termination.MAX_STEPS and len(traj.turns) == 2


def test_executor_responses_are_real_and_not_trainable(world):
    spec, task = world["specs"][0], world["tasks"][0]
    runner = RolloutRunner(world["fmt"], CFG, guide=gold_guide({0: spec}, world["fmt"]))
    factory = executor_factory_for(world["env"].make_executor, world["tasks"])
    traj = runner.run([spec], world["model"], ResponseSource(executor_factory=factory)).trajectories[0]
    assert traj.stream(Role.REHEARSE) is None and not any(t.rehearsed for t in traj.turns if t.tool_calls)
    real = [r for steps in spec.gold for st in steps for r in st.responses]
    assert [r for t in traj.turns for r in t.responses] == real
    replay = world["env"].make_executor(task)
    for steps in task.gold_calls:
        for step in steps:
            for call in step:
                replay.execute(call)
    assert traj.info["final_state"] == replay.state()
