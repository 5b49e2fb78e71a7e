"""The training-engine interface: what an engine consumes, how rewards plug in, and the variants.

An engine (``local``: HF transformers + torch; ``verl``: the GPU plugin, written elsewhere) trains one
policy that plays ACT and REHEARSE with role-wise GRPO (docs/method.md §7). Everything an engine needs to know
about one instruction lives in an ``EpisodeSpec``; everything it needs to score a rollout is a
``RewardFn``; the ablation being run is a registered ``Variant``.

Deliberate choices (and deviations from the reference implementation):
- The REHEARSE prompt has no few-shot examples at all (``envace.core.rehearse_context``): it holds the
  tool's schema and the conversation the trajectory itself played; the reference leaks later-turn ground
  truth into the rehearsal prompt as examples.
- A ``RewardFn`` may report ``TrajectoryStatus.JUDGE_FAILED``: such a trajectory is excluded from the
  loss and counted, never silently scored 0 (the reference scores it 0).
- The built-in ``toolworld_verifiable_reward`` (``judge=verifiable``, ``envace.envs.toolworld.reward``)
  scores gold-call matching and the answer's key values; both parts follow the trajectory's own responses
  (real or rehearsed) wherever gold read a value from a response, so an imagined world that is consistent
  scores as gold does. The checklist judges (``judge=rule|llm|composite``) plug in its place.
- The ``frozen_*`` variants freeze one *role* (its outputs get no gradient) even though weights are
  shared; the reference froze per worker group, which in shared mode froze both roles.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envace.core.records import EpisodeSpec, Role
from envace.core.registry import Registry

logger = logging.getLogger(__name__)


# ---- what an engine consumes ----------------------------------------------------------------------
# GoldStep, EpisodeSpec: envace.core.records (one record, shared by every data source); specs are built by
# envace.data.specs. Rewards: the contract is envace.core.reward (RewardFn, RewardOutcome); the tool
# world's built-in one is envace.envs.toolworld.reward.toolworld_verifiable_reward.


# ---- variants -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One ablation row of docs/method.md §9, selected by name from config."""

    name: str
    trainable_roles: frozenset[Role]
    rolewise_baseline: bool  # per (prompt, role) baselines vs one baseline per prompt
    separate_models: bool  # one model per role (per_role) vs shared weights
    rehearse_by_policy: bool  # False: responses come from a real executor or a frozen simulator
    description: str = ""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("envace", frozenset(Role), True, False, True, "shared weights, role-wise baselines"),
        Variant("grpo", frozenset({Role.ACT}), False, False, False, "ACT only; external responses"),
        Variant("per_role", frozenset(Role), True, True, True, "one model per role"),
        Variant("frozen_act", frozenset({Role.REHEARSE}), True, False, True, "train REHEARSE outputs only"),
        Variant("frozen_rehearse", frozenset({Role.ACT}), True, False, True, "train ACT outputs only"),
    )
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise KeyError(f"unknown training variant {name!r}; valid variants: {sorted(VARIANTS)}")
    return VARIANTS[name]


# ---- engines --------------------------------------------------------------------------------------
StepCallback = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class TrainResult:
    steps_done: int
    history: tuple[dict[str, float], ...] = ()
    checkpoint_dir: str | None = None
    artifacts: Mapping[str, str] = field(default_factory=dict)
    # model name -> HF directory of the weights RL started from when the run had an SFT warm-up (the
    # baseline a trained model is compared with); empty without one
    baseline: Mapping[str, str] = field(default_factory=dict)
    # in-process handles (e.g. the trained torch modules by name); not part of equality or repr
    models: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def final_metrics(self) -> dict[str, float]:
        return dict(self.history[-1]) if self.history else {}


class Engine(abc.ABC):
    """A training engine: ``train(config, data, callbacks) -> TrainResult``.

    ``data`` are ``EpisodeSpec``s; ``callbacks`` receive ``(step, metrics)`` after every optimiser step
    (the pipeline logs them to MLflow). ``config`` is the engine's own typed config dataclass.
    """

    name: str = ""

    @abc.abstractmethod
    def train(
        self, config: Any, data: Sequence[EpisodeSpec], callbacks: Sequence[StepCallback] = ()
    ) -> TrainResult: ...


# engines are registered by their modules (``@register_engine``); the built-in ones are named lazily, so
# that the first ``get_engine(name)`` imports them and importing this package loads none
ENGINES: Registry[Callable[..., Engine]] = Registry("engine", unknown="unknown engine {name!r}; valid engines: {names}")
ENGINES.register_lazy("local", "envace.engines.local.engine:LocalEngine")
ENGINES.register_lazy("verl", "envace.engines.verl.engine:VerlEngine")


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    """Decorator registering an engine factory (usually the class) under ``name``."""
    return ENGINES.register(name)


def available_engines() -> list[str]:
    return ENGINES.names()


def get_engine(name: str, **kwargs: Any) -> Engine:
    """Instantiate the engine registered as ``name``; unknown names raise listing the valid ones."""
    return ENGINES.get(name)(**kwargs)
