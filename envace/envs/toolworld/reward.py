"""The tool world's built-in verifiable reward (``judge=verifiable``): gold-call matching and the answer's key
values, both following the trajectory's own responses (real or rehearsed) wherever gold read a value from
a response, so an imagined world that is consistent scores as gold does."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from envace.core.answers import answer_target, mentions, turn_answer_bindings
from envace.core.bindings import MISSING as BINDING_MISSING
from envace.core.bindings import CallCorrespondence, json_equal
from envace.core.records import EpisodeSpec, ToolCall, Trajectory, TrajectoryStatus
from envace.core.reward import RewardFn, RewardOutcome


def _gold_calls_matched(
    spec: EpisodeSpec, trajectory: Trajectory, argument_credit: float = 0.0
) -> tuple[dict[int, float], dict[int, int], CallCorrespondence]:
    """Per user turn: the credit of the made calls (1 per call paired with a gold call of that turn, plus
    the near misses' credit below), how many calls were made, and the correspondence itself (the
    trajectory's response of each paired gold call).

    Pairing follows ``envace.core.bindings.CallCorrespondence`` over the whole trajectory, in
    order: each made call takes the first still unpaired gold call of its user turn that it matches.
    With ``argument_credit`` > 0, a made call that pairs with nothing (and is not a repeat of a call that
    did) is a near miss: its ``argument_fraction`` against each gold call of its turn still unpaired at that
    moment is noted. After the whole trajectory, near misses and the gold calls left unpaired are matched one
    to one, highest fraction first (earlier calls first on ties), and each matched gold call earns
    ``argument_credit`` times that fraction (so a call with the right tool and two of three arguments right
    earns ``argument_credit * 2/3``, never a full 1). The result does not depend on the order of the calls
    beyond what pairing itself does.
    """
    correspondence = CallCorrespondence(spec.meta.get("bindings") if spec.meta else None)
    remaining = {t: [c for step in steps for c in step.calls] for t, steps in enumerate(spec.gold)}
    matched: dict[int, float] = {}
    made: dict[int, int] = {}
    paired_calls: dict[int, list[ToolCall]] = {}  # user turn -> the made calls that paired
    near: list[tuple[float, int, int, int]] = []  # (fraction, made call index, id(gold call), user turn)
    n_calls = 0
    for turn in trajectory.turns:
        accepted = []
        for k, call in enumerate(turn.tool_calls):
            n_calls += 1
            made[turn.user_turn] = made.get(turn.user_turn, 0) + 1
            candidates = remaining.get(turn.user_turn, [])
            for i, gold in enumerate(candidates):
                pairs = correspondence.match(gold, call)
                if pairs is not None:
                    correspondence.accept(pairs)
                    accepted.append((gold, turn.responses[k] if k < len(turn.responses) else BINDING_MISSING))
                    matched[turn.user_turn] = matched.get(turn.user_turn, 0) + 1
                    paired_calls.setdefault(turn.user_turn, []).append(call)
                    del candidates[i]
                    break
            else:
                if argument_credit > 0 and not _repeats(call, paired_calls.get(turn.user_turn, ())):
                    for gold in candidates:
                        fraction = correspondence.argument_fraction(gold, call)
                        if fraction > 0:
                            near.append((fraction, n_calls, id(gold), turn.user_turn))
        correspondence.end_step(accepted)
    unpaired = {id(gold) for golds in remaining.values() for gold in golds}
    credited_calls: set[int] = set()
    for fraction, index, gold_id, user_turn in sorted(near, key=lambda n: (-n[0], n[1])):
        if gold_id in unpaired and index not in credited_calls:
            unpaired.discard(gold_id)
            credited_calls.add(index)
            matched[user_turn] = matched.get(user_turn, 0) + argument_credit * fraction
    return matched, made, correspondence


def _repeats(call: ToolCall, paired: Iterable[ToolCall]) -> bool:
    """Whether ``call`` repeats a made call that already paired (same name and arguments)."""
    return any(call.name == p.name and json_equal(call.arguments, p.arguments) for p in paired)


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


def toolworld_verifiable_reward(
    spec: EpisodeSpec, trajectory: Trajectory, argument_credit: float = 0.0
) -> RewardOutcome:
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
    ``argument_credit`` (``judge.argument_credit``; 0 = paired calls only) adds partial credit for a gold
    call left unpaired: that weight times the share of arguments the best near-miss call of its turn got
    right (``_gold_calls_matched``), a denser signal for copying ids and numbers.
    """
    matched, made, correspondence = _gold_calls_matched(spec, trajectory, argument_credit)
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


def verifiable_reward(argument_credit: float = 0.0) -> RewardFn:
    """The built-in reward as a ``RewardFn`` with its ``judge.argument_credit`` (0 = the exact-call reward)."""
    if not 0.0 <= argument_credit < 1.0:
        raise ValueError(f"judge.argument_credit={argument_credit}: must be in [0, 1) (0 = paired calls only)")
    if argument_credit == 0.0:
        return toolworld_verifiable_reward
    return partial(toolworld_verifiable_reward, argument_credit=argument_credit)
