"""What the act/rehearse agent loop needs to know besides verl's own config (no verl import here).

The settings travel inside verl's Hydra config as a top-level ``envace`` node (the launcher adds it with
``+envace.<key>=<value>`` overrides), so every Ray worker that instantiates the agent loop reads the same
values from ``trainer_config.config.envace``. ``LoopSettings.from_mapping`` rebuilds them and checks them;
``LoopSettings.to_flat`` is the inverse used by the config builder. The temperatures and turn/token limits are
the rollout budget (``envace.core.rollout_budget.RolloutBudget``, which ``LoopSettings`` extends and which checks
them); the local engine's ``RolloutConfig`` extends the same class.

Choices:
- ``responses`` says who answers tool calls: ``policy`` (the REHEARSE role, the method), ``executor``
  (a real executable environment rebuilt in the worker from the dataset row) or ``simulator`` (a frozen
  simulator behind an OpenAI-compatible endpoint). It follows from the variant (``grpo`` uses
  ``grpo_responses``; every other variant rehearses with the policy).
- ``trainable_roles`` follow ``envace.engines.base.VARIANTS``; ``per_role`` (two separate models) is
  refused by the config builder: verl trains one actor.
- ``max_tool_response_length`` / ``tool_response_truncate_side`` cut over-long tool responses before ACT reads
  them, by verl ``ToolAgentLoop``'s rule (``episode.truncate_tool_response``); None never cuts (the local
  engine's behaviour).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from envace.core.records import Role
from envace.core.rollout_budget import RolloutBudget
from envace.engines.base import get_variant

AGENT_LOOP_NAME = "envace_act_rehearse"
TRAINER_MODE = "envace"
SETTINGS_NODE = "envace"
RESPONSE_SOURCES = ("policy", "executor", "simulator")
CHAT_TEMPLATES = ("auto", "model", "chatml")
TRUNCATE_SIDES = ("left", "right", "middle")  # verl ToolAgentLoop's tool_response_truncate_side values


@dataclass(frozen=True)
class EndpointSettings:
    """An OpenAI-compatible endpoint (LLM judge or frozen simulator)."""

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    max_retries: int = 3
    timeout_s: float = 60.0


@dataclass(frozen=True)
class LoopSettings(RolloutBudget):
    """Everything the agent loop reads from ``config.envace`` (plain values only): the rollout budget
    (``envace.core.rollout_budget``, checked there) and the verl-side choices below."""

    variant: str = "envace"
    responses: str = "policy"
    data_source: str = "toolworld"
    reward: str = "verifiable"  # judge name (envace.judges) or "verifiable"
    argument_credit: float = 0.0  # the verifiable reward's near-miss credit (judge.argument_credit)
    baseline: str = "output_mean"
    chat_template: str = "auto"
    max_tool_response_length: int | None = None  # characters; None = tool responses are never cut
    tool_response_truncate_side: str = "middle"
    seed: int = 0
    judge: EndpointSettings = field(default_factory=EndpointSettings)
    simulator: EndpointSettings = field(default_factory=EndpointSettings)

    def __post_init__(self) -> None:
        super().__post_init__()
        variant = get_variant(self.variant)  # unknown names raise listing the valid ones
        if self.responses not in RESPONSE_SOURCES:
            raise ValueError(f"envace.responses={self.responses!r}; valid: {list(RESPONSE_SOURCES)}")
        if variant.rehearse_by_policy and self.responses != "policy":
            raise ValueError(
                f"variant {self.variant!r} rehearses with the policy; envace.responses must be "
                f"'policy', got {self.responses!r} (only grpo takes executor/simulator responses)"
            )
        if not variant.rehearse_by_policy and self.responses == "policy":
            raise ValueError(
                f"variant {self.variant!r} takes responses from outside the policy; set "
                "envace.responses to 'executor' or 'simulator'"
            )
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(f"envace.chat_template={self.chat_template!r}; valid: {list(CHAT_TEMPLATES)}")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(
                f"envace.tool_response_truncate_side={self.tool_response_truncate_side!r} "
                f"(engine.tool_response_truncate_side); valid: {list(TRUNCATE_SIDES)}"
            )
        if self.max_tool_response_length is not None and self.max_tool_response_length < 1:
            raise ValueError(
                f"envace.max_tool_response_length={self.max_tool_response_length} (engine.max_tool_response_length) "
                "must be >= 1 character, or null to never cut tool responses"
            )

    @property
    def trainable_roles(self) -> frozenset[Role]:
        return get_variant(self.variant).trainable_roles

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> LoopSettings:
        """Settings from a plain mapping (``OmegaConf.to_container(config.envace)``); unknown keys raise."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown envace settings {unknown}; valid keys: {sorted(known)}")
        for name in ("judge", "simulator"):
            if name in values and not isinstance(values[name], EndpointSettings):
                values[name] = EndpointSettings(**dict(values[name] or {}))
        return cls(**values)

    def to_flat(self) -> dict[str, Any]:
        """``{"variant": ..., "judge.base_url": ...}``: one entry per leaf (for Hydra overrides)."""
        flat: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                flat.update({f"{key}.{k}": v for k, v in value.items()})
            else:
                flat[key] = value
        return flat
