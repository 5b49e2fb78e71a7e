"""Every stage for real on the smoke profile (tiny model, embedded tool world), in process, once;
small assertions read what the chain wrote. Paths live under a temp dir; tracking is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from envace.config.load import compose, to_plain, typed_config
from envace.reporting import metrics_files
from envace.stages import STAGES, runner
from envace.utils.io import read_json, read_jsonl


@pytest.fixture(scope="module")
def chain(tmp_path_factory, paths_under):
    """Run the stages in DAG order; returns (cfg, metrics per stage, root)."""
    import importlib

    root = tmp_path_factory.mktemp("smoke")
    cfg = compose(["profile=smoke", "tracking=none", *paths_under(root)])
    old = os.getcwd()
    os.chdir(root)
    metrics = {}
    try:
        for name in STAGES:
            module = importlib.import_module(f"envace.stages.{name}")
            # evaluate writes per benchmark, as dvc.yaml's evaluate@<benchmark> does (the report reads those)
            stem = f"evaluate_{to_plain(cfg.eval.benchmarks)[0]}" if name == "evaluate" else name
            path = root / "metrics" / f"{stem}.json"
            metrics[name] = runner.execute(name, module.run, cfg, path)
    finally:
        os.chdir(old)
    return cfg, metrics, root


def test_prepare_data_writes_validated_splits_rejects_stats_and_a_plot(chain):
    cfg, metrics, root = chain
    m = metrics["prepare_data"]
    train = read_jsonl(root / "prepared" / "train.jsonl")
    assert m["n_train"] == len(train) == cfg.data.n_train and m["n_val"] == cfg.data.n_val
    assert m["n_raw"] == m["n_train"] + m["n_val"] + m["n_rejected"]
    assert {"uuid", "messages", "tools", "checklists"} <= set(train[0])
    assert (root / "prepared" / "rejects.jsonl").exists()
    assert read_json(root / "prepared" / "stats.json")["splits"]["train"]["n_rows"] == len(train)
    assert (root / "plots" / "prepare_data.png").read_bytes()[:4] == b"\x89PNG"


def test_template_prompts_writes_both_roles_with_lengths_jsonl_and_parquet(chain):
    cfg, metrics, root = chain
    records = read_jsonl(root / "prompts" / "train.jsonl")
    roles = {r["role"] for r in records}
    assert roles == {"ACT", "REHEARSE"}
    assert all(0 < r["n_tokens"] <= cfg.rollout.max_prompt_tokens for r in records)
    frame = pd.read_parquet(root / "prompts" / "train.parquet")
    assert list(frame.columns) == ["data_source", "messages", "extra_info"] and len(frame) == len(records)
    assert frame.iloc[0]["extra_info"]["role"] in roles
    kept = read_json(root / "prompts" / "kept_uuids.json")
    assert metrics["template_prompts"]["train/rows_kept"] == len(kept["train"]) > 0


def test_train_exports_a_checkpoint_with_a_manifest_and_step_metrics(chain):
    cfg, metrics, root = chain
    manifest = read_json(root / "checkpoints" / "manifest.json")
    assert manifest["variant"] == to_plain(cfg.algo.name) and manifest["steps_done"] == cfg.train.steps
    assert (root / "checkpoints" / manifest["roles"]["act"]).is_dir()
    # the smoke profile warms up with SFT: those weights are kept as the evaluation's baseline
    assert manifest["baseline"] == {"act": "sft/policy", "rehearse": "sft/policy"}
    assert (root / "checkpoints" / "sft" / "policy" / "config.json").is_file()
    steps = pd.read_csv(root / "plots" / "train_steps.csv")
    assert list(steps["step"]) == list(range(0, cfg.train.steps + 1))  # step 0: the probe before any update
    assert metrics["train"]["steps_done"] == cfg.train.steps
    # the precision the run decided once, recorded for the later stages (and MLflow's params)
    assert metrics["train"]["precision"] == manifest["precision"]["precision"] in ("bf16", "fp32")
    assert {"requested", "cpu_model", "bf16_supported"} <= set(manifest["precision"])
    assert not (root / ".envace" / "train").exists() or not any((root / ".envace" / "train").iterdir())


def test_train_tracks_world_model_fidelity_over_training(chain):
    cfg, metrics, root = chain
    assert cfg.train.fidelity_every == 1 and cfg.train.fidelity_tasks == 1
    n = cfg.train.steps
    steps = pd.read_csv(root / "plots" / "train_steps.csv")
    assert steps["fidelity/n_calls"].notna().all() and (steps["fidelity/n_calls"] > 0).all()
    assert steps["reward/mean"].isna().tolist() == [True] + [False] * n  # no rollout before step 1
    curves = json.loads((root / "metrics" / "train.details.json").read_text())["curves"]  # lists: the details half
    assert set(curves) == {
        "step",
        "reward/mean",
        "adv/act/mean",
        "adv/act/std",
        "adv/rehearse/mean",
        "adv/rehearse/std",
        "fidelity/exact_match",
        "fidelity/field_f1",
        "fidelity/error_agreement",
        "val/success",
        "val/score",
        "real_env/calls_total",
    }
    assert curves["step"] == list(range(0, n + 1)) and all(len(v) == n + 1 for v in curves.values())
    # the validation probe (train.val_every=2, one task): at step 0 and the last step only
    assert cfg.train.val_every == 2 and n == 2
    assert [v is not None for v in curves["val/success"]] == [True, False, True]
    assert all(0.0 <= v <= 1.0 for v in curves["val/success"] if v is not None)
    assert steps["val/n"].dropna().tolist() == [1.0, 1.0]
    for key in ("fidelity/exact_match", "fidelity/field_f1", "fidelity/error_agreement"):
        assert all(v is not None and 0.0 <= v <= 1.0 for v in curves[key]), key
    assert curves["reward/mean"][0] is None and all(v is not None for v in curves["reward/mean"][1:])
    assert metrics["train"]["final/fidelity/n_calls"] == steps["fidelity/n_calls"].iloc[-1]


def test_evaluate_scores_policy_and_base_with_domains_and_fidelity(chain):
    cfg, metrics, root = chain
    m = metrics["evaluate"]
    assert m["benchmark"] == "toolworld" and m["n_tasks"] == cfg.eval.n_tasks
    for label in ("policy", "base"):
        assert 0.0 <= m[label]["success_rate"] <= 1.0
        assert sum(g["n"] for g in m[label]["per_domain"].values()) == m["n_tasks"]
        assert "fidelity" in m[label]
        assert len(read_jsonl(root / "evaluation" / "toolworld" / f"{label}.predictions.jsonl")) == m["n_tasks"]
    # the baseline is the SFT warm-up's weights (eval.baseline=auto, the run had a warm-up), with intervals
    assert m["baseline"] == "sft" and m["base"]["model"].startswith("sft:")
    # eval.precision auto: every model at the precision the training run decided (its manifest)
    trained_at = read_json(root / "checkpoints" / "manifest.json")["precision"]["precision"]
    assert m["precision"] == m["policy"]["precision"] == m["base"]["precision"] == trained_at
    for label in ("policy", "base"):
        lo, hi = m[label]["success_ci95"]
        assert 0.0 <= lo <= m[label]["success_rate"] <= hi <= 1.0
    gain = m["gain_vs_base"]["all"]
    assert gain["diff"] == pytest.approx(m["success_gain_vs_base"]) and gain["n_tasks"] == m["n_tasks"]
    assert gain["ci95"][0] <= gain["diff"] <= gain["ci95"][1]
    # REHEARSE on the oracle's calls of eval.gold_fidelity_tasks tasks: the same calls for both models
    assert m["gold_fidelity_calls"] > 0
    assert m["policy"]["fidelity_gold"]["n"] == m["base"]["fidelity_gold"]["n"] == m["gold_fidelity_calls"]
    pairs = read_json(root / "evaluation" / "toolworld" / "base.fidelity_gold.json")["pairs"]
    assert len(pairs) == m["gold_fidelity_calls"]


def test_rehearsal_sweep_covers_the_grid(chain):
    cfg, metrics, root = chain
    keyed = metrics["rehearsal_sweep"]["cells"]  # keyed by cell name, e.g. toolworld/parallel/n1/trained
    assert all(name == f"{c['benchmark']}/{c['mode']}/n{c['n_attempts']}/{c['rehearser']}" for name, c in keyed.items())
    cells = list(keyed.values())
    n_positive = sum(1 for n in cfg.rehearsal.n_attempts_grid if n > 0)
    assert len(cells) == 1 + n_positive * len(cfg.rehearsal.modes) * len(cfg.rehearsal.rehearsers)
    assert {(c["mode"], c["rehearser"]) for c in cells if c["n_attempts"]} == {
        (m, r) for m in ("parallel", "sequential") for r in ("trained", "base", "oracle")
    }
    assert {c["benchmark"] for c in cells} == {"toolworld"}
    assert {c["scope"] for c in cells if c["n_attempts"]} == {"turn"}  # the default: no future user turns
    assert all(c["cost/committed_executions"] == 1.0 for c in cells)
    trained_at = read_json(root / "checkpoints" / "manifest.json")["precision"]["precision"]
    assert metrics["rehearsal_sweep"]["precision"] == trained_at
    assert len(json.loads((root / "rehearsal" / "toolworld" / "cells.json").read_text())) == len(cells)


def test_sweep_n0_equals_evaluation(chain):
    """N=0 in the sweep is the evaluate stage's run: the same per-task outcomes and committed texts."""
    cfg, metrics, root = chain
    evaluated = {r["task_id"]: r for r in read_jsonl(root / "evaluation" / "toolworld" / "policy.predictions.jsonl")}
    (n0,) = (c for c in metrics["rehearsal_sweep"]["cells"].values() if c["n_attempts"] == 0)
    swept = read_jsonl(root / "rehearsal" / "toolworld" / f"n0-{n0['mode']}-{n0['rehearser']}.records.jsonl")
    common = [r for r in swept if r["task_id"] in evaluated]
    assert len(common) == len(swept) == cfg.rehearsal.n_tasks  # the sweep's tasks are among the evaluation's
    for record in common:
        gold = evaluated[record["task_id"]]
        assert (record["success"], record["score"], record["final_answers"]) == (
            gold["success"],
            gold["score"],
            gold["final_answers"],
        )
        assert [t["act_text"] for t in record["turns"]] == [t["act_text"] for t in gold["turns"]]


def test_report_writes_tables_and_plots_from_the_metrics(chain):
    cfg, metrics, root = chain
    reports = root / "reports"
    for table in ("main", "domains", "fidelity", "testtime", "training", "data"):
        assert (reports / f"{table}.csv").exists()
    main = pd.read_csv(reports / "main.csv")
    assert {
        "method",
        "toolworld",
        "toolworld/n",
        "toolworld/ci_low",
        "toolworld/ci_high",
        "toolworld/overflows",
        "Overall",
        "Overall (all)",
        "paper (Qwen3-8B, reference)",
    } <= set(main.columns) and len(main) == 2
    assert "Overall = mean over the paper's benchmarks that ran here: none" in (reports / "report.md").read_text()
    assert "testtime.png" in metrics["report"]["plots"]
    # the paired policy - baseline comparison, named after what the baseline is (the SFT'd start here)
    gain = pd.read_csv(reports / "gain.csv")
    assert list(gain["tasks"])[0] == "all tasks" and set(gain["baseline"]) == {"SFT'd start"}
    assert gain["gain_pp"].iloc[0] == pytest.approx(100 * metrics["evaluate"]["success_gain_vs_base"])
    assert "(SFT'd start)" in set(main["method"]).pop() + "".join(main["method"])
    assert "## Test-time private rehearsal" in (reports / "report.md").read_text()


def test_evaluate_runs_bfcl_and_tau2_suites_with_their_own_tables(chain, paths_under):
    """The evaluate stage on BFCL-v4 (bfcl-eval's data and checkers) and τ² telecom solo (tau2's
    evaluator) with the smoke checkpoint: per-benchmark suites, benchmark tables, pass^k over trials."""
    import importlib

    cfg, _, root = chain
    evaluate = importlib.import_module("envace.stages.evaluate")
    suites = [
        "eval.benchmarks=[toolworld,bfcl,tau2]",
        "eval.suites.bfcl.split='irrelevance,multi_turn_base,web_search_base'",
        "eval.suites.bfcl.n_tasks=1",
        "eval.suites.tau2.split=telecom",
        "eval.suites.tau2.n_tasks=1",
        "eval.suites.tau2.trials=2",
        "eval.suites.tau2.max_steps=4",
    ]
    for bench in ("bfcl", "tau2"):
        run_cfg = compose(["profile=smoke", "tracking=none", *paths_under(root), *suites, f"eval.benchmark={bench}"])
        m = runner.execute(f"evaluate@{bench}", evaluate.run, run_cfg, root / "metrics" / f"evaluate_{bench}.json")
        assert m["benchmark"] == bench and set(m) >= {"policy", "base", "not_runnable"}
        assert (root / "evaluation" / bench / "policy.predictions.jsonl").exists()
    bfcl = metrics_files.read_metrics(root / "metrics" / "evaluate_bfcl.json")
    assert bfcl["n_tasks"] == 2
    assert {k for k, v in bfcl["policy"]["categories"].items() if v["status"] == "ran"} == {
        "irrelevance",
        "multi_turn_base",
    }
    assert bfcl["policy"]["categories"]["web_search_base"]["status"] == "not_runnable_offline"
    assert "SerpAPI" in bfcl["not_runnable"]["web_search_base"]  # reported with its reason, never dropped
    assert "overall" in bfcl["policy"]["aggregates"]
    # gold-call fidelity on BFCL's executable multi-turn backends (the oracle's calls, executed for real)
    assert bfcl["gold_fidelity_calls"] > 0 and bfcl["policy"]["fidelity_gold"]["n"] == bfcl["gold_fidelity_calls"]
    tau2 = metrics_files.read_metrics(root / "metrics" / "evaluate_tau2.json")
    assert tau2["n_tasks"] == 2 and tau2["trials"] == 2  # one ticket, two trials
    domain = tau2["policy"]["domains"]["telecom:base"]
    assert domain["status"] == "ran" and domain["mode"] == "solo" and {"pass^1", "pass^2"} <= set(domain)
    assert tau2["gold_fidelity_calls"] > 0  # τ² tools executed for real by the oracle


def test_evaluate_runs_user_supplied_finmcp_and_vitabench_data(chain, paths_under, repo_root):
    """FinMCP-Bench (replayed responses, unrecorded calls answered by the model's own REHEARSE role) and
    VitaBench (no endpoints configured: every task is a recorded failure naming what is missing, never a
    crash) through the evaluate stage, from data paths given in eval.suites."""
    import importlib

    cfg, _, root = chain
    evaluate = importlib.import_module("envace.stages.evaluate")
    fixtures = repo_root / "tests" / "fixtures"
    suites = [
        "eval.benchmarks=[toolworld,finmcp,vitabench]",
        "eval.fidelity=false",
        f"eval.suites.finmcp.data_path={fixtures / 'finmcp' / 'samples.json'}",
        f"eval.suites.finmcp.tools_path={fixtures / 'finmcp' / 'mcp_tools.json'}",
        "eval.suites.finmcp.unrecorded=rehearse",
        "eval.suites.finmcp.n_tasks=2",
        f"eval.suites.vitabench.data_path={fixtures / 'vitabench'}",
        "eval.suites.vitabench.n_tasks=1",
    ]
    for bench in ("finmcp", "vitabench"):
        run_cfg = compose(["profile=smoke", "tracking=none", *paths_under(root), *suites, f"eval.benchmark={bench}"])
        runner.execute(f"evaluate@{bench}", evaluate.run, run_cfg, root / "metrics" / f"evaluate_{bench}.json")
    finmcp = metrics_files.read_metrics(root / "metrics" / "evaluate_finmcp.json")
    assert finmcp["n_tasks"] == 2 and "macro" in json.dumps(finmcp["policy"]["finmcp"])
    assert finmcp["policy"]["status_info"]["unrecorded"] == "rehearse"
    vita = metrics_files.read_metrics(root / "metrics" / "evaluate_vitabench.json")
    assert vita["policy"]["error_rate"] == 1.0 and vita["policy"]["success_rate"] == 0.0
    assert "needs endpoints" in vita["policy"]["status_info"]["status"]
    errors = [r["error"] for r in read_jsonl(root / "evaluation" / "vitabench" / "policy.predictions.jsonl")]
    assert errors and all("user simulator" in e for e in errors)


def test_a_suite_option_the_benchmark_does_not_use_is_refused(chain, paths_under):
    from envace.stages.suites import eval_suite, make_adapter

    cfg = typed_config(compose(["profile=smoke", "tracking=none", "eval.suites.bfcl.max_steps=3"]))
    with pytest.raises(ValueError, match=r"eval.suites.bfcl sets \['max_steps'\].*tau2: max_steps"):
        make_adapter(cfg, eval_suite(cfg, "bfcl"))
    cfg = typed_config(compose(["profile=smoke", "tracking=none"]))
    with pytest.raises(ValueError, match="eval.suites.finmcp.data_path"):
        make_adapter(cfg, eval_suite(cfg, "finmcp"))


def test_train_command_restarts_on_jemalloc_and_writes_the_same_weights(chain, paths_under, repo_root):
    """``python -m envace.stages.train`` re-executes itself on jemalloc where ENVACE_ALLOCATOR lets it (auto
    finds Ray's copy), and its checkpoints equal a glibc run's byte for byte: the allocator changes no value."""
    from envace.config.load import write_params
    from envace.utils.malloc import ENV_CHOICE, ENV_EXEC, find_jemalloc

    _, _, root = chain
    runs = {"glibc": "glibc", "auto": "jemalloc" if find_jemalloc() else "glibc"}
    weights = {}
    for choice, expected in runs.items():
        work = root / f"alloc_{choice}"  # its own cwd, so its own .envace/train resume directory
        work.mkdir()
        moved = {"checkpoints", "metrics", "plots"}
        paths = [o for o in paths_under(root) if o.split("=")[0].removeprefix("paths.") not in moved]
        # one thread and fp32 pinned: ``num_threads: auto`` and ``precision: auto`` time the box, and a busy
        # box can make the two runs choose differently (another summation order, or bf16 against fp32: seen
        # beside two science parts), which is not what this test is about
        write_params(
            [
                "profile=smoke",
                "tracking=none",
                "engine.num_threads=1",
                "engine.precision=fp32",
                *paths,
                *(f"paths.{p}={work / p}" for p in sorted(moved)),
            ],
            root=work,
            conf_dir=repo_root / "conf",
        )
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", ENV_EXEC)}
        env[ENV_CHOICE] = choice
        done = subprocess.run(
            [sys.executable, "-m", "envace.stages.train"], cwd=work, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"C allocator: {expected}" in done.stderr
        files = sorted((work / "checkpoints").rglob("*.safetensors"))
        assert files, "the train stage wrote no weights"
        weights[choice] = {str(f.relative_to(work)): f.read_bytes() for f in files}
    assert weights["glibc"].keys() == weights["auto"].keys()
    for name, data in weights["glibc"].items():
        assert data == weights["auto"][name], f"{name} differs between allocators"
