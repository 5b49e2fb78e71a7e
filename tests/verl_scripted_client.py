"""Test double: verl's ``LLMServerClient`` with scripted token outputs (no model), picklable into a Ray actor.

It implements what agent loops call on their ``server_manager`` - ``await generate(request_id, *, prompt_ids,
sampling_params, **kwargs) -> TokenOutput`` - from scripts keyed by request id (the envace loop uses one sticky id per
role stream, ``{uid}_{session}-act`` / ``-rehearse``): the n-th call of a request id returns its n-th script. Every
token's log-prob is ``LOGPROB`` (when log-probs are asked for); a script wrapped as ``aborted(tokens)`` answers with
those tokens and ``stop_reason="aborted"`` (vLLM aborting the request part-way). An unscripted call is an error:
these tests play known trajectories. Plain Python state only, so verl's ``AgentLoopWorker`` Ray actor can receive it
by pickle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verl.workers.rollout.replica import TokenOutput

LOGPROB = -0.25


def aborted(tokens: Sequence[int]) -> dict[str, Any]:
    """A script entry the server aborts after ``tokens``."""
    return {"tokens": list(tokens), "stop_reason": "aborted"}


class ScriptedTokenClient:
    """Serves ``generate`` calls from ``scripts``: {request id: [token ids | aborted(ids), ...] in call order}."""

    def __init__(self, scripts: Mapping[str, Sequence[Any]], global_steps: int = 1) -> None:
        def entry(target: Any) -> dict[str, Any]:
            return dict(target) if isinstance(target, Mapping) else {"tokens": list(target), "stop_reason": "completed"}

        self.scripts = {key: [entry(t) for t in targets] for key, targets in scripts.items()}
        self.global_steps = global_steps
        self.calls: dict[str, int] = {}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        n = self.calls.get(request_id, 0)
        self.calls[request_id] = n + 1
        targets = self.scripts.get(request_id)
        if targets is None or n >= len(targets):
            raise KeyError(f"no script for call {n} of request {request_id!r} (scripted: {sorted(self.scripts)})")
        steps = {key: self.global_steps for key in ("global_steps", "min_global_steps", "max_global_steps")}
        script = targets[n]
        tokens = script["tokens"][: int(sampling_params.get("max_tokens", len(script["tokens"])))]
        logprobs = [LOGPROB] * len(tokens) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=tokens, log_probs=logprobs, stop_reason=script["stop_reason"], extra_fields=steps)
