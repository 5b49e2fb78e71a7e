"""The one REHEARSE context builder (envace.core.rehearse_context) and every path that uses it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from envace.core.prompts import DEFAULT_ROLE_PROMPTS as P
from envace.core.prompts import ChatFormatter, act_observation_messages
from envace.core.records import Role, Termination, ToolCall, Turn
from envace.core.rehearse_context import (
    Answered,
    Said,
    conversation_events,
    conversation_text,
    events_from_messages,
    next_call_message,
    rehearse_context,
)
from envace.core.wire import parse_rehearsal
from envace.data.specs import episode_spec_from_task
from envace.engines.local import ResponseSource, RolloutConfig, RolloutRunner
from envace.engines.local.sft import gold_guide
from envace.engines.verl.episode import EpisodeRunner, Generation
from envace.engines.verl.settings import LoopSettings
from envace.envs.toolworld import ToolWorldEnv
from envace.evaluation.fidelity import _record_probes
from envace.evaluation.programs import GenerationLedger
from envace.evaluation.records import EpisodeRecord
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.rehearsal.imagined import RehearserResponder

torch.set_num_threads(1)

TOOLS = ({"type": "function", "function": {"name": "find", "description": "find", "parameters": {}}},)
FIND = ToolCall("find", {"q": "a"})


# ---- the builder itself (pure) ------------------------------------------------------------------
def test_layout_is_append_only_and_shows_each_message_once():
    history = [Said("user", "find a"), Said("assistant", "looking"), Answered(FIND, {"id": 1})]
    first = rehearse_context(P, TOOLS, history[:2], FIND)
    more = [*history, Said("assistant", "found it"), Said("user", "and b?")]
    second = rehearse_context(P, TOOLS, more, ToolCall("find", {"q": "b"}))
    assert second[: len(first)] == first[:-1] + [first[-1]]  # earlier messages never change
    assert second[len(first)]["role"] == "assistant" and parse_rehearsal(second[len(first)]["content"]).result == {
        "id": 1
    }
    assert "User: find a" in first[1]["content"] and "Assistant: looking" in first[1]["content"]
    assert "find a" not in second[-1]["content"] and "User: and b?" in second[-1]["content"]
    assert second[-1] == next_call_message(P, TOOLS, more, ToolCall("find", {"q": "b"}))
    assert "Earlier calls" not in first[0]["content"] and first[0]["role"] == "system"


def test_conversation_budget_drops_the_oldest_first():
    said = [Said("user", "x" * 100), Said("assistant", "y" * 100), Said("user", "newest")]
    text = conversation_text(said, context_tokens=30)  # 120 characters
    assert text.endswith("User: newest") and "y" in text and "User: xxx" not in text
    assert len(text) <= 120 and text.startswith("…")
    assert conversation_text([]) == "(no new messages)"


def test_events_from_turns_and_from_messages_agree():
    turns = [
        Turn(
            'ok <tool_call>\n{"name": "find", "arguments": {"q": "a"}}\n</tool_call>',
            (FIND,),
            ({"id": 1},),
            user_turn=0,
        ),
        Turn("done", user_turn=0),
        Turn("", (FIND,), ({"id": 2},), user_turn=1, stand_ins=(0,)),
    ]
    events = conversation_events(("find a", "again"), turns, upto_turn=1)
    assert events == [
        Said("user", "find a"),
        Said("assistant", "ok"),
        Answered(FIND, {"id": 1}),
        Said("assistant", "done"),
        Said("user", "again"),
        Answered(FIND, {"id": 2}),
    ]
    assert Answered(FIND, {"id": 2}) not in conversation_events(("find a", "again"), turns, skip_stand_ins=True)
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "find a"},
        {"role": "assistant", "content": "ok", "tool_calls": [replace(FIND, id="c1").to_openai()]},
        *act_observation_messages([replace(FIND, id="c1")], [{"id": 1}]),
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "again"},
    ]
    got = events_from_messages(messages)
    assert [type(e) for e in got] == [Said, Said, Answered, Said, Said]
    assert got[2].call.name == "find" and got[2].call.arguments == {"q": "a"} and got[2].result == {"id": 1}


# ---- every path renders the same tokens ---------------------------------------------------------
@pytest.fixture(scope="module")
def played():
    """A teacher-forced local rollout of a multi-turn tool-world task with calls in several turns."""
    env = ToolWorldEnv()
    task = next(
        t
        for t in env.tasks("train")
        if sum(1 for turn in t.gold_calls if turn) >= 2
        and sum(len(step) for turn in t.gold_calls for step in turn) >= 3
    )
    spec = episode_spec_from_task(task, env.make_executor(task))
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    fmt = ChatFormatter(tokenizer)
    cfg = RolloutConfig(samples_per_prompt=1, max_act_tokens=128, max_rehearse_tokens=128, max_stream_tokens=8192)
    runner = RolloutRunner(fmt, cfg, guide=gold_guide({0: spec}, fmt))
    traj = runner.run([spec], model, ResponseSource(model=model)).trajectories[0]
    assert traj.termination is Termination.FINAL_REPLY
    return {"task": task, "spec": spec, "fmt": fmt, "traj": traj}


def _rollout_prompts(traj):
    """The REHEARSE stream's tokens right before each of its generations (the rollout's own path)."""
    stream = traj.stream(Role.REHEARSE)
    out, ids = [], []
    for seg in stream.segments:
        if seg.role is Role.REHEARSE:
            out.append(list(ids))
        ids.extend(seg.token_ids)
    return out


def _calls_in_order(traj):
    """(turn index, call index, turn) per call, with the trajectory's turns before it."""
    return [(k, j, t) for k, t in enumerate(traj.turns) for j in range(len(t.tool_calls))]


def _encode(fmt, messages):
    return fmt.encode(fmt.render(list(messages), None, True))  # what LocalHFBackend feeds for a request


def _verl_prompts(played):
    """The verl episode over a server that replays the rollout's generated tokens."""
    fmt, traj = played["fmt"], played["traj"]
    queues = {r: [list(s.token_ids) for s in traj.stream(r).outputs()] for r in Role}
    seen = []

    async def generate(role, prompt_ids, max_new_tokens, temperature):
        if role is Role.REHEARSE:
            seen.append(list(prompt_ids))
        return Generation(tuple(queues[role].pop(0)))

    settings = LoopSettings(max_act_tokens=128, max_rehearse_tokens=128, max_stream_tokens=8192)
    outcome = asyncio.run(EpisodeRunner(played["spec"], settings, fmt, P, generate).run())
    assert outcome.trajectory.termination is Termination.FINAL_REPLY
    return seen


def _imagined_messages(played, k, j, turn):
    """The request test-time rehearsal's responder sends for call j of turn k (driven without a model)."""
    traj, task = played["traj"], played["task"]
    history = conversation_events(
        task.user_turns, [*traj.turns[:k], replace(turn, tool_calls=(), responses=())], upto_turn=turn.user_turn
    )
    history += [Answered(c, r) for c, r in zip(turn.tool_calls[:j], turn.responses[:j])]
    responder = RehearserResponder(
        tuple(task.tools), P, GenerationLedger(), max_new_tokens=8, temperature=0.0, seed_parts=(0,)
    )
    program = responder.respond(turn.tool_calls[j : j + 1], turn.user_turn, "", tuple(history))
    calls = next(program)
    return calls[0].request.messages


def test_rehearse_context_same_everywhere(played):
    fmt, traj, task = played["fmt"], played["traj"], played["task"]
    rollout = _rollout_prompts(traj)
    verl = _verl_prompts(played)
    record = EpisodeRecord("toolworld", task.task_id, task.domain, "train", False, 1.0, True, turns=traj.turns)
    fidelity = [p.request.messages for p in _record_probes(record, task, P, 8, 0.0, 0)]
    located = _calls_in_order(traj)
    assert len(rollout) == len(verl) == len(fidelity) == len(located) >= 3
    assert len({t.user_turn for _, _, t in located}) >= 2  # calls in more than one user turn
    for i, (k, j, turn) in enumerate(located):
        direct = _encode(
            fmt,
            rehearse_context(
                P,
                task.tools,
                conversation_events(
                    task.user_turns,
                    [*traj.turns[:k], replace(turn, tool_calls=turn.tool_calls[:j], responses=turn.responses[:j])],
                    upto_turn=turn.user_turn,
                ),
                turn.tool_calls[j],
            ),
        )
        assert rollout[i] == direct, f"local rollout differs at call {i}"
        assert verl[i] == direct, f"verl episode differs at call {i}"
        assert _encode(fmt, fidelity[i]) == direct, f"fidelity probe differs at call {i}"
        assert _encode(fmt, _imagined_messages(played, k, j, turn)) == direct, f"test-time rehearsal differs at {i}"
    # later calls see the earlier turns' real answers and user messages, never a later turn's
    last = fmt.decode(rollout[-1])
    assert task.user_turns[0].split()[0] in last
