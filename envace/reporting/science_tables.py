"""The science report's tables (pandas frames, written as CSV and shown in ``science.md``) and the
number formats they share: percentages, means with their 95% interval, signed paired differences."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from envace.reporting import reference
from envace.reporting.metrics_files import read_metrics
from envace.reporting.science_stats import SUBSETS, sft_warmed_up
from envace.utils.io import read_json


def pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def ci_text(stat: Mapping[str, Any], key: str = "mean") -> str:
    ci = stat.get("ci95")
    body = pct(stat.get(key))
    return f"{body} [{pct(ci[0])}, {pct(ci[1])}]" if ci else body


def signed(stat: Mapping[str, Any], ci_key: str = "ci95") -> str:
    ci = stat.get(ci_key)
    diff = stat.get("diff")
    if diff is None or (isinstance(diff, float) and math.isnan(diff)):
        return "–"
    text = f"{100 * diff:+.1f}"
    return f"{text} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else text


def main_table(agg: Mapping[str, Any], variants: list[str]) -> pd.DataFrame:
    rows = []
    for name in ["untrained_base", "sft_base", *variants]:
        stats = agg["variants"].get(name)
        if stats is None:
            continue
        ref = (
            reference.ablation_reference(name)
            if name in variants
            else (reference.main_reference("base", "") if name == "untrained_base" else None)
        )
        rows.append(
            {
                "model": name,
                "success % [95% CI]": ci_text(stats["all"]),
                "in-domain %": ci_text(stats["in_domain"]),
                "held-out domain %": ci_text(stats["held_out_domain"]),
                "per seed %": ", ".join(pct(x) for x in stats["all"]["per_seed"]),
                "n tasks × seeds": f"{stats['all']['n_tasks']} × {stats['all']['n_seeds']}",
                reference.REFERENCE_COLUMN: ref or "–",
            }
        )
    return pd.DataFrame(rows)


def differences_table(agg: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for name, by_subset in agg["differences"].items():
        a, b = name.split("-", 1)
        for subset in SUBSETS:
            d = by_subset[subset]
            rows.append(
                {
                    "A − B": f"{a} − {b}",
                    "subset": subset,
                    "difference (points) [95% CI]": signed(d),
                    "n tasks": d["n_tasks"],
                    "seeds (A, B)": tuple(d["n_seeds"]),
                }
            )
    return pd.DataFrame(rows)


def p_text(p: float | None) -> str:
    return "–" if p is None else f"{p:.3g}"


def primary_table(primary: Mapping[str, Any]) -> pd.DataFrame:
    """The declared primary comparisons (envace.reporting.science_family): difference with the bootstrap
    interval at the family's level, per-seed differences, raw and Holm-adjusted p, verdict."""
    level = f"{100 * primary['interval_level']:.4g}%"
    rows = []
    for name, r in primary["comparisons"].items():
        rows.append(
            {
                "primary comparison": name,
                f"A − B (points) [{level} CI, tasks]": signed(r, "ci"),
                "per seed (points)": ", ".join(f"{100 * d:+.1f}" for d in r["per_seed"]) or "–",
                "seeds": r["n_seeds"],
                "smallest attainable p": p_text(r["min_attainable_p"]),
                "p (sign-flip, one-sided)": p_text(r["p"]),
                "p (Holm)": p_text(r["p_holm"]),
                "verdict": r["verdict"],
            }
        )
    return pd.DataFrame(rows)


def parse_error_share(tasks: list[Mapping[str, Any]]) -> str:
    """The share of a cell's committed episodes that ended because ACT's output did not parse."""
    if not tasks:
        return "–"
    return pct(sum(t.get("termination") == "act_parse_error" for t in tasks) / len(tasks))


def optional(value: Any, spec: str) -> str:
    """``spec`` applied to a number, "–" where a cell has none (written before the field existed)."""
    return "–" if value is None else spec.format(value)


def testtime_table(testtime: Mapping[str, Any], comparisons: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for key, c in sorted(testtime.items()):
        variant, seed, mode, n, rehearser = key.split("/")
        n_attempts = int(n.removeprefix("n"))
        gain = comparisons.get(f"{key}-vs-n0")
        rows.append(
            {
                "cell": f"{variant}/{seed}",
                "mode": mode,
                "N": n_attempts,
                "rehearser": rehearser,
                "success %": pct(c.get("success_rate")),
                "n": len(c.get("tasks", [])),
                "gain vs N=0 (points) [95% CI]": signed(gain) if gain else "–",
                "rehearsal tokens / task": f"{c.get('cost/rehearsal_completion_tokens', 0):.0f}",
                "rehearsal wall s / task": f"{c.get('cost/rehearsal_wall_s', 0):.1f}",
                # backend seconds of its rehearsal generations, each reused one at what it cost when generated
                "rehearsal generation s / task": optional(c.get("cost/rehearsal_generation_s"), "{:.1f}"),
                "reused generations / task": optional(c.get("cost/rehearsal_reused_calls"), "{:.1f}"),
                "real calls / task": f"{c.get('cost/real_env_calls', 0):.2f}",
                "ended by ACT parse error %": parse_error_share(c.get("tasks", [])),
                "committed executions / task": f"{c.get('cost/committed_executions', 0):.0f}",
                "same run as": c.get("same_as") or "–",  # N=1: one program in both modes, run once
                reference.REFERENCE_COLUMN: reference.testtime_reference(n_attempts, mode, rehearser) or "–",
            }
        )
    return pd.DataFrame(rows)


def testtime_pooled_table(comparisons: Mapping[str, Any]) -> pd.DataFrame:
    """The test-time comparisons pooled over seeds (envace.reporting.science_stats.testtime_pooled): one row
    each, with its seeds and per-seed differences."""
    rows = [
        {
            "comparison": name,
            "seeds": ", ".join(map(str, d["seeds"])),
            "difference (points) [95% CI]": signed(d),
            "per seed (points)": ", ".join(f"{100 * x:+.1f}" for x in d["per_seed"]),
            "n tasks": d["n_tasks"],
        }
        for name, d in sorted(comparisons.items())
        if "seeds" in d
    ]
    columns = ["comparison", "seeds", "difference (points) [95% CI]", "per seed (points)", "n tasks"]
    return pd.DataFrame(rows, columns=columns)


def reruns_table(reruns: Mapping[str, Any]) -> pd.DataFrame:
    """Test-time cells run twice (stage testtime, then stage testtime_grid): both success rates, agreement."""
    rows = [
        {
            "cell": key,
            "success % (testtime, used)": pct(r["success"]),
            "success % (testtime_grid re-run)": pct(r["rerun_success"]),
            "tasks with the same outcome %": pct(r["agree"]),
            "n tasks": r["n_tasks"],
        }
        for key, r in sorted(reruns.items())
    ]
    columns = ["cell", "success % (testtime, used)", "success % (testtime_grid re-run)"]
    return pd.DataFrame(rows, columns=[*columns, "tasks with the same outcome %", "n tasks"])


def fidelity_table(root: Path, cells: Mapping[str, Any]) -> pd.DataFrame:
    """REHEARSE on the oracle's real calls (the same calls for every model): SFT base, untrained, cells."""
    rows = []
    path = root / "sft" / "evaluate_toolworld.json"
    sft = read_json(path) if path.exists() else {}
    models = [("untrained_base", sft.get("base", {}))] if sft_warmed_up(root) else []
    models += [("sft_base", sft.get("policy", {}))]
    models += [(key, cell["evaluate"].get("policy", {})) for key, cell in sorted(cells.items())]
    for name, m in models:
        fid = m.get("fidelity_gold")
        if fid:
            rows.append(
                {
                    "rehearser": name,
                    "calls": fid.get("n"),  # FidelityStats.to_json: the number of scored calls
                    "exact match": pct(fid.get("exact_match")),
                    "field F1": pct(fid.get("field_f1")),
                    "error agreement": pct(fid.get("error_agreement")),
                }
            )
    return pd.DataFrame(rows)


PROBE_KEYS = ("fidelity/exact_match", "fidelity/field_f1", "fidelity/error_agreement")


def probe_fidelity_table(cells: Mapping[str, Any]) -> pd.DataFrame:
    """REHEARSE on the oracle's real calls of the training probe's val tasks (the same calls in every cell):
    at step 0 (the SFT start, before any GRPO update) and at the last step, mean over a variant's seeds."""
    per_variant: dict[str, list[tuple[pd.Series, pd.Series, float]]] = {}
    for cell in cells.values():
        csv = Path(cell["dir"]) / "train_steps.csv"
        if not csv.exists():
            continue
        frame = pd.read_csv(csv)
        if not set(PROBE_KEYS) <= set(frame.columns):
            continue
        probed = frame.dropna(subset=["fidelity/field_f1"]).sort_values("step")
        if len(probed) >= 2:
            per_variant.setdefault(cell["variant"], []).append(
                (probed.iloc[0], probed.iloc[-1], float(probed.iloc[0].get("fidelity/n_calls", float("nan"))))
            )
    rows = []
    for variant, probes in sorted(per_variant.items()):
        row: dict[str, Any] = {
            "variant": variant,
            "seeds": len(probes),
            "calls": probes[0][2],
            "last step": int(probes[0][1]["step"]),
        }
        for key in PROBE_KEYS:
            start = float(np.mean([p[0][key] for p in probes]))
            end = float(np.mean([p[1][key] for p in probes]))
            name = key.removeprefix("fidelity/").replace("_", " ")
            row[f"{name}: step 0 → last"] = f"{pct(start)} → {pct(end)} ({100 * (end - start):+.1f})"
        rows.append(row)
    return pd.DataFrame(rows)


def calibration_table(root: Path) -> pd.DataFrame:
    path = root / "sft" / "evaluate_toolworld.json"
    if not path.exists():
        return pd.DataFrame()
    m = read_metrics(path)
    rows = []
    for label, name in (("base", "untrained base"), ("policy", "SFT'd base (every cell's start)")):
        r = m.get(label) if label != "base" or sft_warmed_up(root) else None  # no warm-up: base is the start
        if not r:
            continue
        row = {
            "model": name,
            "test success %": pct(r["success_rate"]),
            "n": r["n_tasks"],
            "in-domain %": pct((r.get("in_domain") or {}).get("success_rate")),
            "held-out %": pct((r.get("transfer") or {}).get("success_rate")),
        }
        row.update({f"{d} %": f"{pct(g['success_rate'])} (n={g['n']})" for d, g in r.get("per_domain", {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def timings(root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(root.rglob("timing_*.json")):
        t = read_json(path)
        rows.append(
            {
                "part": f"{path.parent.relative_to(root)}/{t['part']}",
                "minutes": round(sum(t["seconds"].values()) / 60, 1),
                "threads": t.get("threads"),
                "peak MiB": t.get("peak_rss_mb"),  # envace.stages.science_matrix records it
                "cpu": t.get("cpu"),
            }
        )
    return pd.DataFrame(rows)
