"""Stage ``evaluate`` (one DVC stage per benchmark: ``evaluate@<eval.benchmark>``).

The trained policy and, with ``eval.compare_base``, the baseline (``eval.baseline``: the SFT warm-up's
weights RL started from, or the untrained model) play the benchmark's test split against its real
environment: success overall (with its Wilson interval), per domain, and on the held-out domain
(``transfer``) vs the rest (``in_domain``); ``gain_vs_base`` is policy − baseline paired on the same tasks
with its 95% bootstrap interval. With ``eval.fidelity`` each model's REHEARSE role is then
asked, teacher-forced, for the response of every real call it made: world-model fidelity (exact match,
field F1, error agreement), overall and per tool.

Outputs in ``paths.evaluation/<benchmark>``: ``<label>.predictions.jsonl`` (one record per task),
``<label>.fidelity.json``; metrics in ``paths.metrics/evaluate_<benchmark>.json``, with ``precision``, what the
models ran at (``auto``: the training run's, ``envace.stages.common.eval_precision``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envace.config.load import to_plain
from envace.config.schema import Config
from envace.evaluation import evaluate, measure_fidelity, oracle_probe_set, sample_tasks, with_trials
from envace.evaluation.episode import trial_of
from envace.inference.preflight import preflight
from envace.reporting.intervals import wilson
from envace.reporting.science_stats import gain_vs_base
from envace.stages.common import backends_precision, base_backend, baseline_kind, data_seed, trained_backend
from envace.stages.runner import NULL_TRACKER, Tracker, configure_torch, stage_main
from envace.stages.suites import eval_suite, make_adapter, suite_tasks
from envace.tracking.traces import trace_episodes
from envace.utils.io import atomic_dir, read_jsonl, write_json, write_jsonl
from envace.utils.malloc import trim_heap

logger = logging.getLogger(__name__)


def contenders(cfg: Config) -> dict[str, tuple[Any, Any]]:
    """label -> (acting backend, rehearsing backend used for fidelity)."""
    out = {"policy": (trained_backend(cfg, "act"), trained_backend(cfg, "rehearse"))}
    if cfg.eval.compare_base:  # eval.baseline: the SFT warm-up's weights or the untrained model
        out["base"] = (base_backend(cfg, "act"), base_backend(cfg, "rehearse"))
    return out


def release_prefix_caches(*backends: Any) -> None:
    """Empty the prefix KV caches of a contender's local backends once it has been measured: no later request
    goes to them, and each cache may hold up to ``eval.prefix_cache_tokens`` tokens of keys/values (SmolLM2:
    ~46 KB a token in fp32, so 3 GB at the default budget), which the next contender's cache would stack on.
    The cache changes no output, only speed."""
    for backend in {id(b): b for b in backends}.values():
        clear = getattr(backend, "clear_prefix_cache", None)
        if clear is not None:
            clear()
    trim_heap()  # hand the freed pages back (glibc keeps them resident otherwise)


def gold_probe(cfg: Config, adapter: Any, tasks: list[Any], n: int) -> Any:
    """The oracle's real episodes on up to ``n`` of ``tasks`` that have a real executor (None when off
    or impossible: no oracle, no executable task, no call)."""
    if not n:
        return None
    chosen = sample_tasks(
        tasks, n, data_seed(cfg), where=lambda t: trial_of(t) == 0 and adapter.real_executor(t) is not None
    )
    try:
        return oracle_probe_set(adapter, chosen)
    except ValueError as exc:  # nothing to probe here: say so, measure the rest
        logger.warning("evaluate: no gold-call fidelity on %s: %s", adapter.name, exc)
        return None


def fidelity_json(report: Any) -> dict[str, Any]:
    return {
        "overall": report.overall.to_json(),
        "per_tool": {tool: stats.to_json() for tool, stats in sorted(report.per_tool.items())},
        "pairs": [asdict(p) for p in report.pairs],
    }


def evaluate_one(
    cfg: Config,
    adapter: Any,
    subset: str,
    tasks: list[Any],
    actor: Any,
    rehearser: Any,
    out: Path,
    label: str,
    gold: Any = None,
    tracker: Tracker = NULL_TRACKER,
) -> dict[str, Any]:
    ev = cfg.eval
    overflows = getattr(actor, "context_overflows", 0)
    result = evaluate(adapter, actor, tasks, concurrency=ev.concurrency)
    # a bounded sample of the episodes as MLflow traces (tracking.max_traces per stage run, shared by the models)
    trace_episodes(
        cfg,
        tracker,
        result.records,
        share=2 if ev.compare_base else 1,
        stage="evaluate",
        policy=label,
        benchmark=adapter.name,
        split=subset,
    )
    write_jsonl(out / f"{label}.predictions.jsonl", result.predictions())
    summary: dict[str, Any] = {**result.metrics.to_json(), **adapter.summarize(subset, result.records)}
    n, wins = len(result.records), sum(r.success for r in result.records)
    summary["model"] = getattr(actor, "name", type(actor).__name__)
    summary["precision"] = backends_precision(actor, rehearser)
    summary["success_ci95"] = list(wilson(wins, n) or ())  # Wilson interval over the tasks (binary outcomes)
    # ACT requests refused because the prompt exceeds the model's context window (local backends)
    summary["context_overflows"] = getattr(actor, "context_overflows", 0) - overflows
    if ev.fidelity:
        report = measure_fidelity(
            rehearser,
            result.records,
            tasks,
            max_new_tokens=ev.rehearse_max_new_tokens,
            seed=cfg.seed,
            context_tokens=cfg.rollout.rehearse_context_tokens,
        )
        write_json(out / f"{label}.fidelity.json", fidelity_json(report))
        summary["fidelity"] = report.overall.to_json()
        summary["fidelity_per_tool"] = {t: s.to_json() for t, s in sorted(report.per_tool.items())}
    if gold is not None:  # the same oracle calls for every model: comparable across checkpoints
        report = measure_fidelity(
            rehearser,
            gold.records,
            gold.tasks,
            max_new_tokens=ev.rehearse_max_new_tokens,
            seed=cfg.seed,
            context_tokens=cfg.rollout.rehearse_context_tokens,
        )
        write_json(out / f"{label}.fidelity_gold.json", fidelity_json(report))
        summary["fidelity_gold"] = report.overall.to_json()
    return summary


def run(cfg: Config, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    preflight(cfg, "evaluate")  # the benchmarks' user-simulator/judge endpoints answer, before models load
    configure_torch(cfg)
    benchmark = to_plain(cfg.eval.benchmark)
    suite = eval_suite(cfg, benchmark)
    models = contenders(cfg)
    # a fresh adapter per contender: no state (e.g. BFCL memory snapshots) leaks between models, and
    # adapters that fall back on a REHEARSE role (FinMCP unrecorded=rehearse) use the contender's own
    adapters = {label: make_adapter(cfg, suite, rehearser) for label, (_, rehearser) in models.items()}
    probe = adapters["policy"]

    tasks = with_trials(
        suite_tasks(
            cfg, suite, probe, who="evaluate", fix=f"set eval.suites.{benchmark}.split to a subset that exists"
        ),
        suite.trials,
    )
    skipped = dict(getattr(probe, "skipped", {}))  # parts of the split that cannot run here, with the reason
    # the oracle plays on an adapter of its own (no shared state with the evaluated models)
    gold = gold_probe(cfg, make_adapter(cfg, suite, models["policy"][1]), tasks, suite.gold_fidelity_tasks)
    out = Path(cfg.paths.evaluation) / benchmark
    results: dict[str, Any] = {}
    outcomes: dict[str, list[dict[str, Any]]] = {}
    with atomic_dir(out) as tmp:
        for label, (actor, rehearser) in models.items():
            logger.info("evaluate %s: %s (%s) on %d tasks", benchmark, label, actor.name, len(tasks))
            results[label] = evaluate_one(
                cfg, adapters[label], suite.split, tasks, actor, rehearser, tmp, label, gold, tracker
            )
            outcomes[label] = read_jsonl(tmp / f"{label}.predictions.jsonl")
            release_prefix_caches(actor, rehearser)
    tracker.log_artifact(out, f"evaluation/{benchmark}")
    metrics: dict[str, Any] = {
        "benchmark": benchmark,
        "split": suite.split,
        "n_tasks": len(tasks),
        "trials": suite.trials,
        "precision": backends_precision(*(b for pair in models.values() for b in pair)),
        "not_runnable": skipped,
        **results,
        "gold_fidelity_calls": 0 if gold is None else gold.n_calls,
    }
    if "base" in results:
        metrics["baseline"] = baseline_kind(cfg)
        metrics["success_gain_vs_base"] = results["policy"]["success_rate"] - results["base"]["success_rate"]
        metrics["gain_vs_base"] = gain_vs_base(outcomes["policy"], outcomes["base"])
    return metrics


def metrics_path(cfg: Config) -> Path:
    return Path(cfg.paths.metrics) / f"evaluate_{to_plain(cfg.eval.benchmark)}.json"


main = stage_main("evaluate", run, metrics_path)

if __name__ == "__main__":
    raise SystemExit(main())
