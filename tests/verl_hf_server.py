"""Test double: a token-in/token-out server manager backed by a local Hugging Face model (CPU or one GPU).

It implements the part of verl's ``LLMServerClient`` that agent loops use — ``await generate(request_id,
*, prompt_ids, sampling_params, **kwargs) -> TokenOutput`` — with real ``transformers`` forward passes,
so the act/rehearse agent loop can be driven without vLLM or Ray: unit tests on CPU, debugging a loop
on a workstation. It is not a throughput backend (one request at a time, KV cache per request).

Sampling: ``temperature`` (0 = greedy), ``max_tokens``, ``stop_token_ids`` (default: the model's
generation-config eos ids); the stop token is returned as the last token, as vLLM does.
``top_p``/``top_k`` other than "off" are refused rather than silently ignored. Log-probs (when
``logprobs`` is truthy) are those of the sampled token under the distribution it was drawn from
(logits / T; the raw distribution for greedy) — what verl's actor recomputes with the same temperature.
Seeds derive from (seed, request_id, call number) through ``zlib.crc32``.

A ``guide`` (optional) may return target tokens for a request; they are then forced (teacher forcing,
like vLLM's structured outputs taken to the limit) while the recorded log-probs stay the model's own —
tests use it to make a random tiny model play a known well-formed trajectory.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

from envace.core.wire import as_result_object, render_rehearsal, render_tool_calls


class HFServerManager:
    """Serves ``generate`` calls from one in-process HF causal LM."""

    def __init__(
        self,
        model: Any,
        *,
        seed: int = 0,
        global_steps: int = 0,
        device: str | None = None,
        guide: Callable[[str, list[int]], Sequence[int] | None] | None = None,
    ) -> None:
        self.model = model.eval()
        self.guide = guide
        self.seed = seed
        self.global_steps = global_steps
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.calls = 0
        self.requests: list[dict[str, Any]] = []  # (request_id, prompt length, params) of every call, for inspection
        self._lock = threading.Lock()

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        return await asyncio.to_thread(self._generate, request_id, list(prompt_ids), dict(sampling_params))

    def _stop_ids(self, params: dict[str, Any]) -> set[int]:
        ids = params.get("stop_token_ids") or self.model.generation_config.eos_token_id
        return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids]) if i is not None}

    def _generate(self, request_id: str, prompt_ids: list[int], params: dict[str, Any]) -> TokenOutput:
        if params.get("top_p", 1.0) not in (None, 1.0) or params.get("top_k", -1) not in (None, -1, 0):
            raise NotImplementedError(
                f"HFServerManager samples with temperature only; got top_p="
                f"{params.get('top_p')}, top_k={params.get('top_k')}"
            )
        if not prompt_ids:
            raise ValueError("HFServerManager.generate: empty prompt_ids")
        with self._lock:
            self.calls += 1
            self.requests.append({"request_id": request_id, "prompt_len": len(prompt_ids), "params": params})
            seed = zlib.crc32(f"{self.seed}|{request_id}|{self.calls}".encode()) & 0x7FFFFFFF
            forced = list(self.guide(request_id, prompt_ids) or []) if self.guide else []
            tokens, logprobs = self._sample(prompt_ids, params, torch.Generator().manual_seed(seed), forced)
        fields = {
            "global_steps": self.global_steps,
            "min_global_steps": self.global_steps,
            "max_global_steps": self.global_steps,
        }
        return TokenOutput(
            token_ids=tokens,
            log_probs=logprobs if params.get("logprobs") else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields=fields,
        )

    @torch.no_grad()
    def _sample(
        self, prompt_ids: list[int], params: dict[str, Any], generator: torch.Generator, forced: Sequence[int] = ()
    ) -> tuple[list[int], list[float]]:
        temperature = float(params.get("temperature", 1.0) or 0.0)
        max_tokens = int(params.get("max_tokens", 64))
        stop = self._stop_ids(params)
        tokens: list[int] = []
        logprobs: list[float] = []
        past = None
        feed = torch.tensor([prompt_ids], device=self.device)
        for _ in range(max_tokens):
            if forced and len(tokens) == len(forced):
                break  # the target ended without a stop token: like a server stopping on it silently
            out = self.model(input_ids=feed, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float().cpu()
            scaled = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
            if forced:
                token = int(forced[len(tokens)])
            elif temperature > 0:
                token = int(torch.multinomial(scaled.exp(), 1, generator=generator))
            else:
                token = int(torch.argmax(scaled))
            tokens.append(token)
            logprobs.append(float(scaled[token]))
            if token in stop:
                break
            feed = torch.tensor([[token]], device=self.device)
        return tokens, logprobs


class ScriptedGuide:
    """A ``guide`` that forces the n-th generation of each request id (one per role stream) to a script.

    ``scripts`` maps a request id (the agent loop uses ``{uid}_{session}-act`` / ``-rehearse``) to target
    token lists in call order; request ids without a script, or past its end, sample freely.
    """

    def __init__(self, scripts: dict[str, Sequence[Sequence[int]]]) -> None:
        self.scripts = {key: [list(t) for t in targets] for key, targets in scripts.items()}
        self.calls: dict[str, int] = {}

    def __call__(self, request_id: str, prompt_ids: list[int]) -> list[int] | None:
        targets = self.scripts.get(request_id)
        n = self.calls.get(request_id, 0)
        self.calls[request_id] = n + 1
        return targets[n] if targets is not None and n < len(targets) else None


def gold_texts(spec: Any) -> dict[str, list[str]]:
    """What ACT and REHEARSE say in the reference trajectory of an ``EpisodeSpec`` (in generation order):
    ACT: each gold step's calls, then the turn's reference reply; REHEARSE: each recorded response."""
    act: list[str] = []
    rehearse: list[str] = []
    for turn, steps in enumerate(spec.gold):
        for step in steps:
            act.append(render_tool_calls(step.calls))
            rehearse.extend(render_rehearsal(as_result_object(r)) for r in (step.responses or ()))
        act.append(spec.gold_answers[turn] if turn < len(spec.gold_answers) else "")
    return {"act": act, "rehearse": rehearse}
