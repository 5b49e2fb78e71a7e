"""A call to a tool the task does not offer gets one answer in every loop.

The training rollouts of both engines, the evaluation episode and test-time rehearsal answer it as the tool
world's executor does (an ``UNKNOWN_TOOL`` error listing the offered tools) and the episode goes on. No
REHEARSE generation is spent on it and it leaves no REHEARSE output to train on, but the REHEARSE
context still shows it to later calls, as any earlier call with its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from envace.core.prompts import DEFAULT_ROLE_PROMPTS as P
from envace.core.prompts import ChatFormatter
from envace.core.records import Role, Termination, ToolCall
from envace.core.rehearse_context import Answered, Said, rehearse_context
from envace.core.wire import render_tool_calls
from envace.data.specs import episode_spec_from_task, executor_factory_for
from envace.engines.local import ResponseSource, RolloutConfig, RolloutRunner
from envace.engines.verl.episode import EpisodeRunner, Generation
from envace.engines.verl.settings import LoopSettings
from envace.envs.toolworld import ToolWorldEnv
from envace.evaluation.episode import ActLoopConfig, Dialogue, ExecutorResponder, run_act_loop
from envace.evaluation.programs import ACTOR, REHEARSER, GenerationLedger, drive
from envace.inference.base import ChatOutput, ChatRequest
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.rehearsal.imagined import RehearserResponder
from envace.runtime.decode import DecodeGuide

torch.set_num_threads(1)

UNKNOWN = ToolCall("teleport", {"to": "mars"})
FINAL = "All done."
REHEARSED = '<execution_result>\n{"ok": true}\n</execution_result>'
ROLLOUT = RolloutConfig(samples_per_prompt=1, max_act_tokens=96, max_rehearse_tokens=96, max_stream_tokens=4096)


@pytest.fixture(scope="module")
def world():
    env = ToolWorldEnv()
    task = next(t for t in env.tasks("train") if len(t.user_turns) == 1)
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    spec = episode_spec_from_task(task, env.make_executor(task))
    known = spec.gold[0][0].calls[0]
    return {"env": env, "task": task, "spec": spec, "model": model, "fmt": ChatFormatter(tokenizer), "known": known}


def _environment_answer(world) -> dict:
    """What the tool world's own executor answers to the unknown call."""
    return world["env"].make_executor(world["task"]).execute(UNKNOWN)


def _act_text(step: int, calls: Sequence[ToolCall]) -> str:
    """ACT's script: the calls at its first step, then a final reply."""
    return render_tool_calls(calls) if step == 0 else FINAL


def _local_rollout(world, calls, source):
    fmt, eot = world["fmt"], list(world["fmt"].end_of_turn_token_ids)
    script = lambda k: fmt.encode(_act_text(k.index, calls) if k.role is Role.ACT else REHEARSED) + eot  # noqa: E731
    runner = RolloutRunner(fmt, ROLLOUT, guide=DecodeGuide(script))
    return runner.run([world["spec"]], world["model"], source)


def _verl_episode(world, calls):
    """The verl episode over a server that plays the same script; returns (outcome, REHEARSE prompts)."""
    fmt, eot = world["fmt"], list(world["fmt"].end_of_turn_token_ids)
    steps, rehearse_prompts = {Role.ACT: 0}, []

    async def generate(role, prompt_ids, max_new_tokens, temperature):
        if role is Role.REHEARSE:
            rehearse_prompts.append(list(prompt_ids))
            return Generation(tuple(fmt.encode(REHEARSED) + eot))
        steps[Role.ACT] += 1
        return Generation(tuple(fmt.encode(_act_text(steps[Role.ACT] - 1, calls)) + eot))

    settings = LoopSettings(max_act_tokens=96, max_rehearse_tokens=96, max_stream_tokens=4096)
    outcome = asyncio.run(EpisodeRunner(world["spec"], settings, fmt, P, generate).run())
    return outcome, rehearse_prompts


class ScriptedActor:
    """ACT seat: the calls until a tool response is in the conversation, then a final reply."""

    name = "scripted"

    def __init__(self, calls: Sequence[ToolCall]) -> None:
        self.calls = calls

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        answered = [any(m["role"] == "tool" for m in r.messages) for r in requests]
        return [ChatOutput(_act_text(int(a), self.calls), completion_tokens=4) for a in answered]


class CountingRehearser:
    """REHEARSER seat: always the same valid answer; keeps every request it was sent."""

    name = "counting"

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.requests.extend(requests)
        return [ChatOutput(REHEARSED, completion_tokens=4) for _ in requests]


def _act_loop(world, calls, responder, rehearser: CountingRehearser):
    task = world["task"]
    dialogue = Dialogue(task.task_id, task.system_prompt, tuple(task.tools), tuple(task.user_turns))
    program = run_act_loop(dialogue, responder, ActLoopConfig(max_steps_per_turn=3), GenerationLedger())
    return drive(program, {ACTOR: ScriptedActor(calls), REHEARSER: rehearser})


def _rehearser_responder(world, ledger: GenerationLedger) -> RehearserResponder:
    tools = tuple(world["task"].tools)
    return RehearserResponder(tools, P, ledger, max_new_tokens=32, temperature=0.0, seed_parts=(0,))


def test_unknown_tool_gets_the_environment_error_in_every_loop(world):
    expected = _environment_answer(world)
    assert expected["error"]["code"] == "UNKNOWN_TOOL" and world["spec"].tool_names[0] in expected["error"]["message"]

    for source in (
        ResponseSource(model=world["model"]),
        ResponseSource(executor_factory=executor_factory_for(world["env"].make_executor, [world["task"]])),
    ):
        batch = _local_rollout(world, [UNKNOWN], source)
        traj = batch.trajectories[0]
        assert traj.termination is Termination.FINAL_REPLY, traj.info["parse_errors"]
        assert traj.turns[0].responses == (expected,) and traj.info["final_answers"] == [FINAL]
        assert batch.generated_tokens[Role.REHEARSE] == 0
        assert not (traj.stream(Role.REHEARSE) and traj.stream(Role.REHEARSE).outputs())  # no REHEARSE row

    outcome, rehearse_prompts = _verl_episode(world, [UNKNOWN])
    assert outcome.trajectory.termination is Termination.FINAL_REPLY
    assert outcome.trajectory.turns[0].responses == (expected,) and rehearse_prompts == []
    assert Role.REHEARSE not in {s.role for s in outcome.trajectory.streams}

    rehearser = CountingRehearser()
    evaluated = _act_loop(world, [UNKNOWN], ExecutorResponder(world["env"].make_executor(world["task"])), rehearser)
    assert evaluated.termination is Termination.FINAL_REPLY and evaluated.turns[0].responses == (expected,)

    ledger = GenerationLedger()
    rehearsed = _act_loop(world, [UNKNOWN], _rehearser_responder(world, ledger), rehearser)
    assert rehearsed.termination is Termination.FINAL_REPLY and rehearsed.turns[0].responses == (expected,)
    assert rehearser.requests == [] and "rehearse" not in ledger.snapshot()


def test_later_calls_see_the_unknown_call_in_their_rehearse_context(world):
    """[unknown, known] in one step: the known call's REHEARSE prompt is the one builder's, over a history
    that holds the unknown call with its error, on both training engines and in test-time rehearsal."""
    fmt, known, task = world["fmt"], world["known"], world["task"]
    history = [Said("user", task.user_turns[0]), Answered(UNKNOWN, _environment_answer(world))]
    direct = rehearse_context(P, tuple(task.tools), history, known)

    traj = _local_rollout(world, [UNKNOWN, known], ResponseSource(model=world["model"])).trajectories[0]
    stream = traj.stream(Role.REHEARSE)
    assert len(stream.outputs()) == 1 and traj.turns[0].responses[1] == {"ok": True}
    before = [t for s in stream.segments[: stream.segments.index(stream.outputs()[0])] for t in s.token_ids]
    assert fmt.decode(before) == fmt.render(direct, None, add_generation_prompt=True)

    _, rehearse_prompts = _verl_episode(world, [UNKNOWN, known])
    assert [fmt.decode(p) for p in rehearse_prompts] == [fmt.decode(before)]

    rehearser = CountingRehearser()
    _act_loop(world, [UNKNOWN, known], _rehearser_responder(world, GenerationLedger()), rehearser)
    assert [list(r.messages) for r in rehearser.requests] == [direct]
