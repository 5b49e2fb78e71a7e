"""LocalHFBackend on the tiny random model: determinism, limits, stops, order, token counts, prefix cache, precision."""

from __future__ import annotations

import pytest
import torch

from envace.core.prompts import ChatFormatter
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.local import LocalHFBackend
from envace.models import ModelSpec, load_model_and_tokenizer
from envace.runtime.decode import sample_next_tokens
from envace.runtime.precision import resolve_precision

torch.set_num_threads(1)

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
)


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


# ---- prefix KV cache and precision ---------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Please help the user with the request."}
USER_TURNS = ("The user wants to know the weather in Paris tomorrow.", "Then book a hotel.", "Is there anything else?")


def _multi_turn(backend: LocalHFBackend, temperature: float) -> list[list[ChatOutput]]:
    """Three turns of two conversations (one with tools) plus one fresh request per turn, batched.

    Turn t+1 of a conversation = its turn-t messages + the assistant reply + the next user message.
    """
    conversations = [[SYSTEM], [SYSTEM]]
    turns = []
    for t, text in enumerate(USER_TURNS):
        requests = []
        for c, messages in enumerate(conversations):
            messages.append({"role": "user", "content": text})
            requests.append(
                ChatRequest(
                    messages=tuple(messages),
                    tools=TOOLS if c else None,
                    temperature=temperature,
                    seed=10 * c + t,
                    max_new_tokens=10,
                )
            )
        requests.append(_request(f"fresh {t}", temperature=temperature, seed=t, max_new_tokens=6))
        outputs = backend.generate(requests)
        for messages, output in zip(conversations, outputs, strict=False):
            messages.append({"role": "assistant", "content": output.text})
        turns.append(outputs)
    return turns


@pytest.fixture(scope="module")
def tiny_model():
    return load_model_and_tokenizer(ModelSpec("tiny", seed=1))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_prefix_cache_exact(tiny_model, temperature):
    model, tok = tiny_model
    cached = LocalHFBackend(model, tok, batch_size=3, precision="fp32")
    fresh = LocalHFBackend(model, tok, batch_size=3, precision="fp32", prefix_cache_tokens=0)
    with_cache, without = _multi_turn(cached, temperature), _multi_turn(fresh, temperature)
    assert with_cache == without  # texts, token counts and finish reasons
    assert len({o.text for turn in with_cache for o in turn}) > 3  # not a degenerate constant reply
    assert fresh.prefix_cache is None and fresh.prefix_cache_hits == fresh.cached_tokens_reused == 0
    # turn 1: the conversation without tools reuses the system-prompt head of the one with tools, encoded
    # just before it in the same batch; turns 2 and 3: both conversations hit (prefixes of different
    # lengths), the short fresh row in the same batch does not
    assert cached.prefix_cache_hits == 5
    assert cached.prompt_tokens_encoded + cached.cached_tokens_reused == fresh.prompt_tokens_encoded


@pytest.mark.parametrize("cache_tokens", [4096, 0])
def test_prompts_are_encoded_row_by_row_and_shared_within_a_batch(tiny_model, cache_tokens):
    """A batch's prompts are not padded to the longest one; an identical prompt (parallel rehearsal
    attempts) is encoded once when the cache is on. Outputs are those of each request alone."""
    model, tok = tiny_model
    backend = LocalHFBackend(model, tok, batch_size=4, precision="fp32", prefix_cache_tokens=cache_tokens)
    long = (SYSTEM, {"role": "user", "content": " ".join(USER_TURNS)})
    short = ({"role": "user", "content": "hi"},)
    requests = [
        ChatRequest(messages=long, temperature=0.8, seed=1, max_new_tokens=6),
        ChatRequest(messages=long, temperature=0.8, seed=2, max_new_tokens=6),
        ChatRequest(messages=short, temperature=0.8, seed=3, max_new_tokens=6),
    ]
    outputs = backend.generate(requests)
    alone = [LocalHFBackend(model, tok, precision="fp32", prefix_cache_tokens=0).generate([r])[0] for r in requests]
    assert outputs == alone
    n_long, n_short = outputs[0].prompt_tokens, outputs[2].prompt_tokens
    if cache_tokens:  # the second copy of the long prompt feeds only its last token
        assert backend.prefix_cache_hits == 1 and backend.cached_tokens_reused == n_long - 1
        assert backend.prompt_tokens_encoded == n_long + 1 + n_short
    else:  # each prompt encoded in full, once
        assert backend.prompt_tokens_encoded == 2 * n_long + n_short


def test_prefix_cache_reuses_the_previous_turn(tiny_model):
    model, tok = tiny_model
    backend = LocalHFBackend(model, tok, prefix_cache_tokens=4096)
    first = [SYSTEM, {"role": "user", "content": USER_TURNS[0]}]
    out = backend.generate([ChatRequest(messages=tuple(first), max_new_tokens=8)])[0]
    assert backend.prefix_cache_hits == 0 and len(backend.prefix_cache) == 1
    assert backend.prefix_cache.tokens == out.prompt_tokens + out.completion_tokens - 1  # last token never fed
    second = (*first, {"role": "assistant", "content": out.text}, {"role": "user", "content": USER_TURNS[1]})
    out2 = backend.generate([ChatRequest(messages=second, max_new_tokens=8)])[0]
    assert backend.prefix_cache_hits == 1
    # at least the whole first prompt is reused (the reply's re-tokenisation may differ from the sample)
    assert out.prompt_tokens <= backend.cached_tokens_reused < out2.prompt_tokens
    assert backend.prompt_tokens_encoded == out.prompt_tokens + out2.prompt_tokens - backend.cached_tokens_reused


def test_prefix_cache_respects_its_token_budget(tiny_model):
    model, tok = tiny_model
    backend = LocalHFBackend(model, tok, batch_size=2, prefix_cache_tokens=120)
    sizes = []
    for i in range(6):
        messages = (SYSTEM, {"role": "user", "content": f"question number {i} " * (i + 1)})
        backend.generate([ChatRequest(messages=messages, max_new_tokens=6, seed=i)])
        sizes.append((backend.prefix_cache.tokens, len(backend.prefix_cache)))
    assert all(tokens <= 120 for tokens, _ in sizes) and max(tokens for tokens, _ in sizes) > 60
    assert sizes[-1][1] < 6  # old entries were evicted
    assert backend.prefix_cache_hits >= 4  # the shared system prompt
    tiny = LocalHFBackend(model, tok, prefix_cache_tokens=20)  # smaller than any sequence: stores nothing
    tiny.generate([ChatRequest(messages=(SYSTEM, {"role": "user", "content": "hi"}), max_new_tokens=4)] * 2)
    assert len(tiny.prefix_cache) == 0 and tiny.prefix_cache_hits == 0
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        LocalHFBackend(model, tok, prefix_cache_tokens=-1)


def test_precision_bf16_runs_and_auto_resolves(tiny_model):
    model, tok = tiny_model
    requests = [_request("hello", max_new_tokens=6), _request("hello", temperature=0.8, seed=3, max_new_tokens=6)]
    bf16 = LocalHFBackend(model, tok, precision="bf16")
    assert bf16.precision == "bf16"
    outputs = bf16.generate(requests)
    assert all(0 < o.completion_tokens <= 6 for o in outputs)
    assert bf16.generate(requests) == outputs  # deterministic, also through the cache
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast only: weights untouched
    auto = LocalHFBackend(model, tok, precision="auto")
    # bf16 only where the CPU has it *and* this model measures faster in it
    assert auto.precision == resolve_precision("auto", model=model)
    assert LocalHFBackend(model, tok).precision == "fp32"  # the constructor's default: old behaviour
    with pytest.raises(ValueError, match="precision"):
        LocalHFBackend(model, tok, precision="fp16")


def test_sample_next_tokens_inverse_cdf_per_row():
    logits = torch.tensor([[0.0, 2.0, 1.0], [0.5, 0.0, 0.1], [1.0, 1.0, 3.0]])
    seeds = [None, 5, 6]
    generators = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    tokens = sample_next_tokens(logits, [0.0, 0.7, 1.3], generators)
    assert tokens[0] == 1  # greedy: argmax, no draw
    for row, (temperature, seed) in enumerate(((0.7, 5), (1.3, 6)), start=1):
        u = torch.rand(1, generator=torch.Generator().manual_seed(seed))
        cdf = torch.softmax(logits[row] / temperature, dim=-1).cumsum(0)
        assert tokens[row] == int((cdf <= u * cdf[-1]).sum())
        alone = sample_next_tokens(logits[row : row + 1], [temperature], [torch.Generator().manual_seed(seed)])
        assert alone.item() == tokens[row]  # independent of the other rows
    n = 4000
    many = sample_next_tokens(logits[1].expand(n, 3), [0.7] * n, [torch.Generator().manual_seed(i) for i in range(n)])
    freq = torch.bincount(many, minlength=3).float() / n
    torch.testing.assert_close(freq, torch.softmax(logits[1] / 0.7, dim=-1), atol=0.03, rtol=0)


def test_a_measured_contenders_prefix_caches_are_released(tiny_model):
    """The evaluate stage empties a contender's caches before the next one runs, so that two caches of
    ``eval.prefix_cache_tokens`` never stack; the released backend still answers (cold) exactly as before."""
    from envace.stages.evaluate import release_prefix_caches

    model, tok = tiny_model
    backend = LocalHFBackend(model, tok, prefix_cache_tokens=4096, precision="fp32")
    request = ChatRequest(messages=(SYSTEM, {"role": "user", "content": USER_TURNS[0]}), max_new_tokens=6, seed=3)
    first = backend.generate([request])
    assert len(backend.prefix_cache) == 1 and backend.prefix_cache.tokens > 0
    release_prefix_caches(backend, backend, object())  # the actor is also the rehearser; a remote backend has none
    assert len(backend.prefix_cache) == 0 and backend.prefix_cache.tokens == 0
    assert backend.generate([request]) == first
