"""The tool world's built-in verifiable reward (``judge=verifiable``): gold-call matching and the answer's key
values, both following the trajectory's own responses (real or rehearsed) wherever gold read a value from
a response, so an imagined world that is consistent scores as gold does."""

from __future__ import annotations

from envace.core.answers import answer_target, mentions, turn_answer_bindings
from envace.core.bindings import MISSING as BINDING_MISSING
from envace.core.bindings import CallCorrespondence
from envace.core.records import EpisodeSpec, Trajectory, TrajectoryStatus
from envace.core.reward import RewardOutcome


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
