"""Episode specs from what the environments and data sets give: a tool-world ``Task`` (its gold calls run on
a fresh executor to record real responses) or a raw CM2 row, and the executor factory the engines take.

The engines consume only ``EpisodeSpec`` (``envace.core.records``); this module builds them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envace.core.env import Executor, Task
from envace.core.records import EpisodeSpec, GoldStep
from envace.data.cm2_episodes import cm2_row_to_episode_spec

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
        f"to_episode_spec: cannot convert {type(item).__name__}; pass an EpisodeSpec, an envace.core.env.Task "
        "or a raw CM2 row (mapping with 'messages' and 'tools')"
    )
