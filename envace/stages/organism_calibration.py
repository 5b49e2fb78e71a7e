"""Calibration and positive-control runs of the model organism (issue 46), through the ordinary stages.

Each run lives in its own directory (``data/organism/runs/<name>/``, the working directory of its stage
processes) with a ``params.yaml`` composed from ``conf/`` as ``profile=organism`` plus the run's overrides,
and runs the science parts there (``python -m envace.stages.science``): ``data`` (the tool world at
``science.n_train/n_val/n_test``), ``sft`` (the SFT warm-up on gold ACT/REHEARSE targets), then

- ``sft``: the SFT checkpoint evaluated on the real-environment VALIDATION split (greedy, strict success);
- ``gate --seeds 0 1 2 3 4 [--jobs 2]``: additionally ``science.steps`` GRPO steps (``algo=grpo``, real
  environment) from that checkpoint with each training seed (``--jobs`` at a time, one core each), each
  evaluated on the same validation tasks. The gate holds for a run when >= 4 of 5 seeds gain >= 10 points.

A finished part is not re-run (its metrics file exists). Results are appended to
``science/organism/runs.jsonl`` (one row per run: settings, success with n and a 95% Wilson interval,
wall seconds per part, seconds per GRPO step, tokens per trajectory, the commit); ``table`` writes
``science/organism/calibration.md`` and ``calibration.json`` from it.

    python -m envace.stages.organism_calibration sft NAME [key=value ...]
    python -m envace.stages.organism_calibration gate NAME --seeds 0 1 2 3 4 --jobs 2 [key=value ...]
    python -m envace.stages.organism_calibration copy NAME   # teacher-forced digit accuracy of its SFT start
    python -m envace.stages.organism_calibration budgets NAME  # gold output lengths vs the run's token budgets
    python -m envace.stages.organism_calibration domains NAME  # validation success per domain of its evaluations
    python -m envace.stages.organism_calibration test NAME --seeds 0 1 2 3 4  # trained cells vs start on TEST
    python -m envace.stages.organism_calibration table
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from envace.config.load import write_params

ROOT = Path(__file__).resolve().parents[2]
RUNS = Path("data/organism/runs")
OUT = Path("science/organism")
ROWS = OUT / "runs.jsonl"
METRICS = "science/organism/metrics"  # relative to a run directory (the profile's science.metrics)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "envace", "conf"], cwd=ROOT, capture_output=True)
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def stage_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("OMP_NUM_THREADS", "1")
    for key, value in {
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "ENVACE_ALLOCATOR": env.get("ENVACE_ALLOCATOR", "auto"),
    }.items():
        env.setdefault(key, value)
    return env


def prepare(name: str, overrides: list[str]) -> Path:
    """The run directory with its params.yaml (profile=organism, the organism's absolute path, overrides)."""
    run = (ROOT / RUNS / name).resolve()
    run.mkdir(parents=True, exist_ok=True)
    model = (ROOT / "data/organism/toolworld_lm").resolve()
    base = ["profile=organism", f"model.path={model}", "tracking=none"]
    write_params([*base, *overrides], root=run, conf_dir=ROOT / "conf")
    (run / "overrides.json").write_text(json.dumps(overrides) + "\n")
    return run


def part(run: Path, args: list[str], done: Path, log: str) -> float:
    """Run ``python -m envace.stages.science ARGS`` in ``run`` unless ``done`` exists; wall seconds (0 if skipped)."""
    if done.exists():
        return 0.0
    started = time.perf_counter()
    with open(run / f"{log}.log", "w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "envace.stages.science", *args], cwd=run, env=stage_env(), stdout=out, stderr=out
        )
    if proc.returncode:
        raise RuntimeError(f"science {' '.join(args)} failed in {run} (exit {proc.returncode}); see {run}/{log}.log")
    return time.perf_counter() - started


# the gate's evaluation of one policy (no base comparison, no fidelity probes), on a split
EVAL_ONLY = ["eval.compare_base=false", "eval.fidelity=false", "eval.gold_fidelity_tasks=0"]
VAL_EVAL = ["eval.split=val", *EVAL_ONLY]


def outcome(metrics_dir: Path) -> dict[str, Any]:
    tasks = json.loads((metrics_dir / "tasks.json").read_text())["policy"]
    n, k = len(tasks), sum(bool(t["success"]) for t in tasks)
    lo, hi = wilson(k, n)
    by_domain: dict[str, list[int]] = {}  # domain -> [successes, tasks]: where a start fails
    for t in tasks:
        counts = by_domain.setdefault(str(t.get("domain")), [0, 0])
        counts[0] += bool(t["success"])
        counts[1] += 1
    return {
        "n": n,
        "successes": k,
        "success": k / n if n else 0.0,
        "ci95": [round(lo, 4), round(hi, 4)],
        "by_domain": dict(sorted(by_domain.items())),
    }


def step_stats(metrics_dir: Path) -> dict[str, Any]:
    path = metrics_dir / "train_steps.csv"
    if not path.exists():
        return {}
    every = list(csv.DictReader(path.open()))
    rows = [r for r in every if r.get("time/step")]
    if not rows:
        return {}
    times = sorted(float(r["time/step"]) for r in rows)
    out: dict[str, Any] = {"steps": len(rows), "s_per_step_median": round(times[len(times) // 2], 2)}
    per_traj = [float(r["update/stream_tokens"]) / float(r["trajectories"]) for r in rows if r.get("trajectories")]
    if per_traj:
        out["stream_tokens_per_trajectory"] = round(sum(per_traj) / len(per_traj), 1)
    calls = [float(r["real_env/calls"]) for r in rows if r.get("real_env/calls")]
    out["real_env_calls"] = int(sum(calls))
    rewards = [float(r["reward/mean"]) for r in rows if r.get("reward/mean")]
    if rewards:
        out["reward_first"], out["reward_last"] = round(rewards[0], 3), round(rewards[-1], 3)
    curve = [[int(float(r["step"])), round(float(r["val/success"]), 3)] for r in every if r.get("val/success")]
    if curve:  # train.val_every: validation success after each probed step (step 0 = the SFT start)
        out["val_curve"] = curve
    return out


def run_sft(name: str, overrides: list[str]) -> dict[str, Any]:
    run = prepare(name, overrides)
    m = run / METRICS
    seconds = {
        "data": part(run, ["data"], m / "data", "data"),
        "sft": part(run, ["sft"], m / "sft" / "train.json", "sft"),
        "sft_eval_val": part(run, ["sft_eval", *VAL_EVAL], m / "sft" / "tasks.json", "sft_eval"),
    }
    return {
        "kind": "sft",
        "name": name,
        "overrides": overrides,
        "val": outcome(m / "sft"),
        "sft_loss": sft_loss(m / "sft" / "train.json"),
        "seconds": seconds,
    }


def sft_loss(path: Path) -> float | None:
    """The SFT warm-up's mean target-token NLL in its last epoch."""
    if not path.exists():
        return None
    loss = json.loads(path.read_text()).get("final/sft/loss")
    return None if loss is None or math.isnan(float(loss)) else round(float(loss), 4)  # None: no SFT epoch ran


def run_gate(name: str, seed: int, overrides: list[str], sft: dict[str, Any], variant: str = "grpo") -> dict[str, Any]:
    """The ``variant`` cell (grpo: the positive control) of ``seed`` from run ``name``'s SFT start (``sft``: that
    start's ``run_sft`` row, whose run directory and params are already prepared: seeds may run side by side,
    none composes the config). Another variant keeps the run's settings and switches only its algo group."""
    run = ROOT / RUNS / name
    cell = run / METRICS / "cells" / f"{variant}-seed{seed}"
    args = ["--variant", variant, "--seed", str(seed), "cell", *VAL_EVAL]
    log = f"gate{seed}" if variant == "grpo" else f"gate-{variant}{seed}"
    seconds = part(run, args, cell / "tasks.json", log)
    after = outcome(cell)
    return {
        "kind": "gate",
        "name": name,
        "variant": variant,
        "seed": seed,
        "overrides": overrides,
        "val_sft": sft["val"],
        "val_after": after,
        "delta_points": round(100 * (after["success"] - sft["val"]["success"]), 1),
        "seconds": {**sft["seconds"], "grpo_and_eval": seconds},
        "train": step_stats(cell),
    }


def record(row: dict[str, Any]) -> None:
    row = {**row, "commit": commit(), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (ROOT / OUT).mkdir(parents=True, exist_ok=True)
    with open(ROOT / ROWS, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
    print(json.dumps(row))


def recorded() -> list[dict[str, Any]]:
    path = ROOT / ROWS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _table_head(title: str, columns: list[str]) -> list[str]:
    """The lines that open a section of calibration.md: its heading and a markdown table's header."""
    return ["", f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def table() -> None:
    rows = recorded()
    (ROOT / OUT / "calibration.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "# Organism calibration and positive-control attempts",
        "",
        "Produced by `python -m envace.stages.organism_calibration {sft,gate} NAME [overrides]` then `... table`",
        "(rows: science/organism/runs.jsonl). Success = strict success on the real-environment validation split,",
        "greedy; interval = 95% Wilson. Overrides are on top of `profile=organism`.",
        "",
        "## SFT calibration (target: 20-40% validation success)",
        "",
        "| run | overrides | val success | n | 95% CI | last-epoch SFT loss | SFT wall s | commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] != "sft":
            continue
        val = r["val"]
        loss = r.get("sft_loss") or sft_loss(ROOT / RUNS / r["name"] / METRICS / "sft" / "train.json")
        lines.append(
            f"| {r['name']} | `{' '.join(r['overrides'])}` | {val['success']:.3f} | {val['n']} | "
            f"[{val['ci95'][0]:.3f}, {val['ci95'][1]:.3f}] | {loss} | {r['seconds'].get('sft', 0):.0f} | "
            f"{r['commit']} |"
        )
    lines += [
        "",
        "## Positive control (grpo, real environment, from the SFT start; gate: >= +10 points in >= 4 of 5 seeds)",
        "",
        "| run | seed | overrides | val SFT | val after | delta (points) | steps | s/step | reward first->last "
        "| val curve (step:success) | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] != "gate":
            continue
        t = r.get("train", {})
        variant = r.get("variant", "grpo")
        seed = r["seed"] if variant == "grpo" else f"{variant} {r['seed']}"  # another variant: named with its seed
        lines.append(
            f"| {r['name']} | {seed} | "
            f"`{' '.join(r['overrides'])}` | {r['val_sft']['success']:.3f} | "
            f"{r['val_after']['success']:.3f} (n={r['val_after']['n']}) | {r['delta_points']:+.1f} | "
            f"{t.get('steps', '')} | {t.get('s_per_step_median', '')} | "
            f"{t.get('reward_first', '')}->{t.get('reward_last', '')} | "
            f"{' '.join(f'{step}:{v:.2f}' for step, v in t.get('val_curve', []))} | {r['commit']} |"
        )
    lines += ["", *gate_verdicts(rows)]
    tests = [r for r in rows if r["kind"] == "gate_test"]
    if tests:
        lines += _table_head(
            "The gate on the test split (trained seeds vs their SFT start, paired on the same tasks; "
            "95% seeds x tasks bootstrap interval; passes when the interval of all tasks is above 0)",
            [
                "run",
                "seeds",
                "subset",
                "tasks",
                "start",
                "trained (seed mean)",
                "difference",
                "95% CI",
                "passed",
                "commit",
            ],
        )
        for r in tests:
            for sub, d in r["trained_minus_start"].items():
                if not d["n_tasks"]:
                    continue
                lo, hi = d["ci95"]
                lines.append(
                    f"| {r['name']} | {' '.join(map(str, r['seeds']))} | {sub} | {d['n_tasks']} | "
                    f"{d['start']:.3f} | {d['trained']:.3f} | {100 * d['diff']:+.1f} | "
                    f"[{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                    f"{r['passed'] if sub == 'all' else ''} | {r['commit']} |"
                )
    copies = [r for r in rows if r["kind"] == "copy_probe"]
    if copies:
        lines += _table_head(
            "Copying ids and numbers (teacher-forced argmax accuracy on gold ACT calls and answers)",
            ["run", "tasks", "train digit", "train other", "val digit", "val other", "commit"],
        )
        lines += [
            f"| {r['name']} | {r['n_tasks']} | {r['train']['digit']} | {r['train']['other']} | "
            f"{r['val']['digit']} | {r['val']['other']} | {r['commit']} |"
            for r in copies
        ]
    per_domain = [r for r in rows if r["kind"] == "domain_probe"]
    if per_domain:
        domains = sorted({d for r in per_domain for counts in r["parts"].values() for d in counts})
        lines += _table_head("Validation success per domain (successes / tasks)", ["run", "part", *domains, "commit"])
        for r in per_domain:
            for part in sorted(r["parts"], key=lambda name: (name != "sft", name)):  # the start first
                counts = r["parts"][part]
                cells = [f"{counts[d][0]}/{counts[d][1]}" if d in counts else "" for d in domains]
                lines.append(f"| {r['name']} | {part} | {' | '.join(cells)} | {r['commit']} |")
    budgets = [r for r in rows if r["kind"] == "budget_probe"]
    if budgets:
        lines += _table_head(
            "Budgets (the longest gold output of each task, in the run's tokens, against its generation budgets)",
            [
                "run",
                "budgets ACT / REHEARSE",
                "split",
                "tasks",
                "longest ACT output: median, p90, max",
                "tasks over the ACT budget",
                "tool responses",
                "longest response: p99, max",
                "responses over the REHEARSE budget",
                "commit",
            ],
        )
        for r in budgets:
            for split, v in r["splits"].items():
                lines.append(
                    f"| {r['name']} | {r['act_budget']} / {r['rehearse_budget']} | {split} | {v['tasks']} | "
                    f"{v['act_median']}, {v['act_p90']}, {v['act_max']} | {v['tasks_over_act_budget']} | "
                    f"{v['responses']} | {v['response_p99']}, {v['response_max']} | "
                    f"{v['responses_over_rehearse_budget']} | {r['commit']} |"
                )
    probes = [r for r in rows if r["kind"] == "probe"]
    if probes:
        lines += ["", "## Probes", ""]
        lines += [f"- {r['name']} ({r['commit']}): {r['note']}" for r in probes]
    aborted = [r for r in rows if r["kind"] == "aborted"]
    if aborted:
        lines += ["", "## Stopped before the end", ""]
        lines += [f"- {r['name']} (`{' '.join(r['overrides'])}`, {r['commit']}): {r['note']}" for r in aborted]
    (ROOT / OUT / "calibration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_inputs(name: str) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """Run ``name``'s params, its SFT policy directory and its tool-world splits (the run's data seed and sizes)."""
    import yaml

    from envace.envs.toolworld import generate_tasks

    run = ROOT / RUNS / name
    params = yaml.safe_load((run / "params.yaml").read_text())
    s = params["science"]
    splits = generate_tasks(
        seed=s["data_seed"],
        n_train=s["n_train"],
        n_val=s["n_val"],
        n_test=s["n_test"],
        held_out_domain=params["data"]["held_out_domain"],
    )
    return params, run / s["dir"] / "sft" / "final" / "policy", splits


def copy_accuracy(name: str, n_tasks: int = 30) -> dict[str, Any]:
    """Teacher-forced argmax accuracy of run ``name``'s SFT policy on the assistant tokens (calls and answers)
    of gold ACT streams, digit tokens apart from the rest, on ``n_tasks`` training and validation tasks:
    where the SFT'd start fails at copying ids and numbers from the context, and whether it over- or underfits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.stages.organism import _renderer, task_texts

    _, policy, splits = run_inputs(name)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    header = tokenizer("assistant\n", add_special_tokens=False)["input_ids"]
    out: dict[str, Any] = {"kind": "copy_probe", "name": name, "n_tasks": n_tasks}
    renderer = _renderer()
    for split in ("train", "val"):
        hits = {"digit": [0, 0], "other": [0, 0]}
        for task in list(splits[split])[:n_tasks]:
            ids = tokenizer(next(task_texts(task, renderer)), add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                predicted = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
            inside = False
            for i, token in enumerate(ids):
                if token == start:
                    inside = ids[i + 1 : i + 1 + len(header)] == header
                    skip = i + len(header)
                    continue
                if inside and i > skip:
                    kind = "digit" if any(c.isdigit() for c in tokenizer.decode([token])) else "other"
                    hits[kind][0] += int(predicted[i - 1] == token)
                    hits[kind][1] += 1
                    inside = token != end
        out[split] = {k: round(a / max(1, n), 3) for k, (a, n) in hits.items()}
        out[split]["digit_tokens"] = hits["digit"][1]
    return out


def budget_fit(name: str) -> dict[str, Any]:
    """How long the gold outputs of run ``name``'s tasks are in its tokenizer's tokens, against the run's
    generation budgets: per task the longest gold ACT output (one step's calls in the wire format, or a final
    answer; + 1 for the end token), per tool response its REHEARSE target (+ 1). A task with an ACT output
    over the budget cannot be played as gold plays it (its calls are cut mid-call); the smaller of the
    training and evaluation budgets is the one checked."""
    from transformers import AutoTokenizer

    from envace.core.wire import as_result_object, render_rehearsal, render_tool_calls
    from envace.data.specs import episode_spec_from_task
    from envace.envs.toolworld import ToolWorldEnv

    params, policy, splits = run_inputs(name)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    act_budget = min(params["rollout"]["max_act_tokens"], params["eval"]["act_max_new_tokens"])
    rehearse_budget = min(params["rollout"]["max_rehearse_tokens"], params["eval"]["rehearse_max_new_tokens"])

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1

    def quantile(values: list[int], q: float) -> int:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else 0

    env = ToolWorldEnv()
    out: dict[str, Any] = {"kind": "budget_probe", "name": name, "act_budget": act_budget}
    out["rehearse_budget"] = rehearse_budget
    out["splits"] = {}
    for split in ("train", "val", "test"):
        if not splits[split]:
            raise SystemExit(f"budgets {name}: its {split} split has no tasks (science.n_{split}=0)")
        longest, responses = [], []
        for task in splits[split]:
            spec = episode_spec_from_task(task, env.make_executor(task))
            outputs = [render_tool_calls(step.calls) for turn in spec.gold for step in turn]
            longest.append(max(length(text) for text in [*outputs, *task.gold_answers]))
            responses += [
                length(render_rehearsal(as_result_object(r))) for t in spec.gold for st in t for r in st.responses
            ]
        out["splits"][split] = {
            "tasks": len(longest),
            "act_median": quantile(longest, 0.5),
            "act_p90": quantile(longest, 0.9),
            "act_max": max(longest),
            "tasks_over_act_budget": sum(n > act_budget for n in longest),
            "responses": len(responses),
            "response_p99": quantile(responses, 0.99),
            "response_max": max(responses, default=0),
            "responses_over_rehearse_budget": sum(n > rehearse_budget for n in responses),
        }
    return out


def domain_success(name: str) -> dict[str, Any]:
    """Validation success per tool-world domain of run ``name``: its SFT start and each gate cell it has (the
    tasks.json every evaluation writes): whether a start's failures are spread evenly or sit in some domains."""
    m = ROOT / RUNS / name / METRICS
    parts = {"sft": m / "sft"} | {d.name: d for d in sorted((m / "cells").glob("*")) if d.is_dir()}
    found = {part: outcome(path)["by_domain"] for part, path in parts.items() if (path / "tasks.json").exists()}
    if not found:
        raise SystemExit(f"domains {name}: no evaluated part under {m} (run `sft {name}` or `gate {name}` first)")
    return {"kind": "domain_probe", "name": name, "parts": found}


TEST_BOOT = 10_000  # bootstrap replicates of the test comparison


def test_policy(run: Path, checkpoints: Path, part_name: str) -> Path:
    """Greedy real-environment evaluation of ``checkpoints``'s final policy on the TEST split (the gate's evaluation,
    other tasks), its metrics under the run's ``metrics/test/<part_name>``; skipped when done."""
    metrics = run / METRICS / "test" / part_name
    args = [
        "sft_eval",
        "eval.split=test",
        *EVAL_ONLY,
        f"paths.checkpoints={checkpoints}",
        f"paths.evaluation={run / 'data' / 'test_eval' / part_name}",
        f"paths.metrics={metrics}",
        f"paths.plots={metrics}",
    ]
    part(run, args, metrics / "tasks.json", f"test_{part_name}")
    return metrics


def gate_test(name: str, seeds: list[int]) -> dict[str, Any]:
    """The gate's second condition: the trained cells of ``seeds`` against their SFT start on the test split
    (in-domain tasks and the held-out domain), paired on the same tasks, with the seeds x tasks bootstrap
    interval of the science report (``envace.reporting.science_stats.paired_difference``)."""
    import yaml

    from envace.reporting.science_stats import SUBSETS, outcomes_of, paired_difference

    run = ROOT / RUNS / name
    params = yaml.safe_load((run / "params.yaml").read_text())
    data_dir = run / params["science"]["dir"]
    # checkpoint directories (manifest.json + final/policy), as the evaluation stage reads them
    cells = {s: data_dir / "cells" / f"grpo-seed{s}" / "checkpoints" for s in seeds}
    missing = [s for s, c in cells.items() if not (c / "final" / "policy" / "config.json").is_file()]
    if missing:
        raise SystemExit(f"test {name}: seeds {missing} have no trained policy; run `gate {name} --seeds ...` first")
    start = test_policy(run, data_dir / "sft", "sft")
    trained = {s: test_policy(run, c, f"grpo-seed{s}") for s, c in cells.items()}

    def rows(m: Path) -> list[dict[str, Any]]:
        return json.loads((m / "tasks.json").read_text())["policy"]

    a = outcomes_of([rows(m) for m in trained.values()], " (trained)")
    b = outcomes_of([rows(start)], " (start)")
    compare = {
        sub: {
            "start": b.subset(sub).mean,
            "trained": a.subset(sub).mean,
            **paired_difference(a.subset(sub), b.subset(sub), TEST_BOOT),
        }
        for sub in SUBSETS
    }
    return {
        "kind": "gate_test",
        "name": name,
        "seeds": seeds,
        "test_sft": outcome(start),
        "test_after": {s: outcome(m) for s, m in trained.items()},
        "trained_minus_start": compare,
        "passed": compare["all"]["ci95"] is not None and compare["all"]["ci95"][0] > 0,
    }


GATE_POINTS, GATE_SEEDS, GATE_OF = 10.0, 4, 5


def gate_verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """One line per run with gate seeds: how many gained >= 10 points, and whether the gate holds."""
    by_run: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["kind"] == "gate" and r.get("variant", "grpo") == "grpo":  # the positive control is grpo's
            by_run.setdefault(r["name"], {})[int(r["seed"])] = float(r["delta_points"])
    out = []
    for name, deltas in by_run.items():
        gained = sum(d >= GATE_POINTS for d in deltas.values())
        verdict = (
            "HOLDS"
            if gained >= GATE_SEEDS and len(deltas) >= GATE_OF
            else ("does not hold" if gained + max(0, GATE_OF - len(deltas)) < GATE_SEEDS else "undecided")
        )
        out.append(
            f"- gate {name}: {gained} of {len(deltas)} seeds gained >= {GATE_POINTS:.0f} points "
            f"(deltas {', '.join(f'{d:+.1f}' for _, d in sorted(deltas.items()))}): {verdict}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envace.stages.organism_calibration", description=__doc__)
    parser.add_argument("what", choices=["sft", "gate", "test", "copy", "budgets", "domains", "table"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=1, help="gate: seeds run at a time (one core each)")
    parser.add_argument(
        "--variant", default="grpo", help="gate: the cell's variant (grpo, the positive control; or envace, ...)"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if args.what == "table":
        table()
        return 0
    if not args.name:
        parser.error("give a run NAME")
    if args.what == "sft":
        record(run_sft(args.name, list(args.overrides)))
    elif args.what == "copy":
        record(copy_accuracy(args.name))
    elif args.what == "budgets":
        record(budget_fit(args.name))
    elif args.what == "domains":
        record(domain_success(args.name))
    elif args.what == "test":
        record(gate_test(args.name, list(args.seeds)))
    else:
        overrides = list(args.overrides)
        sft = run_sft(args.name, overrides)  # once, before the seeds share its checkpoint
        if not any(r["kind"] == "sft" and r["name"] == args.name for r in recorded()):
            record(sft)
        failed = []
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {
                pool.submit(run_gate, args.name, seed, overrides, sft, args.variant): seed for seed in args.seeds
            }
            for future in as_completed(futures):  # each seed recorded as it ends; one failing stops none
                try:
                    record(future.result())
                except Exception as exc:  # noqa: BLE001 - reported with its seed, the others still run
                    failed.append(f"seed {futures[future]}: {exc}")
        if failed:
            raise SystemExit("gate seeds failed: " + "; ".join(failed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
