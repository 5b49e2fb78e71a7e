"""The act/rehearse verl agent loop on CPU, driven by a transformers-backed token server (tiny model).

Real generation: every token id and log-prob comes from the tiny Llama through ``HFServerManager``; a
``ScriptedGuide`` forces known (gold) outputs where a test needs a well-formed trajectory, the log-probs
stay the model's own. Each row's log-probs are recomputed with one forward pass over the row
(prompt + response): equality proves the row is exactly the context the generation saw.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from omegaconf import OmegaConf
from verl_hf_server import HFServerManager, ScriptedGuide, gold_texts

from envace.config.load import compose
from envace.core.records import NO_ROLE, Role
from envace.engines.verl import reward_sources as sources
from envace.engines.verl.config_builder import build_overrides, compose_verl_config, loop_settings
from envace.engines.verl.episodes import dataset_record, spec_from_row
from envace.engines.verl.rows import EXCLUDE_KEY, INFO_KEY, NUM_OUTPUTS_KEY, ROLE_IDS_KEY, ROLE_KEY, TRAJECTORY_KEY

BUDGETS = [
    "rollout.max_act_tokens=160",
    "rollout.max_rehearse_tokens=160",
    "rollout.max_stream_tokens=4096",
    "rollout.max_prompt_tokens=2048",
]
REHEARSE_TEMPERATURE = 0.5  # set on the loop directly: the config builder refuses it for trained REHEARSE rows
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_world(tmp_path_factory.mktemp("verl"))


def build_world(out) -> dict:
    """Tiny model + tokenizer, a composed verl config (smoke profile, larger budgets), one tool-world task."""
    from envace.envs.toolworld import generate_tasks, to_cm2_row
    from envace.models import ModelSpec, load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = OmegaConf.to_container(compose(["profile=smoke", *BUDGETS]), resolve=True)
    overrides = build_overrides(
        cfg,
        train_files=[str(out / "t.parquet")],
        val_files=[str(out / "t.parquet")],
        output_dir=out,
        model_path=str(out / "model"),
    )
    # the loop samples each role at its own temperature; a REHEARSE one that differs is set on the loop itself
    cfg["rollout"]["rehearse_temperature"] = REHEARSE_TEMPERATURE
    verl_config = OmegaConf.merge(
        compose_verl_config(overrides), {"envace": {"rehearse_temperature": REHEARSE_TEMPERATURE}}
    )
    model, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    tasks = generate_tasks(seed=0, n_train=12, n_val=0, n_test=0)["train"]
    task = next(t for t in tasks if len(t.user_turns) == 1 and len(t.gold_calls[0]) == 1)
    row = to_cm2_row(task, include_state=True)
    spec = spec_from_row(row, "toolworld")
    return {
        "cfg": cfg,
        "verl": verl_config,
        "model": model,
        "tokenizer": tokenizer,
        "row": row,
        "spec": spec,
        "record": dataset_record(spec, 0, "train", "toolworld", row),
    }


def make_loop(world: dict, server: HFServerManager, verl: dict | None = None, **settings):
    """The agent loop over ``server``; ``verl`` updates verl's config, ``settings`` its ``envace`` node."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from envace.engines.verl.agent_loop import ActRehearseAgentLoop

    config = OmegaConf.merge(world["verl"], verl or {}, {"envace": settings})
    return ActRehearseAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=world["tokenizer"],
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
    )


def encode_targets(loop, texts: list) -> list[list[int]]:
    """Each text's tokens closed by the end-of-turn token; a list of token ids is taken as it is."""
    eot = loop.formatter.end_of_turn_token_ids[0]
    return [list(text) if isinstance(text, list) else loop.formatter.encode(text) + [eot] for text in texts]


def play(
    world: dict,
    *,
    scripts=None,
    uid: str = "u",
    session: int = 0,
    sampling=None,
    verl=None,
    server_cls=None,
    **settings,
):
    """Run the loop once; ``scripts`` = {"act": [texts], "rehearse": [texts]} forces those outputs (a text or, as
    given, a list of token ids); ``server_cls`` replaces ``HFServerManager``; ``verl``/``settings``: ``make_loop``."""
    guide = ScriptedGuide({})
    server = (server_cls or HFServerManager)(world["model"], seed=7, global_steps=3, guide=guide)
    loop = make_loop(world, server, verl, **settings)
    trajectory = f"{uid}_{session}"
    for role, texts in (scripts or {}).items():
        guide.scripts[f"{trajectory}-{role}"] = encode_targets(loop, texts)
    kwargs = {
        **world["record"],
        "uid": uid,
        "session_id": session,
        "global_steps": 3,
        "raw_prompt": world["record"]["prompt"],
    }
    rows = asyncio.run(loop.run(dict(sampling or SAMPLING), **kwargs))
    return rows, server, loop


def recomputed_logprobs(model, row, temperature_of_role: dict[int, float]) -> torch.Tensor:
    """log softmax(logits / T_role) of every response token given everything before it in the row."""
    ids = torch.tensor([row.prompt_ids + row.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(row.prompt_ids)
    out = torch.zeros(len(row.response_ids))
    for j, token in enumerate(row.response_ids):
        role = row.extra_fields[ROLE_IDS_KEY][j]
        if role == NO_ROLE:
            continue
        scaled = torch.log_softmax(logits[start + j - 1] / temperature_of_role[role], dim=-1)
        out[j] = scaled[token]
    return out


def test_envace_rows_masks_role_ids_logprobs_and_reward(world: dict) -> None:
    rows, server, loop = play(world, scripts=gold_texts(world["spec"]))
    assert [r.extra_fields[ROLE_KEY] for r in rows] == [int(Role.REHEARSE), int(Role.ACT)]  # ACT row last
    reh, act = rows
    for row, role in ((act, Role.ACT), (reh, Role.REHEARSE)):
        mask, role_ids = row.response_mask, row.extra_fields[ROLE_IDS_KEY]
        assert len(mask) == len(role_ids) == len(row.response_ids) == len(row.response_logprobs)
        assert [r == int(role) for r in role_ids] == [m == 1 for m in mask]
        assert all(r == NO_ROLE for r, m in zip(role_ids, mask) if m == 0)
        lps = torch.tensor(row.response_logprobs)
        assert torch.all(lps[torch.tensor(mask) == 0] == 0)
        temperatures = {int(Role.ACT): 1.0, int(Role.REHEARSE): REHEARSE_TEMPERATURE}
        expected = recomputed_logprobs(world["model"], row, temperatures)
        assert torch.allclose(lps, expected, atol=1e-4), "row is not the context the tokens were sampled in"
        assert row.reward_score == 1.0 and row.extra_fields[EXCLUDE_KEY] is False
        assert row.extra_fields[TRAJECTORY_KEY] == "u_0"
        assert row.extra_fields["min_global_steps"] == row.extra_fields["max_global_steps"] == 3
    assert act.extra_fields[NUM_OUTPUTS_KEY] == 2 and reh.extra_fields[NUM_OUTPUTS_KEY] == 1  # call+reply / 1 answer
    # the rehearsed response went into the ACT context as observation tokens (mask 0)
    scaffold = loop.formatter.decode([t for t, m in zip(act.response_ids, act.response_mask) if m == 0])
    answer = world["spec"].gold[0][0].responses[0]
    assert "<tool_response>" in scaffold and json.dumps(answer, separators=(",", ":"))[:20] in scaffold
    assert act.extra_fields[INFO_KEY]["termination"] == "final_reply"
    assert act.extra_fields["reward_extra_info"]["envace_rehearse_outputs"] == 1.0
    temps = {r["request_id"].rsplit("-", 1)[1]: r["params"]["temperature"] for r in server.requests}
    assert temps == {"act": 1.0, "rehearse": REHEARSE_TEMPERATURE}  # per-role temperatures replace verl's


def test_reward_follows_the_trajectory(world: dict) -> None:
    """A reply without the gold call: call score 0, answer values present → 0.5 (verifiable reward)."""
    spec = world["spec"]
    rows, _, _ = play(world, scripts={"act": [spec.gold_answers[0]]}, session=1)
    assert len(rows) == 1 and rows[0].extra_fields[ROLE_KEY] == int(Role.ACT)  # REHEARSE never generated
    assert rows[0].reward_score == pytest.approx(0.5)
    assert rows[0].extra_fields[INFO_KEY]["reward_info"]["turn_scores"] == [0.5]


def test_frozen_roles(world: dict) -> None:
    script = gold_texts(world["spec"])
    rows, _, _ = play(world, scripts=script, variant="frozen_rehearse")
    assert [r.extra_fields[ROLE_KEY] for r in rows] == [int(Role.ACT)] and sum(rows[0].response_mask) > 0
    rows, _, _ = play(world, scripts=script, variant="frozen_act")
    reh, act = rows
    assert sum(act.response_mask) == 0 and set(act.extra_fields[ROLE_IDS_KEY]) == {NO_ROLE}
    assert act.extra_fields[NUM_OUTPUTS_KEY] == 0 and sum(reh.response_mask) > 0


def test_grpo_takes_responses_from_the_real_executor(world: dict) -> None:
    from envace.envs.toolworld import ToolWorldExecutor, task_from_cm2_row

    spec = world["spec"]
    script = {"act": gold_texts(spec)["act"]}
    rows, server, loop = play(world, scripts=script, variant="grpo", responses="executor")
    assert len(rows) == 1 and {r["request_id"].rsplit("-", 1)[1] for r in server.requests} == {"act"}
    real = ToolWorldExecutor(task_from_cm2_row(world["row"])).execute(spec.gold[0][0].calls[0])
    act = rows[0]
    scaffold = loop.formatter.decode([t for t, m in zip(act.response_ids, act.response_mask) if m == 0])
    assert json.dumps(real, ensure_ascii=False, separators=(",", ":")) in scaffold
    assert act.reward_score == 1.0


def test_judge_failure_excludes_the_trajectory(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(settings):
        def reward(spec, trajectory):
            raise TimeoutError("judge endpoint down")

        return reward

    monkeypatch.setitem(sources.REWARD_BUILDERS, "verifiable", broken)
    monkeypatch.setattr(sources, "_CACHE", {})
    rows, _, _ = play(world, scripts=gold_texts(world["spec"]), session=2)
    assert len(rows) == 2
    for row in rows:
        assert row.extra_fields[EXCLUDE_KEY] is True and sum(row.response_mask) == 0
        assert set(row.extra_fields[ROLE_IDS_KEY]) == {NO_ROLE}
        assert row.extra_fields["reward_extra_info"]["envace_judge_failed"] == 1.0
    assert rows[-1].extra_fields[INFO_KEY]["status"] == "judge_failed"


def test_free_sampling_and_validation_temperature(world: dict) -> None:
    """Unscripted sampling from the random model: invariants hold; verl's validation sampling is kept."""
    rows, server, _ = play(world, session=3, sampling={**SAMPLING, "temperature": 0.0})
    assert {r["params"]["temperature"] for r in server.requests} == {0.0}  # not the training temperatures
    act = rows[-1]
    assert act.extra_fields[ROLE_KEY] == int(Role.ACT) and sum(act.response_mask) >= 1
    expected = recomputed_logprobs(world["model"], act, {int(Role.ACT): 1.0, int(Role.REHEARSE): 1.0})
    assert torch.allclose(torch.tensor(act.response_logprobs), expected, atol=1e-4)


def test_settings_round_trip_through_verl_config(world: dict) -> None:
    from envace.engines.verl.agent_loop import settings_from_config

    assert settings_from_config(world["verl"]) == loop_settings(world["cfg"])


class ScriptedSimulator:
    """A frozen-simulator chat backend that answers every call with the recorded response (scripted client)."""

    name = "scripted-simulator"

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list = []

    def generate(self, requests):
        from envace.inference.base import ChatOutput

        self.requests.extend(requests)
        return [ChatOutput(text=self.answer) for _ in requests]


def test_grpo_takes_responses_from_a_frozen_simulator(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import envace.engines.verl.agent_loop as agent_loop_module

    spec = world["spec"]
    simulator = ScriptedSimulator(gold_texts(spec)["rehearse"][0])
    monkeypatch.setattr(agent_loop_module, "simulator_backend", lambda endpoint: simulator)
    rows, server, loop = play(world, scripts={"act": gold_texts(spec)["act"]}, variant="grpo", responses="simulator")
    assert len(rows) == 1 and {r["request_id"].rsplit("-", 1)[1] for r in server.requests} == {"act"}
    (request,) = simulator.requests
    assert request.messages[0]["role"] == "system" and "execution backend" in request.messages[0]["content"]
    assert spec.gold[0][0].calls[0].name in request.messages[-1]["content"]
    assert request.temperature == REHEARSE_TEMPERATURE
    scaffold = loop.formatter.decode([t for t, m in zip(rows[0].response_ids, rows[0].response_mask) if m == 0])
    assert json.dumps(spec.gold[0][0].responses[0], separators=(",", ":"))[:20] in scaffold


# ---- stop reasons and tool-response truncation ---------------------------------------------------------------
def test_generation_ending_for_every_stop_reason() -> None:
    from envace.core.turn_end import Ending, generation_ending

    eot, other = 2, 0
    ends = frozenset({eot, other})
    cases = [
        ([5, 6, eot], "completed", 10, Ending.END_OF_TURN),
        ([5, 6, other], "completed", 10, Ending.OTHER_END_TOKEN),  # Qwen3's <|endoftext|>: vLLM stops on it too
        ([5, 6, other], None, 3, Ending.OTHER_END_TOKEN),  # an end token that used the last of the budget
        ([5, 6], "completed", 10, Ending.SILENT_STOP),  # stopped on a stop token it did not return
        ([5, 6], "completed", 2, Ending.LENGTH),  # vLLM reports the length limit as "completed" too
        ([5, 6], "length", 10, Ending.LENGTH),  # verl's partial-rollout client
        ([5, 6, eot], "aborted", 10, Ending.ABORTED),
        ([], "abort", 10, Ending.ABORTED),
        ([5, 6], "some_new_reason", 10, Ending.SILENT_STOP),  # unknown: logged, judged by tokens and budget
    ]
    for ids, reason, budget, expected in cases:
        assert generation_ending(ids, reason, budget, eot, ends) is expected, (ids, reason, budget)


def test_tool_responses_are_cut_by_verls_rule() -> None:
    from envace.engines.verl.episode import truncate_tool_response

    text = "abcdefghij"
    assert truncate_tool_response(text, None, "middle") == text and truncate_tool_response(text, 10, "left") == text
    assert truncate_tool_response(text, 4, "left") == "(truncated)...ghij"
    assert truncate_tool_response(text, 4, "right") == "abcd...(truncated)"
    assert truncate_tool_response(text, 4, "middle") == "ab...(truncated)...ij"
    assert truncate_tool_response(text, 1, "middle") == "...(truncated)..."  # verl's text[-0:] would keep it all


def test_another_end_token_never_reaches_the_act_row(world: dict, tmp_path) -> None:
    from transformers import GenerationConfig

    tokenizer, spec = world["tokenizer"], world["spec"]
    eot, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|pad|>")
    GenerationConfig(eos_token_id=[eot, pad]).save_pretrained(tmp_path)  # as Qwen3's: [<|im_end|>, <|endoftext|>]
    answer = spec.gold_answers[0]
    verl = {"actor_rollout_ref": {"model": {"path": str(tmp_path)}}}
    probe = make_loop(world, HFServerManager(world["model"]), verl)
    rows, server, loop = play(world, scripts={"act": [probe.formatter.encode(answer) + [pad]]}, session=4, verl=verl)
    assert server.requests[0]["params"]["stop_token_ids"] == [eot, pad]
    (act,) = rows
    trained = [t for t, m in zip(act.response_ids, act.response_mask) if m]
    assert pad not in act.response_ids and loop.formatter.decode(trained) == answer
    assert act.response_ids[-1] == eot and act.response_mask[-1] == 0  # the template's end, as scaffold
    assert len(act.response_logprobs) == len(act.response_ids) == len(act.response_mask)
    expected = recomputed_logprobs(world["model"], act, {int(Role.ACT): 1.0})
    assert torch.allclose(torch.tensor(act.response_logprobs), expected, atol=1e-4)
    assert act.extra_fields[INFO_KEY]["termination"] == "final_reply" and act.reward_score == pytest.approx(0.5)


class AbortingServer(HFServerManager):
    """Reports the first request as aborted by the server (verl's vLLM server on ``finish_reason == "abort"``)."""

    async def generate(self, request_id: str, **kwargs):
        out = await super().generate(request_id, **kwargs)
        return out.model_copy(update={"stop_reason": "aborted"}) if self.calls == 1 else out


def test_an_aborted_generation_excludes_the_trajectory(world: dict) -> None:
    rows, _, _ = play(world, scripts=gold_texts(world["spec"]), session=5, server_cls=AbortingServer)
    (act,) = rows
    assert act.extra_fields[EXCLUDE_KEY] is True and sum(act.response_mask) == 0
    assert act.extra_fields[INFO_KEY]["termination"] == "error"
    assert act.extra_fields["reward_extra_info"]["envace_aborted"] == 1.0


def test_long_tool_responses_are_cut_before_act_reads_them(world: dict) -> None:
    from envace.envs.toolworld import ToolWorldExecutor, task_from_cm2_row

    spec = world["spec"]
    script = {"act": gold_texts(spec)["act"]}
    rows, _, loop = play(world, scripts=script, variant="grpo", responses="executor", max_tool_response_length=8)
    real = ToolWorldExecutor(task_from_cm2_row(world["row"])).execute(spec.gold[0][0].calls[0])
    whole = json.dumps(real, ensure_ascii=False, separators=(",", ":"))
    assert len(whole) > 8
    scaffold = loop.formatter.decode([t for t, m in zip(rows[0].response_ids, rows[0].response_mask) if m == 0])
    assert f"{whole[:4]}...(truncated)...{whole[-4:]}" in scaffold and whole not in scaffold
