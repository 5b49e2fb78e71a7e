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
- The built-in ``toolworld_verifiable_reward`` (``judge=verifiable``) scores gold-call matching and the
  answer's key values; both parts follow the trajectory's own responses (real or rehearsed) wherever gold
  read a value from a response, so an imagined world that is consistent scores as gold does. The
  checklist judges (``judge=rule|llm|composite``) plug in its place.
- The ``frozen_*`` variants freeze one *role* (its outputs get no gradient) even though weights are
  shared; the reference froze per worker group, which in shared mode froze both roles.
"""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    Any,
    NamedTuple,
    Protocol,
    runtime_checkable,
)

from envace.core.answers import answer_target, mentions, turn_answer_bindings
from envace.core.bindings import MISSING as BINDING_MISSING
from envace.core.bindings import CallCorrespondence
from envace.core.records import EpisodeSpec, GoldStep, Role, Trajectory, TrajectoryStatus
from envace.core.registry import Registry
from envace.data.cm2_episodes import cm2_row_to_episode_spec
from envace.envs.base import Executor, Task

logger = logging.getLogger(__name__)


# ---- what an engine consumes ----------------------------------------------------------------------
# GoldStep, EpisodeSpec, tool_schema_name: envace.core.records (one record, shared by every data source)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _default_answer_values(answer: str) -> tuple[str, ...]:
    """Numbers in a reference reply: the values a correct reply must repeat (when a task gives none)."""
    return tuple(dict.fromkeys(_NUMBER.findall(answer or "")))


def gold_with_responses(task: Task, executor: Executor) -> tuple[tuple[GoldStep, ...], ...]:
    """Run a task's gold calls on a fresh real executor, turn by turn, recording the real responses."""
    return tuple(
        tuple(GoldStep(calls=tuple(step), responses=tuple(executor.execute(c) for c in step)) for step in steps)
        for steps in task.gold_calls
    )


def episode_spec_from_task(task: Task, executor: Executor | None = None) -> EpisodeSpec:
    """Convert a tool-world ``Task``. With a fresh ``executor``, gold calls are run to record responses
    (needed for REHEARSE examples and SFT targets); without one, responses stay unknown."""
    if executor is not None:
        gold = gold_with_responses(task, executor)
    else:
        gold = tuple(tuple(GoldStep(calls=tuple(step)) for step in steps) for steps in task.gold_calls)
    n_turns = len(task.user_turns)
    answers = tuple(task.gold_answers) + ("",) * (n_turns - len(task.gold_answers))
    given_values = task.meta.get("answer_values")
    values = (
        tuple(tuple(str(v) for v in vs) for vs in given_values)
        if given_values is not None
        else tuple(_default_answer_values(a) for a in answers)
    )
    return EpisodeSpec(
        task_id=task.task_id,
        system_prompt=task.system_prompt,
        tools=tuple(task.tools),
        user_turns=tuple(task.user_turns),
        checklists=tuple(tuple(c) for c in task.checklists),
        gold=gold if gold else tuple(() for _ in range(n_turns)),
        gold_answers=answers,
        answer_values=values,
        domain=task.domain,
        source="toolworld",
        meta=dict(task.meta),
    )


def executor_factory_for(
    make_executor: Callable[[Task], Executor], tasks: Sequence[Task]
) -> Callable[[EpisodeSpec], Executor]:
    """Adapt an environment's ``make_executor(task)`` to the engines' ``factory(spec)`` (by task id)."""
    by_id = {t.task_id: t for t in tasks}

    def factory(spec: EpisodeSpec) -> Executor:
        if spec.task_id not in by_id:
            raise KeyError(
                f"no task with id {spec.task_id!r} among the {len(by_id)} tasks given to executor_factory_for"
            )
        return make_executor(by_id[spec.task_id])

    return factory


def to_episode_spec(item: Any, *, executor: Executor | None = None) -> EpisodeSpec:
    """Hook converting any supported input to an ``EpisodeSpec``.

    ``Task`` → ``episode_spec_from_task``; a raw CM2 row (a mapping with ``messages`` and ``tools``) →
    ``envace.data.cm2.cm2_row_to_episode_spec``, then its ``to_engine_spec``.
    """
    if isinstance(item, EpisodeSpec):
        return item
    if isinstance(item, Task):
        return episode_spec_from_task(item, executor)
    if isinstance(item, Mapping) and "messages" in item and "tools" in item:
        return cm2_row_to_episode_spec(item).to_engine_spec()  # CM2's record keeps its recorded exchanges
    raise TypeError(
        f"to_episode_spec: cannot convert {type(item).__name__}; pass an EpisodeSpec, an envace.envs.base.Task "
        "or a raw CM2 row (mapping with 'messages' and 'tools')"
    )


# ---- rewards --------------------------------------------------------------------------------------
class RewardOutcome(NamedTuple):
    reward: float
    status: TrajectoryStatus
    info: dict[str, Any]


@runtime_checkable
class RewardFn(Protocol):
    """Scores one finished trajectory: ``(spec, trajectory) -> (reward, status, info)``.

    Return ``TrajectoryStatus.JUDGE_FAILED`` when the reward could not be computed (the engine then
    excludes the trajectory from the loss and counts it); ``reward`` is ignored in that case.
    """

    def __call__(self, spec: EpisodeSpec, trajectory: Trajectory) -> RewardOutcome | tuple: ...


def _gold_calls_matched(
    spec: EpisodeSpec, trajectory: Trajectory
) -> tuple[dict[int, int], dict[int, int], CallCorrespondence]:
    """Per user turn: how many made calls were paired with a gold call of that turn, how many calls were
    made, and the correspondence itself (the trajectory's response of each paired gold call).

    Pairing follows ``envace.core.bindings.CallCorrespondence`` over the whole trajectory, in
    order: each made call takes the first still unpaired gold call of its user turn that it matches.
    """
    correspondence = CallCorrespondence(spec.meta.get("bindings") if spec.meta else None)
    remaining = {t: [c for step in steps for c in step.calls] for t, steps in enumerate(spec.gold)}
    matched: dict[int, int] = {}
    made: dict[int, int] = {}
    for turn in trajectory.turns:
        accepted = []
        for k, call in enumerate(turn.tool_calls):
            made[turn.user_turn] = made.get(turn.user_turn, 0) + 1
            candidates = remaining.get(turn.user_turn, [])
            for i, gold in enumerate(candidates):
                pairs = correspondence.match(gold, call)
                if pairs is not None:
                    correspondence.accept(pairs)
                    accepted.append((gold, turn.responses[k] if k < len(turn.responses) else BINDING_MISSING))
                    matched[turn.user_turn] = matched.get(turn.user_turn, 0) + 1
                    del candidates[i]
                    break
        correspondence.end_step(accepted)
    return matched, made, correspondence


def _answer_fraction(spec: EpisodeSpec, turn: int, reply: str, correspondence: CallCorrespondence) -> float:
    """Fraction of the turn's key values the reply mentions; a value read from a gold response must be
    what the trajectory's corresponding response (real or rehearsed) holds there (``envace.core.answers``)."""
    values = spec.answer_values[turn]
    found = 0
    for value, binding in zip(values, turn_answer_bindings(spec.meta, turn, len(values))):
        source = correspondence.source_response(str(binding["call"])) if binding else BINDING_MISSING
        target = answer_target(value, binding, source)
        found += target is not BINDING_MISSING and mentions(reply, target)
    return found / len(values)


def toolworld_verifiable_reward(spec: EpisodeSpec, trajectory: Trajectory) -> RewardOutcome:
    """Built-in verifiable reward in [0, 1], the mean over user turns of a turn score; turns never reached score 0.

    A turn's score is the mean of its call score and, when the turn has answer values, the fraction of
    them its final reply mentions (``envace.core.answers.mentions``, the evaluation's rule); a value the
    gold read from a response (``spec.meta["answer_bindings"]``) must be the value at the same path in
    the trajectory's *corresponding* response, real or rehearsed, when the trajectory made that call
    (with no answer values, a turn without a final reply gets a 0 part).
    Call score: paired calls / max(#gold calls, #made calls) of the turn (1 when both are 0), so an extra
    call costs as much as a missing one. A made call is paired with a gold call when the name and the
    argument names agree and every argument matches, where an argument that the gold took from an
    earlier response (``spec.meta["bindings"]``) must hold the value that the *corresponding* earlier
    call's response (real or rehearsed) returned at the same path, not the gold literal; renaming must be
    one-to-one (the exact rule: ``envace.core.bindings``). So a trajectory that follows its own
    responses' ids consistently scores as gold even though a rehearser cannot know the real ids.
    """
    matched, made, correspondence = _gold_calls_matched(spec, trajectory)
    finals: dict[int, str] = {}
    reached: set[int] = set()
    for turn in trajectory.turns:
        reached.add(turn.user_turn)
        if not turn.tool_calls:
            finals[turn.user_turn] = turn.act_text
    scores = []
    for t in range(len(spec.user_turns)):
        if t not in reached:
            scores.append(0.0)
            continue
        n_gold = sum(len(step.calls) for step in (spec.gold[t] if spec.gold else ()))
        n_made = made.get(t, 0)
        parts = [matched.get(t, 0) / max(n_gold, n_made) if n_gold or n_made else 1.0]
        values = spec.answer_values[t] if t < len(spec.answer_values) else ()
        if values:
            parts.append(_answer_fraction(spec, t, finals.get(t, ""), correspondence))
        elif t not in finals:
            parts.append(0.0)  # the turn never reached a final reply
        scores.append(sum(parts) / len(parts))
    reward = sum(scores) / len(scores)
    return RewardOutcome(reward, TrajectoryStatus.OK, {"turn_scores": scores})


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
