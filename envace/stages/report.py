"""Stage ``report``: paper-shaped tables (markdown + CSV) and PNG plots from the metrics files.

Reads only ``paths.metrics/*.json`` and ``paths.plots/train_steps.csv`` (seconds, no models). Tables:
main (method × benchmark + Overall, success %), ablation (training variant × benchmark) and scale
(model × benchmark) across DVC experiments (``paths.metrics/experiments.json``, written by
``python -m envace.experiments collect``; envace.reporting.comparison), per-domain and held-out
transfer, world-model fidelity, test-time rehearsal (N × mode × rehearser, gain over N=0), training
and data summaries. Plots (envace.reporting.plots): reward per step, reward per variant, per-role
advantage statistics, world-model fidelity over training, success vs rehearsal attempts; one whose
data is absent is listed as not drawn, with the reason. Numbers are what *this* pipeline measured;
the paper's numbers appear only in the section labelled as reference (``PAPER_REFERENCE``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from envace.config import to_plain
from envace.experiments import OUTPUT_NAME
from envace.reporting.comparison import CURRENT_RUN, RunResult, ablation_table, collected_runs, scale_table
from envace.reporting.plots import curves_frame, merge_curves, save_plots
from envace.reporting.tables import (
    benchmark_table,
    domain_table,
    fidelity_table,
    main_table,
    overall_note,
    summary_table,
    testtime_table,
)
from envace.stages.runner import NULL_TRACKER, Tracker, stage_main
from envace.utils.io import atomic_dir, read_json, write_text

logger = logging.getLogger(__name__)

PAPER_REFERENCE = (
    "Paper reference (Qwen3-8B, arXiv 2608.06197; not measured here): EnvACE-8B Overall 32.91 "
    "(BFCL-v4 46.04, τ² 36.7, VitaBench 16.0); ablation τ²: GRPO 31.2 → EnvACE 36.7, per-role 35.5; "
    "test-time N=2: none 36.7, parallel+EnvACE rehearser 40.9, sequential+EnvACE 38.5, "
    "parallel+base 36.8, sequential+base 34.9."
)


def load_metrics(cfg: DictConfig) -> dict[str, Any]:
    root = Path(cfg.paths.metrics)
    names = ["prepare_data", "template_prompts", "train", "rehearsal_sweep"]
    names += [f"evaluate_{b}" for b in to_plain(cfg.eval.benchmarks)]
    return {n: read_json(root / f"{n}.json") for n in names if (root / f"{n}.json").exists()}


def load_experiments(cfg: DictConfig) -> dict[str, Any] | None:
    """``metrics/experiments.json`` (``python -m envace.experiments collect``), None if not collected."""
    path = Path(cfg.paths.metrics) / OUTPUT_NAME
    return read_json(path) if path.exists() else None


def load_steps(cfg: DictConfig) -> pd.DataFrame:
    path = Path(cfg.paths.plots) / "train_steps.csv"
    return pd.read_csv(path) if path.exists() and path.stat().st_size else pd.DataFrame()


def current_run(cfg: DictConfig, m: dict[str, Any]) -> RunResult:
    """This workspace's run as a comparison row (its params, policy success, final reward)."""
    params = {"profile": to_plain(cfg.profile), "experiment_name": cfg.experiment_name,
              "algo.name": to_plain(cfg.algo.name), "model.name": cfg.model.name,
              "engine.name": to_plain(cfg.engine.name), "seed": cfg.seed}
    success = {b: (m.get(f"evaluate_{b}", {}).get("policy") or {}).get("success_rate")
               for b in to_plain(cfg.eval.benchmarks)}
    return RunResult(run=CURRENT_RUN, params=params, success=success,
                     final_reward=m.get("train", {}).get("final/reward/mean"))


def comparisons(cfg: DictConfig, m: dict[str, Any], curves: pd.DataFrame):
    """(ablation table, scale table, {variant label: its curves}) over the collected runs + this one."""
    current = current_run(cfg, m)
    runs = collected_runs(load_experiments(cfg))
    benchmarks = to_plain(cfg.eval.benchmarks)
    ablation, variants = ablation_table(runs, current, benchmarks)
    scale, _ = scale_table(runs, current, benchmarks)
    reward = {f"{r.params['algo.name']} ({r.run})": curves if r is current else curves_frame(r.curves)
              for r in variants}
    return ablation, scale, reward


TITLES = {"main": "Main table (success % of tasks)", "benchmarks": "Each benchmark's own aggregates",
          "ablation": "Ablation: training variant (success %, same profile and model)",
          "scale": "Scale: model (success %, same profile and training variant)",
          "domains": "Per domain and held-out transfer", "fidelity": "World-model fidelity (REHEARSE vs real execution)",
          "testtime": "Test-time private rehearsal", "training": "Training", "data": "Data"}


TESTTIME_NOTE = ("Scope `turn` rehearses user turn t from what is known at turn t. Rows with scope "
                 "`task (sees future turns)` rehearsed every user turn before the first real call, so their "
                 "rehearsal and the memory the committed run read saw requests revealed only later: not comparable "
                 "with turn-scope rows. N=0 is the shared no-rehearsal baseline (scope `none`).")


SFT_NOTE = ("The SFT warm-up's REHEARSE targets are real tool responses: when the train stage builds its episodes "
            "it runs each gold call once on the real tool world (the analogue of CM2's recorded reference "
            "conversations). Only the warm-up sees them; the GRPO steps of rehearsing variants make no real call.")


def cross_run_note(cfg: DictConfig, what: str, collected: bool) -> str:
    source = f"`{cfg.paths.metrics}/{OUTPUT_NAME}`"
    if not collected:
        return (f"Only this run (`{CURRENT_RUN}`): no {source} yet. Run `make ablation`, or `dvc exp run -S "
                "algo=grpo` (`-S model=...` for scale), then `python -m envace.experiments collect && dvc repro report`.")
    return f"Rows: this run (`{CURRENT_RUN}`) and the latest experiment per {what} in {source} (`run` names it)."


def markdown(cfg: DictConfig, tables: dict[str, pd.DataFrame], plots: list[str], skipped: dict[str, str],
             collected: bool) -> str:
    head = [f"# envace report — profile `{to_plain(cfg.profile)}`, experiment `{cfg.experiment_name}`",
            (f"Model `{cfg.model.name}`, training variant `{to_plain(cfg.algo.name)}`, engine "
             f"`{to_plain(cfg.engine.name)}`. Every number in the tables and plots was measured by this "
             "pipeline (this run and, in the ablation and scale tables, the collected DVC experiments)."), ""]
    notes = {"ablation": cross_run_note(cfg, "variant", collected), "scale": cross_run_note(cfg, "model", collected),
             "main": overall_note(tables["main"], to_plain(cfg.eval.benchmarks)), "testtime": TESTTIME_NOTE}
    if int(cfg.train.sft_epochs) > 0:
        notes["training"] = SFT_NOTE
    body = []
    for key, title in TITLES.items():
        frame = tables[key]
        body += [f"## {title}", "", *([notes[key], ""] if key in notes else []),
                 frame.to_markdown(index=False, floatfmt=".3g") if not frame.empty else "_no data_", ""]
    body += ["## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    body += [f"- `{name}` not drawn: {why}." for name, why in skipped.items()]
    return "\n".join(head + body + ["", "## Reference (paper numbers, not measured here)", "", PAPER_REFERENCE, ""])


def run(cfg: DictConfig, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    m = load_metrics(cfg)
    steps = load_steps(cfg)
    curves = merge_curves(curves_frame(m.get("train", {}).get("curves")), steps)
    ablation, scale, reward = comparisons(cfg, m, curves)
    labels = {"base": f"{cfg.model.name} (base)", "policy": f"{to_plain(cfg.algo.name)} ({cfg.model.name})"}
    tables = {"main": main_table(to_plain(cfg.eval.benchmarks), labels, m), "benchmarks": benchmark_table(m),
              "ablation": ablation, "scale": scale, "domains": domain_table(m),
              "fidelity": fidelity_table(m), "testtime": testtime_table(m),
              "training": summary_table(m.get("train", {})), "data": summary_table(m.get("prepare_data", {}))}
    collected = (Path(cfg.paths.metrics) / OUTPUT_NAME).exists()
    out = Path(cfg.paths.reports)
    with atomic_dir(out) as tmp:
        for key, frame in tables.items():
            frame.to_csv(tmp / f"{key}.csv", index=False)
        plots, skipped = save_plots(tmp, steps=steps, curves=curves, variants=reward, testtime=tables["testtime"])
        write_text(tmp / "report.md", markdown(cfg, tables, plots, skipped, collected))
    tracker.log_artifact(out, "report")
    overall = tables["main"].set_index("method")["Overall"].to_dict()
    logger.info("report: %s (tables %s, plots %s, not drawn %s)", out / "report.md", sorted(tables), plots,
                sorted(skipped))
    return {"tables": sorted(tables), "plots": plots, "skipped_plots": skipped, "overall": overall,
            "ablation_runs": ablation["run"].tolist(), "scale_runs": scale["run"].tolist()}


main = stage_main("report", run, lambda cfg: Path(cfg.paths.reports) / "summary.json")

if __name__ == "__main__":
    raise SystemExit(main())
