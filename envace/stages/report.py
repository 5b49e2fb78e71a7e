"""Stage ``report``: paper-shaped tables (markdown + CSV) and PNG plots from the metrics files.

Reads only ``paths.metrics/*.json`` and ``paths.plots/train_steps.csv`` (seconds, no models). Tables:
main (method × benchmark + Overall, success %), ablation (training variant × benchmark) and scale
(model × benchmark) across DVC experiments (``paths.metrics/experiments.json``, written by
``python -m envace.reporting.experiments collect``; envace.reporting.comparison), per-domain and held-out
transfer, world-model fidelity, test-time rehearsal (N × mode × rehearser, gain over N=0), training
and data summaries. Plots (envace.reporting.plots): reward per step and per variant, per-role advantage
spread and training diagnostics, fidelity over training; and (envace.reporting.testtime_plots) success vs
rehearsal attempts N and vs rehearsal cost (95% intervals); a plot lacking data is listed as not drawn, with
why. Numbers are what *this* pipeline measured;
the paper's numbers appear only in the column labelled ``paper (Qwen3-8B, reference)`` of the main,
ablation, scale and test-time tables (``envace.reporting.reference``), never in our columns. The report
opens with its provenance (commit, profile, overrides, model, seeds, date) and marks inputs produced by
older code as stale (``envace.reporting.provenance``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from envace.config.load import to_plain
from envace.config.schema import Config
from envace.reporting.comparison import CURRENT_RUN, RunResult, ablation_table, collected_runs, scale_table
from envace.reporting.experiments import OUTPUT_NAME
from envace.reporting.gain import baseline_name, gain_table
from envace.reporting.metrics_files import read_metrics
from envace.reporting.plots import curves_frame, merge_curves, save_plots
from envace.reporting.provenance import input_states
from envace.reporting.report_markdown import markdown
from envace.reporting.sweep_layout import with_cell_rows
from envace.reporting.tables import (
    benchmark_table,
    domain_table,
    fidelity_table,
    main_table,
    stable_metrics,
    summary_table,
    testtime_table,
)
from envace.reporting.testtime_plots import sweep_cells
from envace.stages.runner import NULL_TRACKER, Tracker, stage_main
from envace.utils.io import atomic_dir, read_json, write_text

logger = logging.getLogger(__name__)


def load_metrics(cfg: Config) -> dict[str, Any]:
    """What each stage returned: ``<stage>.json`` merged with ``<stage>.details.json`` (metrics_files.read_metrics);
    the rehearsal grid's cells, keyed by name on disk, as the list of rows (sweep_layout.with_cell_rows)."""
    root = Path(cfg.paths.metrics)
    names = ["prepare_data", "template_prompts", "train", "rehearsal_sweep"]
    names += [f"evaluate_{b}" for b in to_plain(cfg.eval.benchmarks)]
    loaded = {n: read_metrics(root / f"{n}.json") for n in names if (root / f"{n}.json").exists()}
    return {n: with_cell_rows(m, cfg) if n == "rehearsal_sweep" else m for n, m in loaded.items()}


def load_experiments(cfg: Config) -> dict[str, Any] | None:
    """``metrics/experiments.json`` (``python -m envace.reporting.experiments collect``), None if not collected."""
    path = Path(cfg.paths.metrics) / OUTPUT_NAME
    return read_json(path) if path.exists() else None


def load_steps(cfg: Config) -> pd.DataFrame:
    path = Path(cfg.paths.plots) / "train_steps.csv"
    return pd.read_csv(path) if path.exists() and path.stat().st_size else pd.DataFrame()


def current_run(cfg: Config, m: dict[str, Any]) -> RunResult:
    """This workspace's run as a comparison row (its params, policy success, final reward)."""
    params = {
        "profile": to_plain(cfg.profile),
        "experiment_name": cfg.experiment_name,
        "algo.name": to_plain(cfg.algo.name),
        "model.name": cfg.model.name,
        "engine.name": to_plain(cfg.engine.name),
        "seed": cfg.seed,
    }
    success = {
        b: (m.get(f"evaluate_{b}", {}).get("policy") or {}).get("success_rate") for b in to_plain(cfg.eval.benchmarks)
    }
    n = {b: (m.get(f"evaluate_{b}", {}).get("policy") or {}).get("n_tasks") for b in to_plain(cfg.eval.benchmarks)}
    return RunResult(
        run=CURRENT_RUN, params=params, success=success, final_reward=m.get("train", {}).get("final/reward/mean"), n=n
    )


def comparisons(cfg: Config, m: dict[str, Any], curves: pd.DataFrame):
    """(ablation table, scale table, {variant label: its curves}) over the collected runs + this one."""
    current = current_run(cfg, m)
    runs = collected_runs(load_experiments(cfg))
    benchmarks = to_plain(cfg.eval.benchmarks)
    ablation, variants = ablation_table(runs, current, benchmarks)
    scale, _ = scale_table(runs, current, benchmarks)
    reward = {
        f"{r.params['algo.name']} ({r.run})": curves if r is current else curves_frame(r.curves) for r in variants
    }
    return ablation, scale, reward


def baseline_label(cfg: Config, m: dict[str, Any]) -> str:
    """What the trained policy is compared with, for the tables: ``SFT'd start`` (this run's warm-up) or
    ``base``, which names the model directory when the configured model is one (the organism's committed SFT
    start: "base" alone would read as an untrained model)."""
    name = baseline_name(m)
    if name == "base" and to_plain(cfg.model.kind) == "path" and cfg.model.path:
        return f"base: {cfg.model.path}"
    return name


def efficiency_table(cfg: Config, m: dict[str, Any]) -> pd.DataFrame:
    """Sample efficiency: success on the first benchmark against the real environment calls each policy's
    training used — the SFT start (its warm-up's gold responses), this run's trained policy, and every
    collected run that counted them (``final/real_env/calls_total``)."""
    bench = to_plain(cfg.eval.benchmarks)[0]
    evaluated = m.get(f"evaluate_{bench}", {})
    train = m.get("train", {})
    rows = []
    if (
        train.get("final/real_env/sft_calls") is not None
        and (evaluated.get("base") or {}).get("success_rate") is not None
    ):
        rows.append(
            (f"start ({baseline_label(cfg, m)})", train["final/real_env/sft_calls"], evaluated["base"]["success_rate"])
        )
    final_calls = train.get("final/real_env/calls_total")
    if (evaluated.get("policy") or {}).get("success_rate") is not None:
        rows.append((f"{to_plain(cfg.algo.name)} (this run)", final_calls, evaluated["policy"]["success_rate"]))
    for r in collected_runs(load_experiments(cfg)):
        if r.real_env_calls is not None and r.success.get(bench) is not None:
            rows.append((f"{r.params.get('algo.name', '?')} ({r.run})", r.real_env_calls, r.success[bench]))
    return pd.DataFrame(
        [{"policy": p, "benchmark": bench, "real_env_calls": c, "success": 100 * s} for p, c, s in rows],
        columns=["policy", "benchmark", "real_env_calls", "success"],
    )


def run(cfg: Config, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    m = load_metrics(cfg)
    steps = load_steps(cfg)
    curves = merge_curves(curves_frame(m.get("train", {}).get("curves")), steps)
    ablation, scale, reward = comparisons(cfg, m, curves)
    labels = {
        "base": f"{cfg.model.name} ({baseline_label(cfg, m)})",
        "policy": f"{to_plain(cfg.algo.name)} ({cfg.model.name})",
    }
    tables = {
        "main": main_table(to_plain(cfg.eval.benchmarks), labels, m, to_plain(cfg.algo.name)),
        "gain": gain_table(m),
        "benchmarks": benchmark_table(m),
        "ablation": ablation,
        "scale": scale,
        "domains": domain_table(m),
        "fidelity": fidelity_table(m),
        "testtime": testtime_table(m),
        "efficiency": efficiency_table(cfg, m),
        "training": summary_table(m.get("train", {})),
        "data": summary_table(m.get("prepare_data", {})),
    }
    collected = (Path(cfg.paths.metrics) / OUTPUT_NAME).exists()
    out = Path(cfg.paths.reports)
    with atomic_dir(out) as tmp:
        for key, frame in tables.items():
            frame.to_csv(tmp / f"{key}.csv", index=False)
        plots, skipped = save_plots(
            tmp,
            steps=steps,
            curves=curves,
            variants=reward,
            testtime=sweep_cells(m.get("rehearsal_sweep")),
            efficiency=tables["efficiency"],
        )
        inputs = input_states(Path(cfg.paths.metrics), str(cfg.paths.metrics), sorted(m))
        write_text(tmp / "report.md", markdown(cfg, tables, plots, skipped, collected, inputs))
    tracker.log_artifact(out, "report")
    tracker.set_tags({f"report.label.{key}": label for key, label in labels.items()})
    logger.info(
        "report: %s (tables %s, plots %s, not drawn %s)", out / "report.md", sorted(tables), plots, sorted(skipped)
    )
    return {
        "tables": sorted(tables),
        "plots": plots,
        "skipped_plots": skipped,
        **stable_metrics(tables["main"]),
        "stale_inputs": sum(s.state == "stale" for s in inputs),
        "labels": labels,
        "ablation_runs": ablation["run"].tolist(),
        "scale_runs": scale["run"].tolist(),
    }


main = stage_main("report", run, lambda cfg: Path(cfg.paths.reports) / "summary.json")

if __name__ == "__main__":
    raise SystemExit(main())
