"""How far two pipeline runs' results moved: the same code on two machines (or precisions), or two commits.

Usage (each argument a checkout where `dvc repro` ran, e.g. the main one and a clone run on another CPU):

    python scripts/compare_runs.py /path/to/run_a /path/to/run_b

Prints, side by side: the headline numbers of every ``metrics/*.json`` (the committed DVC metrics files),
the per-step training reward and loss (``plots/train_steps.csv``), the first GRPO step where the two runs'
rollouts differ, and per evaluated model the tasks whose strict success flipped between the runs
(``data/evaluation/<benchmark>/<model>.predictions.jsonl``), with the machine facts each run recorded
(``metrics/train.details.json``'s ``produced_by``). Nothing is written; the output is what docs/reliability.md
quotes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}{key}/" if prefix or key else key))
        return out
    return {prefix.rstrip("/"): value}


def headline(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted((root / "metrics").glob("*.json")):
        if path.name.endswith(".details.json"):
            continue
        out.update({f"{path.stem}:{k}": v for k, v in flatten(json.loads(path.read_text())).items()})
    return out


def steps(root: Path) -> list[dict[str, str]]:
    path = root / "plots" / "train_steps.csv"
    return list(csv.DictReader(path.open())) if path.exists() else []


def outcomes(root: Path) -> dict[str, dict[str, bool]]:
    """``{"<benchmark>/<model>": {task_id: success}}`` from the evaluation's predictions."""
    out: dict[str, dict[str, bool]] = {}
    for path in sorted((root / "data" / "evaluation").glob("*/*.predictions.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[f"{path.parent.name}/{path.name.removesuffix('.predictions.jsonl')}"] = {
            r["task_id"]: bool(r.get("success")) for r in rows
        }
    return out


def machine(root: Path) -> str:
    path = root / "metrics" / "train.details.json"
    if not path.exists():
        return "?"
    produced = json.loads(path.read_text()).get("produced_by", {})
    keys = ("commit", "code_dirty", "cpu", "cpu_bf16", "precision")
    return ", ".join(f"{k}={produced.get(k)}" for k in keys if k in produced) or "?"


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    args = parser.parse_args()
    a, b = args.run_a, args.run_b
    print(f"A: {a}\n   {machine(a)}\nB: {b}\n   {machine(b)}\n")

    ha, hb = headline(a), headline(b)
    print("## Headline metrics (metrics/*.json)\n\n| key | A | B | same |\n|---|---|---|---|")
    for key in sorted(set(ha) | set(hb)):
        va, vb = ha.get(key), hb.get(key)
        print(f"| {key} | {va} | {vb} | {'yes' if same(va, vb) else 'NO'} |")

    sa, sb = steps(a), steps(b)
    print("\n## Training steps (plots/train_steps.csv)\n")
    print("| step | reward A | reward B | loss A | loss B |\n|---|---|---|---|---|")
    first = None
    for ra, rb in zip(sa, sb):
        reward, loss = (ra.get("reward/mean"), rb.get("reward/mean")), (ra.get("loss"), rb.get("loss"))
        if first is None and reward[0] != reward[1]:
            first = ra.get("step")
        print(f"| {ra.get('step')} | {reward[0]} | {reward[1]} | {loss[0]} | {loss[1]} |")
    print(f"\nfirst step whose rollout reward differs: {first or 'none'}")

    oa, ob = outcomes(a), outcomes(b)
    print("\n## Strict success per evaluated model (data/evaluation/*/*.predictions.jsonl)\n")
    print("| benchmark/model | tasks | success A | success B | tasks flipped |\n|---|---|---|---|---|")
    for key in sorted(set(oa) & set(ob)):
        common = sorted(set(oa[key]) & set(ob[key]))
        flipped = [t for t in common if oa[key][t] != ob[key][t]]
        sa_, sb_ = sum(oa[key][t] for t in common), sum(ob[key][t] for t in common)
        print(f"| {key} | {len(common)} | {sa_} | {sb_} | {len(flipped)} {flipped if flipped else ''} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
