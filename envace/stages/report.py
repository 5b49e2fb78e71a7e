"""Stage ``report``: paper-shaped tables (markdown + CSV) and PNG plots from the metrics files.

Reads only ``paths.metrics/*.json`` and ``paths.plots/train_steps.csv`` (seconds, no models). Tables:
main (method × benchmark + Overall, success %), per-domain and held-out transfer, world-model
fidelity, test-time rehearsal (N × mode × rehearser, gain over N=0), training and data summaries.
Numbers are what *this* pipeline measured on its profile; the paper's numbers appear only in a
section labelled as reference.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from envace.config import to_plain
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


def main_table(cfg: DictConfig, m: dict[str, Any]) -> pd.DataFrame:
    labels = {"base": f"{cfg.model.name} (base)", "policy": f"{to_plain(cfg.algo.name)} ({cfg.model.name})"}
    rows = []
    for key, label in labels.items():
        row: dict[str, Any] = {"method": label}
        for bench in to_plain(cfg.eval.benchmarks):
            result = m.get(f"evaluate_{bench}", {}).get(key)
            row[bench] = None if result is None else 100 * result["success_rate"]
        scores = [v for k, v in row.items() if k != "method" and v is not None]
        row["Overall"] = sum(scores) / len(scores) if scores else None
        rows.append(row)
    return pd.DataFrame(rows)


def domain_table(m: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for name, result in m.items():
        if not name.startswith("evaluate_"):
            continue
        for label in ("policy", "base"):
            r = result.get(label)
            if not r:
                continue
            groups = {**{f"domain:{d}": g for d, g in r.get("per_domain", {}).items()},
                      "held-out (transfer)": r.get("transfer"), "in-domain": r.get("in_domain")}
            rows += [{"benchmark": result["benchmark"], "model": label, "group": g, "n": v["n"],
                      "success_%": 100 * v["success_rate"], "mean_score": v["mean_score"]}
                     for g, v in groups.items() if v]
    return pd.DataFrame(rows)


def fidelity_table(m: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for name, result in m.items():
        for label in ("policy", "base"):
            fid = result.get(label, {}).get("fidelity") if name.startswith("evaluate_") else None
            if fid:
                rows.append({"benchmark": result["benchmark"], "model": label, **fid})
    return pd.DataFrame(rows)


def testtime_table(m: dict[str, Any]) -> pd.DataFrame:
    cells = m.get("rehearsal_sweep", {}).get("cells", [])
    cols = ["n_attempts", "mode", "rehearser", "success_rate", "gain_vs_none", "cost/rehearsal_completion_tokens"]
    frame = pd.DataFrame(cells)
    return frame[[c for c in cols if c in frame.columns]] if not frame.empty else frame


def save_plots(cfg: DictConfig, tables: dict[str, pd.DataFrame], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    steps_csv = Path(cfg.paths.plots) / "train_steps.csv"
    steps = pd.read_csv(steps_csv) if steps_csv.exists() and steps_csv.stat().st_size else pd.DataFrame()
    reward_cols = [c for c in steps.columns if "reward" in c][:4]
    if not steps.empty and reward_cols:
        ax = steps.plot(x="step", y=reward_cols, figsize=(6, 3.5), title="training reward per step")
        ax.figure.tight_layout()
        ax.figure.savefig(out / "training_curve.png", dpi=100)
        made.append("training_curve.png")
    tt = tables["testtime"]
    if not tt.empty:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        base = tt[tt.n_attempts == 0].success_rate
        for (mode, who), grp in tt[tt.n_attempts > 0].groupby(["mode", "rehearser"]):
            xs, ys = [0, *grp.n_attempts], [*(base.iloc[:1] if len(base) else grp.success_rate.iloc[:1]), *grp.success_rate]
            ax.plot(xs, ys, marker="o", label=f"{mode}, {who} rehearser")
        ax.set(xlabel="private rehearsal attempts N", ylabel="success rate", title="test-time rehearsal")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "testtime.png", dpi=100)
        made.append("testtime.png")
    plt.close("all")
    return made


def markdown(cfg: DictConfig, tables: dict[str, pd.DataFrame], plots: list[str]) -> str:
    head = [f"# envace report — profile `{to_plain(cfg.profile)}`, experiment `{cfg.experiment_name}`",
            f"Model `{cfg.model.name}`, training variant `{to_plain(cfg.algo.name)}`, engine "
            f"`{to_plain(cfg.engine.name)}`. All numbers were measured by this pipeline run.", ""]
    titles = {"main": "Main table (success %, Overall = mean over benchmarks)", "domains": "Per domain and held-out transfer",
              "fidelity": "World-model fidelity (REHEARSE vs real execution)", "testtime": "Test-time private rehearsal",
              "training": "Training", "data": "Data"}
    body = []
    for key, title in titles.items():
        frame = tables[key]
        body += [f"## {title}", "", frame.to_markdown(index=False, floatfmt=".3g") if not frame.empty else "_no data_", ""]
    body += [f"![{p}]({p})" for p in plots]
    return "\n".join(head + body + ["", "## Reference", "", PAPER_REFERENCE, ""])


SUMMARY_KEYS = ("variant", "steps_done", "n_train_rows", "source", "n_raw", "n_train", "n_val", "n_rejected")
SUMMARY_HINTS = ("reward", "loss", "parse_fail", "time/step", "kl", "mean")


def summary_table(metrics: dict[str, Any]) -> pd.DataFrame:
    """Two columns (metric, value): the named keys plus rewards, losses, parse failures, means."""
    rows = [{"metric": k, "value": v} for k, v in metrics.items()
            if (k in SUMMARY_KEYS or any(h in k for h in SUMMARY_HINTS)) and isinstance(v, (int, float, str))]
    return pd.DataFrame(rows)


def run(cfg: DictConfig, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    m = load_metrics(cfg)
    tables = {"main": main_table(cfg, m), "domains": domain_table(m), "fidelity": fidelity_table(m),
              "testtime": testtime_table(m), "training": summary_table(m.get("train", {})),
              "data": summary_table(m.get("prepare_data", {}))}
    out = Path(cfg.paths.reports)
    with atomic_dir(out) as tmp:
        for key, frame in tables.items():
            frame.to_csv(tmp / f"{key}.csv", index=False)
        plots = save_plots(cfg, tables, tmp)
        write_text(tmp / "report.md", markdown(cfg, tables, plots))
    tracker.log_artifact(out, "report")
    overall = tables["main"].set_index("method")["Overall"].to_dict()
    logger.info("report: %s (tables %s, plots %s)", out / "report.md", sorted(tables), plots)
    return {"tables": sorted(tables), "plots": plots, "overall": overall}


main = stage_main("report", run, lambda cfg: Path(cfg.paths.reports) / "summary.json")

if __name__ == "__main__":
    raise SystemExit(main())
