"""The training-time fidelity probe: schedule, curves, the oracle probe set, and a scripted rehearser
that answers through the real ``LocalHFBackend`` path (exact scores, restored RNG and train mode)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

from envace.core.curves import CURVE_KEYS, training_curves
from envace.core.prompts import ChatFormatter, compact_json
from envace.core.wire import as_result_object, render_rehearsal
from envace.engines.local import LocalEngine, LocalEngineConfig
from envace.engines.local.fidelity import FidelityProbe, make_probe
from envace.engines.local.probing import ScheduledProbe, probe_due
from envace.envs.toolworld import ToolWorldEnv
from envace.evaluation import ActLoopConfig, get_benchmark, oracle_probe_set
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("every", "total", "expected"),
    [
        (4, 8, [0, 4, 8]),
        (3, 8, [0, 3, 6, 8]),
        (1, 2, [0, 1, 2]),
        (5, 3, [0, 3]),
        (0, 8, []),
    ],
)
def test_probe_schedule_is_step_zero_every_k_and_the_last_step(every, total, expected):
    assert [s for s in range(total + 1) if probe_due(s, every, total)] == expected


def test_curves_have_one_value_per_step_from_zero_with_nulls_where_not_measured():
    history = [
        {"sft/loss": 2.0},  # SFT rows carry no step: ignored
        {"step": 0.0, "fidelity/exact_match": 0.1, "fidelity/field_f1": 0.2, "fidelity/error_agreement": 0.3},
        {"step": 1.0, "reward/mean": 0.5, "adv/act/mean": 0.0, "adv/act/std": 0.4},
        {"step": 2.0, "reward/mean": float("nan"), "adv/rehearse/mean": -0.1, "fidelity/exact_match": 0.6},
    ]
    curves = training_curves(history, steps_done=3)
    assert list(curves) == ["step", *CURVE_KEYS]
    assert curves["step"] == [0, 1, 2, 3]
    assert curves["reward/mean"] == [None, 0.5, None, None]
    assert curves["adv/act/std"] == [None, 0.4, None, None]
    assert curves["adv/rehearse/mean"] == [None, None, -0.1, None]
    assert curves["fidelity/exact_match"] == [0.1, None, 0.6, None]
    assert curves["fidelity/error_agreement"] == [0.3, None, None, None]
    assert set(CURVE_KEYS) == {
        "reward/mean",
        "adv/act/mean",
        "adv/act/std",
        "adv/rehearse/mean",
        "adv/rehearse/std",
        "fidelity/exact_match",
        "fidelity/field_f1",
        "fidelity/error_agreement",
        "val/success",
        "val/score",
        "real_env/calls_total",
    }


@pytest.fixture(scope="module")
def probe_set():
    env = ToolWorldEnv()
    adapter = get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=6), env=env)
    return oracle_probe_set(adapter, env.tasks("val")[:2])


def test_oracle_probe_set_holds_real_responses_and_is_deterministic(probe_set):
    env = ToolWorldEnv()
    again = oracle_probe_set(
        get_benchmark("toolworld", config=ActLoopConfig(max_steps_per_turn=6), env=env), env.tasks("val")[:2]
    )
    assert probe_set.n_calls > 0 and all(r.success for r in probe_set.records)
    assert [r.turns for r in again.records] == [r.turns for r in probe_set.records]
    for record, task in zip(probe_set.records, probe_set.tasks):
        executor = env.make_executor(task)
        for turn in record.turns:  # every recorded response is what the real executor returns
            real = [compact_json(executor.execute(c)) for c in turn.tool_calls]
            assert real == [compact_json(r) for r in turn.responses]


class ScriptedRehearser(torch.nn.Module):
    """A causal LM answering each REHEARSE request with the real response of the call whose arguments occur
    last in the prompt; draws from every RNG in every forward pass (the probe must restore them).

    It keeps what it has seen in its KV cache (one key per token: the token id), so it works through the
    backend's decode loop, padding holes and prefix cache like a real model.
    """

    def __init__(self, tokenizer, answers: dict[str, object]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = LlamaConfig(
            vocab_size=len(tokenizer),
            num_hidden_layers=1,
            hidden_size=8,
            intermediate_size=8,
            num_attention_heads=1,
            num_key_value_heads=1,
            max_position_embeddings=1 << 20,
        )
        self.formatter = ChatFormatter(tokenizer)
        self.reply_start = self.formatter.encode("<|im_start|>assistant\n")
        self.eot = self.formatter.end_of_turn_token_ids[0]
        self.answers = answers
        self.seen_grad_enabled: list[bool] = []

    def next_token(self, seen: list[int]) -> int:
        n = len(self.reply_start)
        starts = [i + n for i in range(len(seen) - n + 1) if seen[i : i + n] == self.reply_start]
        if not starts:  # a padding position: its output is never used
            return self.eot
        prompt = self.formatter.decode(seen[: starts[-1]])
        key = max(self.answers, key=prompt.rfind)
        reply = self.formatter.encode(render_rehearsal(as_result_object(self.answers[key]))) + [self.eot]
        done = len(seen) - starts[-1]
        return reply[done] if done < len(reply) else self.eot

    def forward(self, input_ids, attention_mask, past_key_values, logits_to_keep, **_):
        torch.rand(1), random.random(), np.random.rand()
        self.seen_grad_enabled.append(torch.is_grad_enabled())
        ids = input_ids[:, None, :, None].float()
        history = past_key_values.update(ids, ids, 0)[0][:, 0, :, 0].long()  # [rows, cache length]
        offset = history.shape[1] - input_ids.shape[1]
        logits = torch.full((len(history), len(logits_to_keep), self.config.vocab_size), -1e4)
        for row in range(len(history)):
            for column, j in enumerate(logits_to_keep.tolist()):
                upto = offset + j + 1
                seen = history[row, :upto][attention_mask[row, :upto].bool()].tolist()
                logits[row, column, self.next_token(seen)] = 0.0
        return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values)


def test_probe_scores_the_model_through_the_backend_and_leaves_training_state_alone(probe_set):
    _, tokenizer = load_model_and_tokenizer(ModelSpec(kind="tiny"))
    answers = {
        compact_json(c.arguments): r
        for rec in probe_set.records
        for t in rec.turns
        for c, r in zip(t.tool_calls, t.responses)
    }
    assert len(answers) == probe_set.n_calls  # arguments identify the calls of this probe set
    model = ScriptedRehearser(tokenizer, answers).train()
    probe = FidelityProbe(probe_set, max_new_tokens=512, seed=0)
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    metrics = probe.measure(model, tokenizer, ChatFormatter(tokenizer))
    assert metrics["fidelity/exact_match"] == metrics["fidelity/field_f1"] == 1.0
    assert metrics["fidelity/error_agreement"] == 1.0 and metrics["fidelity/parse_failure_rate"] == 0.0
    assert metrics["fidelity/n_calls"] == probe_set.n_calls and metrics["time/fidelity"] >= 0
    assert model.training and model.seen_grad_enabled and not any(model.seen_grad_enabled)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])

    wrong = ScriptedRehearser(tokenizer, {k: {"error": "nope"} for k in answers})
    scores = probe.measure(wrong, tokenizer, ChatFormatter(tokenizer))
    assert scores["fidelity/exact_match"] == 0.0 and scores["fidelity/parse_failure_rate"] == 0.0
    n_errors = sum(1 for v in answers.values() if isinstance(v, dict) and v.get("error"))
    assert math.isclose(scores["fidelity/error_agreement"], n_errors / len(answers))


@pytest.mark.parametrize(("models", "probed"), [({"act": "A", "rehearse": "R"}, "R"), ({"policy": "P"}, "P")])
def test_the_probe_measures_the_rehearse_model(models, probed):
    calls = []
    probe = SimpleNamespace(measure=lambda model, tok, fmt: calls.append(model) or {"fidelity/n_calls": 1.0})
    scheduled = ScheduledProbe(probe, 2, "rehearse")  # as the engine schedules fidelity_every=2
    assert [s for s in range(6) if scheduled.at(s, 5, models, "tok", "fmt")] == [0, 2, 4, 5]
    assert calls == [probed] * 4


def test_fidelity_every_without_a_probe_set_is_an_actionable_error():
    with pytest.raises(ValueError, match="fidelity_probe_set"):
        make_probe(LocalEngineConfig(fidelity_every=2), LocalEngine().fidelity_probe_set, "fp32")
    assert make_probe(LocalEngineConfig(fidelity_every=0), LocalEngine().fidelity_probe_set, "fp32") is None
