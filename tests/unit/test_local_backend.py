"""LocalHFBackend on the tiny random model: determinism, limits, stops, order, token counts."""

from __future__ import annotations

import pytest
import torch

from envace.core.prompts import ChatFormatter
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.local import LocalHFBackend
from envace.models import ModelSpec, load_model_and_tokenizer

torch.set_num_threads(1)

TOOLS = ({"type": "function", "function": {
    "name": "get_weather", "description": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}},)


@pytest.fixture(scope="module")
def backend() -> LocalHFBackend:
    model, tok = load_model_and_tokenizer(ModelSpec("tiny", seed=1))
    return LocalHFBackend(model, tok, batch_size=3)


def _request(text: str, **kwargs) -> ChatRequest:
    kwargs.setdefault("max_new_tokens", 12)
    return ChatRequest(messages=({"role": "user", "content": text},), **kwargs)


def test_greedy_is_deterministic(backend):
    requests = [_request("hello"), _request("weather in Paris?", tools=TOOLS)]
    first, second = backend.generate(requests), backend.generate(requests)
    assert first == second and all(isinstance(o, ChatOutput) for o in first)
    assert first[0].text != first[1].text


def test_seeded_sampling_is_deterministic_and_seed_dependent(backend):
    same = [_request("hello", temperature=1.0, seed=7), _request("hello", temperature=1.0, seed=7)]
    a, b = backend.generate(same)
    assert a == b == backend.generate([same[0]])[0]  # independent of batch composition
    other = backend.generate([_request("hello", temperature=1.0, seed=8)])[0]
    greedy = backend.generate([_request("hello")])[0]
    assert a.text != other.text and a.text != greedy.text


def test_max_new_tokens_and_token_counts(backend):
    requests = [_request("count me", max_new_tokens=n) for n in (1, 5, 9)]
    outputs = backend.generate(requests)
    prompt = backend.formatter.render(requests[0].messages, None, True)
    for n, out in zip((1, 5, 9), outputs, strict=True):
        assert out.prompt_tokens == len(backend.formatter.encode(prompt))
        assert out.completion_tokens <= n
        if out.finish_reason == "length":
            assert out.completion_tokens == n
    assert outputs[2].text.startswith(outputs[1].text)  # greedy: a shorter budget is a prefix


def test_batch_order_preserved_and_batching_invariant(backend):
    requests = [_request("x" * (i * 7 + 1), temperature=float(i % 2), seed=i) for i in range(7)]
    batched = backend.generate(requests)
    single = [backend.generate([r])[0] for r in requests]
    assert batched == single
    assert backend.generate(requests[::-1]) == batched[::-1]


def test_stop_string_cuts_text(backend):
    full = backend.generate([_request("stop test", max_new_tokens=20)])[0]
    assert len(full.text) > 6, full
    stop = full.text[3:6]
    cut = backend.generate([_request("stop test", max_new_tokens=20, stop=(stop,))])[0]
    assert cut.text == full.text[: full.text.find(stop)]
    assert cut.finish_reason == "stop" and cut.completion_tokens < full.completion_tokens


def test_generation_stops_at_end_of_turn_token():
    model, tok = load_model_and_tokenizer(ModelSpec("tiny", seed=2))
    formatter = ChatFormatter(tok)
    eot = formatter.end_of_turn_token_ids[0]
    calls = {"n": 0}

    def force_eot_on_fourth_step(module, inputs, output):
        calls["n"] += 1
        if calls["n"] % 4 == 0:
            output.logits[:, -1, eot] = 1e4
        return output

    model.register_forward_hook(force_eot_on_fourth_step)
    out = LocalHFBackend(model, tok, formatter=formatter).generate([_request("hi", max_new_tokens=30)])[0]
    assert out.finish_reason == "stop" and out.completion_tokens == 4
    assert "<|im_end|>" not in out.text


def test_from_spec_and_invalid_batch_size():
    backend = LocalHFBackend.from_spec(ModelSpec("tiny"), batch_size=2)
    assert backend.name == "local:tiny" and backend.batch_size == 2
    assert backend.generate([]) == []
    with pytest.raises(TypeError, match="from_spec"):
        LocalHFBackend("tiny", None)
    with pytest.raises(ValueError, match="batch_size"):
        LocalHFBackend(backend.model, backend.tokenizer, batch_size=0)
