"""τ²-Bench run configuration (no tau2 import here).

Modes — how the customer side of a τ² conversation is played:

* ``solo`` — tau2's solo mode (telecom only): no customer; the agent gets the ticket, its own tools and
  the customer's device tools, and ends with the ``done`` tool. Needs no user LLM: runs offline.
* ``user_llm`` — the standard benchmark: tau2's own ``UserSimulator`` (LiteLLM) talks to an LLM behind
  an OpenAI-compatible endpoint (``user_base_url``, ``user_model``; key in the env var named by
  ``user_api_key_env``). Not runnable without such an endpoint.
* ``user_seat`` — the standard benchmark with tau2's user-simulator prompt and role handling, but the
  customer's LLM is any ``ChatBackend`` on the generation seat ``"customer"`` (``run_tau2(customer=…)``):
  its requests are batched across episodes like the agent's (the ``user_llm`` path calls LiteLLM
  synchronously, one conversation at a time). Runnable whenever such a backend is given.
* ``scripted_user`` — an LLM-free customer for plumbing checks: it performs the task's gold customer
  actions, states the reason for the call, and ends the conversation after the agent's first text
  reply. Its scores are **not** τ²-Bench scores.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom")
SOLO_DOMAINS = frozenset({"telecom"})
DEFAULT_SPLIT = "base"  # tau2's standard task set of each domain (airline 50, retail 114, telecom 114)


class Tau2Mode(str, enum.Enum):
    SOLO = "solo"
    USER_LLM = "user_llm"
    USER_SEAT = "user_seat"
    SCRIPTED_USER = "scripted_user"


class Tau2NotRunnable(RuntimeError):
    """A domain/mode combination that cannot run with this configuration (the message says why)."""


@dataclass(frozen=True)
class Tau2Config:
    """Agent sampling, budgets (tau2's defaults) and the customer side."""

    mode: Tau2Mode = Tau2Mode.SOLO
    max_new_tokens: int = 1024
    temperature: float = 0.0
    seed: int = 0
    max_steps: int = 200  # tau2 DEFAULT_MAX_STEPS (orchestrator steps: agent, user and tool messages)
    max_errors: int = 10  # tau2 DEFAULT_MAX_ERRORS (failed tool calls)
    user_model: str = ""
    user_base_url: str = ""
    user_api_key_env: str = ""
    user_temperature: float = 0.0
    user_max_new_tokens: int = 512

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Tau2Mode(self.mode))
        if self.max_steps < 1 or self.max_errors < 1:
            raise ValueError(f"Tau2Config: max_steps={self.max_steps} and max_errors={self.max_errors} must be >= 1")

    def unavailable(self, domain: str) -> str:
        """Why ``domain`` cannot run in this mode ('' when it can)."""
        if domain not in DOMAINS:
            return f"unknown τ² domain {domain!r}; valid: {', '.join(DOMAINS)}"
        if self.mode is Tau2Mode.SOLO and domain not in SOLO_DOMAINS:
            return (
                f"τ² {domain} has no solo mode (its tasks need a customer); use mode='user_llm' with a "
                "user-simulator endpoint, or 'scripted_user' for an LLM-free plumbing check"
            )
        if self.mode is Tau2Mode.USER_LLM and not (self.user_base_url and self.user_model):
            return (
                "τ² standard mode needs a user-simulator LLM behind an OpenAI-compatible endpoint: set "
                "user_base_url and user_model (and user_api_key_env if it needs a key)"
            )
        return ""


def parse_subset(subset: str) -> list[tuple[str, str]]:
    """``"telecom"``, ``"airline:test,retail"``, ``"all"`` (three domains), ``"test"`` (their test splits)
    → ``[(domain, split)]``. Unknown domains raise ``KeyError`` listing the valid ones."""
    out: list[tuple[str, str]] = []
    for part in (p.strip() for p in subset.split(",")):
        if not part:
            continue
        if part in ("all", "test", "train"):
            split = DEFAULT_SPLIT if part == "all" else part
            out.extend((d, split) for d in DOMAINS)
            continue
        domain, _, split = part.partition(":")
        if domain not in DOMAINS:
            raise KeyError(
                f"unknown τ² domain {domain!r} in subset {subset!r}; valid: {', '.join(DOMAINS)}, "
                "all, test, train (optionally domain:split)"
            )
        out.append((domain, split or DEFAULT_SPLIT))
    if not out:
        raise KeyError(f"τ² subset {subset!r} names no domain; use e.g. 'telecom' or 'all'")
    return list(dict.fromkeys(out))
