"""Training rewards of a consistent imagined trajectory against gold (issue 42, point 1).

For the first ``--tasks`` training tasks of the default tool world it plays the gold calls in an imagined
world (every id and number a response returns, and no user turn states, replaced consistently, as a rehearser
that invents its own world and an actor that follows it would) and prints the mean verifiable and rule-judge
rewards of: gold; the imagined trajectory whose replies restate what its own responses said; the same
imagined calls with replies quoting the real values. The world construction is the one the unit test
``test_answer_reward_binding_aware`` uses (tests/unit/envs/test_toolworld_scoring.py), imported from there.

    python scripts/imagined_answer_score.py --tasks 50
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

from envace.data.specs import episode_spec_from_task
from envace.envs.toolworld import ToolWorldExecutor, generate_tasks

TEST_MODULE = Path(__file__).resolve().parents[1] / "tests" / "unit" / "envs" / "test_toolworld_scoring.py"


def world_helpers():
    spec = importlib.util.spec_from_file_location("toolworld_scoring_test", TEST_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=50)
    args = parser.parse_args()
    w = world_helpers()
    scores: dict[str, list[tuple[float, float]]] = {"gold": [], "imagined, own values": [], "imagined, real values": []}
    for task in generate_tasks()["train"][: args.tasks]:
        spec = episode_spec_from_task(task, ToolWorldExecutor(task))
        names = w.imagined_world(spec)
        scores["gold"].append(w.both_rewards(task, spec, w.world_trajectory(spec, {}, list(spec.gold_answers))))
        scores["imagined, own values"].append(w.both_rewards(task, spec, w.world_trajectory(spec, names)))
        real = w.world_trajectory(spec, names, list(spec.gold_answers))
        scores["imagined, real values"].append(w.both_rewards(task, spec, real))
    for label, pairs in scores.items():
        verifiable, rule = (statistics.mean(p[i] for p in pairs) for i in (0, 1))
        print(f"{label:24s} verifiable {verifiable:.3f}  rule judge {rule:.3f}  ({len(pairs)} tasks)")


if __name__ == "__main__":
    main()
