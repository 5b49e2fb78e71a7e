"""The science matrix's aggregate: ``science.json`` and ``science/report`` (markdown, CSVs, PNGs).

``science.json`` (git-tracked) is written in two halves, as a stage's metrics are
(``envace.reporting.metrics_files.write_metrics``): ``science.json`` holds the ``HEADLINE`` numbers, the DVC metrics
``dvc metrics show`` lists; ``science.details.json`` beside it holds everything else at the same keys;
``envace.reporting.metrics_files.read_metrics`` merges them back into this layout:
- one entry per cell, keyed ``<variant>/seed<k>``: ``success`` (strict success rate on the test split),
  ``n``, ``held_out_domain_success``, ``tasks`` (task id -> 0/1) and the cell's training summary;
- ``sft_base`` / ``untrained_base``: the shared starting checkpoint and the model before SFT, same layout;
- ``aggregate``: per group (variant, sft_base, untrained_base) and subset (all, in_domain,
  held_out_domain) the mean with its 95% bootstrap interval, and each paired difference with its
  unadjusted 95% interval and that interval's reading (``verdict``, kept for old readers: exploratory, not
  a test; envace.reporting.science_stats);
- ``primary``: the declared family (``science.primary``) tested with Holm's correction: per comparison
  its difference, per-seed differences, raw and Holm-adjusted p, verdict and bootstrap interval at the
  family's level (envace.reporting.science_family);
- ``testtime``: per sweep cell ``<variant>/seed<k>/<mode>/n<N>/<rehearser>`` its success, n, costs, and
  ``testtime_comparisons``: each cell's paired gain over N=0 and the paper's trained-vs-base comparison per
  seed, and both pooled over the seeds that ran them (keys without a seed, ``envace/parallel/n2/trained-vs-n0``,
  with ``seeds`` and ``per_seed``); ``testtime_reruns``: cells two stages ran, with both success rates.

The tables are envace.reporting.science_tables, the figures envace.reporting.science_plots; this module
writes ``science.json`` and the report's markdown. The report reads the paper's numbers only through
envace.reporting.reference (a labelled column).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from envace.config.load import to_plain
from envace.reporting import reference
from envace.reporting.figures import save_figure
from envace.reporting.metrics_files import write_metrics
from envace.reporting.science_family import TEST, primary_family, seeds_needed
from envace.reporting.science_plots import (
    curves_by_variant,
    curves_figure,
    efficiency_figure,
    main_figure,
    testtime_figure,
)
from envace.reporting.science_provenance import part_states, provenance_summary, provenance_table
from envace.reporting.science_stats import summarize
from envace.reporting.science_tables import (
    calibration_table,
    differences_table,
    fidelity_table,
    main_table,
    p_text,
    primary_table,
    probe_fidelity_table,
    reruns_table,
    signed,
    testtime_pooled_table,
    testtime_table,
    timings,
)
from envace.utils.io import atomic_dir

logger = logging.getLogger(__name__)

# the paper's four claims: (name, the differences that read it, what the paper reports); a test-time key
# starting with "/" is the end of a comparison name (the primary pooled over seeds, or a seed's row)
CLAIMS = (
    ("EnvACE training improves its starting policy", ("envace-sft_base",), "EnvACE-8B 32.91 vs Qwen3-8B 28.48 Overall"),
    ("Training the REHEARSE role beats standard GRPO (ACT only, real responses)", ("envace-grpo",), "τ² 36.7 vs 31.2"),
    ("One shared policy beats two separate role models", ("envace-per_role",), "τ² 36.7 vs 35.5"),
    (
        "Self-rehearsal beats training on a frozen simulator's responses",
        ("envace-grpo_simulator",),
        "not compared in the paper",
    ),
    (
        "Test-time rehearsal helps with the trained rehearser, more than with the base",
        ("/parallel/n2/trained-vs-n0", "/parallel/n2/trained-vs-base"),
        "parallel N=2: +4.2 trained vs +0.1 base",
    ),
)
EXPLORATORY = "exploratory (unadjusted 95% interval, not a test)"

# what ``science.json`` keeps for DVC (glob patterns over the nested key path, as
# ``envace.reporting.metrics_files.HEADLINE``): per group its mean over all tasks, each difference over all tasks and
# the primary family's differences with their Holm-adjusted p; the cells, tasks, intervals and test-time
# cells are in ``science.details.json``
HEADLINE = (
    "aggregate.variants.*.all.mean",
    "aggregate.differences.*.all.diff",
    "primary.comparisons.*.diff",
    "primary.comparisons.*.p_holm",
)


def _task_map(rows: list[Mapping[str, Any]]) -> dict[str, int]:
    return {str(r["task_id"]): int(bool(r.get("success"))) for r in rows}


def science_json(summary: Mapping[str, Any], cfg: DictConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, cell in summary["cells"].items():
        held = [r for r in cell["tasks"] if r.get("held_out_kind") == "domain"]
        train = cell["train"]
        out[key] = {
            "variant": cell["variant"],
            "seed": cell["seed"],
            "n": len(cell["tasks"]),
            "success": float(np.mean([bool(r.get("success")) for r in cell["tasks"]])),
            "held_out_domain_success": float(np.mean([bool(r.get("success")) for r in held])) if held else None,
            "n_held_out_domain": len(held),
            "tasks": _task_map(cell["tasks"]),
            "train": {k: v for k, v in train.items() if k.startswith("final/") or k == "steps_done"},
        }
    for name, o in summary["groups"].items():
        if name in ("sft_base", "untrained_base"):
            out[name] = {
                "n": len(o.task_ids),
                "success": o.mean,
                "tasks": {t: int(v) for t, v in zip(o.task_ids, o.matrix[0])},
            }
    agg = summary["aggregate"]
    out["aggregate"] = {"variants": agg["variants"], "differences": agg["differences"]}
    out["primary"] = agg["primary"]
    out["testtime"] = {
        k: {key: v for key, v in c.items() if key != "tasks"} | {"n": len(c["tasks"])}
        for k, c in summary["testtime"].items()
    }
    out["testtime_comparisons"] = agg["testtime"]
    out["testtime_reruns"] = agg["testtime_reruns"]
    s = cfg.science
    out["positive_control"] = summary["positive_control"]
    out["design"] = {
        "model": str(cfg.model.name),
        "variants": to_plain(s.variants),
        "seeds": to_plain(s.seeds),
        "n_train": int(s.n_train),
        "n_test": int(s.n_test),
        "sft_epochs": int(s.sft_epochs),
        "steps": int(s.steps),
        "bootstrap_resamples": int(s.bootstrap_resamples),
        "data_seed": int(s.data_seed),
    }
    return out


# ---- the report -------------------------------------------------------------------------------------
# further differences read under a claim where the run has them: (claim's key, difference, what it isolates)
ALSO = {
    "envace-grpo": (
        ("envace-frozen_rehearse", "the same imagined rollouts with REHEARSE not trained (frozen_rehearse)"),
        ("envace-frozen_act", "the same imagined rollouts with ACT not trained (frozen_act)"),
    ),
}


def _label(name: str) -> str:
    return f"`{name}`" if "/" in name else name.replace("-", " − ")


def _primary_text(name: str, row: Mapping[str, Any], primary: Mapping[str, Any]) -> str:
    if row["verdict"] == "not measured":
        return f"{_label(name)}: not measured in this run (primary)"
    seeds = ", ".join(f"{100 * d:+.1f}" for d in row["per_seed"])
    return (
        f"{_label(name)} = {signed(row, 'ci')} points (per seed {seeds}); sign-flip p = {p_text(row['p'])}, "
        f"Holm-adjusted {p_text(row['p_holm'])} against α = {primary['alpha']} (smallest attainable with "
        f"{row['n_seeds']} seed{'' if row['n_seeds'] == 1 else 's'}: {p_text(row['min_attainable_p'])}) → primary, "
        f"**{row['verdict']}**"
    )


def comparison_text(agg: Mapping[str, Any], key: str) -> str | None:
    """A comparison's reading: the primary row where the family declares it, else the exploratory row."""
    primary = agg.get("primary") or {"comparisons": {}}
    testtime = key.startswith("/")
    for name, row in sorted(primary["comparisons"].items()):
        if name == key or (testtime and name.endswith(key)):
            return _primary_text(name, row, primary)
    if testtime:  # pooled over seeds (no seed in the name) where two or more seeds have it, else the first seed's
        found = sorted((k.count("/"), k) for k in agg["testtime"] if k.endswith(key))
        name = found[0][1] if found else None
        d = agg["testtime"].get(name) if name else None
    else:
        name, d = key, agg["differences"].get(key, {}).get("all")
    if d is None:
        return None
    if "seeds" in d:
        seeds = ", ".join(f"{100 * x:+.1f}" for x in d["per_seed"])
        size = f"{d['n_tasks']} tasks × {len(d['seeds'])} seeds {d['seeds']}; per seed {seeds}"
    else:
        size = f"{d['n_tasks']} tasks"
    return f"{_label(name)} = {signed(d)} points ({size}) → {EXPLORATORY}"


def claims_reading(agg: Mapping[str, Any]) -> list[str]:
    lines = []
    for title, keys, paper in CLAIMS:
        texts = [t for t in (comparison_text(agg, k) for k in keys) if t]
        head = f"- **{title}** (paper: {paper}): "
        if not texts:
            lines.append(head + "not measured in this run.")
            continue
        lines.append(head + texts[0] + ".")
        lines += [f"  - {t}." for t in texts[1:]]
        for other, what in ALSO.get(keys[0], ()):
            text = comparison_text(agg, other)
            if text is not None:
                lines.append(f"  - against {what}: {text}.")
    return lines


def markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False) if not frame.empty else "_(nothing measured)_"


def validation_gain(steps_csv: Path) -> dict[str, Any] | None:
    """A cell's real-environment validation success at its first and last probe (``val/success`` of
    ``train_steps.csv``; step 0 is the start) and the gain in points; None without two probes."""
    if not steps_csv.is_file():
        return None
    frame = pd.read_csv(steps_csv)
    if "val/success" not in frame.columns:
        return None
    probes = frame[["step", "val/success"]].dropna()
    if len(probes) < 2:
        return None
    first, last = probes.iloc[0], probes.iloc[-1]
    return {
        "steps": [int(first["step"]), int(last["step"])],
        "start": float(first["val/success"]),
        "end": float(last["val/success"]),
        "gain_points": round(100 * (float(last["val/success"]) - float(first["val/success"])), 2),
    }


def positive_control(summary: Mapping[str, Any], gate: Mapping[str, Any], n_seeds: int) -> dict[str, Any]:
    """The gate of issue 46 on the matrix's own cells of ``gate.variant`` (grpo on the real environment): a
    validation gain of at least ``min_gain_points`` in at least ``min_seeds`` of the design's ``n_seeds``
    seeds, and on the test split the variant minus the SFT start with its paired 95% interval above 0.
    A half is None while undecided: the validation half until ``min_seeds`` seeds have the gain or too few
    seeds are left to reach it (a matrix part-way through), the test half without cells or ``sft_base``;
    ``passed`` is None while either half is."""
    variant = str(gate["variant"])
    cells = sorted((c for c in summary["cells"].values() if c["variant"] == variant), key=lambda c: int(c["seed"]))
    gains = {int(c["seed"]): validation_gain(Path(c["dir"]) / "train_steps.csv") for c in cells}
    measured = {seed: g for seed, g in gains.items() if g is not None}
    enough = [seed for seed, g in measured.items() if g["gain_points"] >= float(gate["min_gain_points"])]
    test = summary["aggregate"]["differences"].get(f"{variant}-sft_base", {}).get("all")
    need, short = int(gate["min_seeds"]), len(measured) - len(enough)
    validation_ok = True if len(enough) >= need else False if n_seeds - short < need else None
    test_ok = None if test is None or test.get("ci95") is None else bool(test["ci95"][0] > 0)
    return {
        "variant": variant,
        "min_gain_points": float(gate["min_gain_points"]),
        "min_seeds": int(gate["min_seeds"]),
        "validation": {str(seed): g for seed, g in measured.items()},
        "seeds_with_gain": len(enough),
        "seeds_measured": len(measured),
        "validation_passed": validation_ok,
        "test_minus_start": None if test is None else {k: test[k] for k in ("diff", "ci95", "n_tasks") if k in test},
        "test_passed": test_ok,
        "passed": None if validation_ok is None or test_ok is None else bool(validation_ok and test_ok),
    }


def aggregate(cfg: DictConfig) -> dict[str, Any]:
    """Write ``science.json`` and ``science.reports`` from the per-part files under ``science.metrics``."""
    s = cfg.science
    root = Path(s.metrics)
    variants = [str(v) for v in to_plain(s.variants)]
    summary = summarize(root, variants, int(s.bootstrap_resamples))
    summary["positive_control"] = positive_control(summary, to_plain(s.positive_control), len(to_plain(s.seeds)))
    agg = summary["aggregate"]
    agg["primary"] = primary_family(summary, s, int(s.bootstrap_resamples))
    result = science_json(summary, cfg)
    parts = part_states(Path.cwd())  # the stages run at the repository root
    result["provenance"] = provenance_summary(parts)
    tables = {
        "science_provenance": provenance_table(parts),
        "science_main": main_table(agg, variants),
        "science_primary": primary_table(agg["primary"]),
        "science_differences": differences_table(agg),
        "science_calibration": calibration_table(root),
        "science_fidelity": fidelity_table(root, summary["cells"]),
        "science_fidelity_training": probe_fidelity_table(summary["cells"]),
        "science_testtime": testtime_table(summary["testtime"], agg["testtime"]),
        "science_testtime_pooled": testtime_pooled_table(agg["testtime"]),
        "science_testtime_reruns": reruns_table(agg["testtime_reruns"]),
        "science_costs": timings(root),
    }
    figures = {
        "science_main.png": main_figure(agg, variants),
        "science_curves.png": curves_figure(curves_by_variant(summary["cells"])),
        "science_efficiency.png": efficiency_figure(curves_by_variant(summary["cells"])),
        "science_testtime.png": testtime_figure(summary["testtime"]),
    }
    with atomic_dir(s.reports) as tmp:
        for name, frame in tables.items():
            frame.to_csv(tmp / f"{name}.csv", index=False)
        drawn = []
        for name, fig in figures.items():
            if fig is not None:
                save_figure(fig, tmp / name)
                drawn.append(name)
        (tmp / "science.md").write_text(report_text(cfg, tables, drawn, agg, summary["positive_control"]))
    write_metrics(Path(s.json), result, HEADLINE)
    logger.info(
        "science: %d cells, %d test-time cells -> %s, %s",
        len(summary["cells"]),
        len(summary["testtime"]),
        s.json,
        s.reports,
    )
    return result


def gate_text(positive: Mapping[str, Any]) -> str:
    """The positive control's paragraph: per seed validation gains, the test difference, the verdict."""
    v = positive["variant"]
    head = (
        f"Does `{v}` on the real environment learn from this start? The gate: a validation gain of at least "
        f"{positive['min_gain_points']:g} points (last probe minus step 0) in at least {positive['min_seeds']} "
        "seeds, and on the test split a paired 95% interval of "
        f"{v} − SFT start above 0. Until it holds, no variant difference here is a finding."
    )
    if not positive["validation"]:
        return head + f" **Not measured**: no `{v}` cell with a validation curve (`science.val_every`)."
    gains = ", ".join(
        f"seed {seed}: {100 * g['start']:.0f}% → {100 * g['end']:.0f}% ({g['gain_points']:+.0f})"
        for seed, g in positive["validation"].items()
    )
    test = positive["test_minus_start"]
    test_text = (
        "not measured"
        if test is None or test.get("ci95") is None
        else f"{100 * test['diff']:+.1f} points [{100 * test['ci95'][0]:+.1f}, {100 * test['ci95'][1]:+.1f}] "
        f"on {test['n_tasks']} tasks"
    )
    verdict = {True: "**holds**", False: "**does not hold**", None: "**not decided** (a half is unmeasured)"}
    return (
        f"{head}\n\nValidation: {gains} ({positive['seeds_with_gain']} of {positive['seeds_measured']} seeds "
        "measured reach the gain). "
        f"Test: {v} − SFT start = {test_text}. The gate {verdict[positive['passed']]}."
    )


def start_text(cfg: DictConfig) -> str:
    """How the cells' shared start was made: the matrix's own SFT warm-up, or (no epochs: the organism) the
    committed SFT model the configured path names."""
    s = cfg.science
    if int(s.sft_epochs) > 0:
        return f"One SFT warm-up ({s.sft_epochs} epochs on gold ACT/REHEARSE targets)"
    return f"The SFT model at `{cfg.model.path}` (committed, with its record; no warm-up in this matrix)"


def report_text(
    cfg: DictConfig,
    tables: Mapping[str, pd.DataFrame],
    figures: list[str],
    agg: Mapping[str, Any],
    positive: Mapping[str, Any],
) -> str:
    s = cfg.science
    parts = [
        "# Science run: does EnvACE learn on the tool world?",
        "",
        f"Model {cfg.model.name} ({to_plain(cfg.model.kind)}); tool world with {s.n_train} training tasks and "
        f"{s.n_test} test "
        f"tasks (data seed {s.data_seed}; held-out domain `{cfg.data.held_out_domain}` never trained on). "
        f"{start_text(cfg)} is every cell's start; each cell then runs "
        f"{s.steps} role-wise GRPO steps ({cfg.rollout.prompts_per_step} prompts × K={cfg.rollout.samples_per_prompt}) "
        f"with training seed k ∈ {to_plain(s.seeds)}. Trained on the verifiable tool-world reward "
        f"(judge `{to_plain(cfg.judge.name)}`); the headline metric is the strict success rate: a task succeeds when "
        "the final state of its domain equals the state its gold calls produce and every user turn's reply "
        "mentions that turn's key values (envace.envs.toolworld.scoring). "
        "Intervals: 95% percentile bootstrap over tasks and seeds; differences are paired on the same tasks "
        "(envace.reporting.science_stats). Only the declared primary comparisons are tested (with a correction "
        "for their number); every other difference is exploratory. Every number below comes from a run of this "
        "code; the paper's "
        f'numbers appear only in the column "{reference.REFERENCE_COLUMN}" ({reference.SOURCE})',
        "",
        "## The paper's claims at this scale",
        "",
        *claims_reading(agg),
        "",
        "## Provenance",
        "",
        "Per part of the matrix with results: the commit(s) its stage runs recorded (`+dirty`: files outside "
        "the part's dependencies had uncommitted changes) and whether its code, params and data inputs still "
        "equal what `science/dvc.lock` recorded for its run (envace.reporting.science_provenance). Data inputs "
        "are by-products of earlier parts (prepared tasks, the SFT model, a cell's checkpoint): they are compared "
        "where they exist on the machine that wrote this report and listed where they do not. A current part's "
        "numbers are what this commit's declared code produces from those inputs. A stage lists its code by "
        "hand, so the last column names the files its command can import (the static import closure, an "
        "over-approximation) that it does not list and that changed since the commit it ran at: code DVC "
        "does not compare, and whose change the reader has to judge (e.g. a reporting module that only the "
        "aggregate runs).",
        "",
        markdown(tables["science_provenance"]),
        "",
        "## Calibration: the starting point",
        "",
        markdown(tables["science_calibration"]),
        "",
        "## The positive control (the gate)",
        "",
        gate_text(positive),
        "",
        "## Main comparison and ablation (test split)",
        "",
        markdown(tables["science_main"]),
        "",
        "## Primary comparisons (Holm-corrected)",
        "",
        primary_text(agg["primary"]),
        "",
        markdown(tables["science_primary"]),
        "",
        "## Exploratory differences (unadjusted 95% intervals)",
        "",
        "Every other difference, each read alone at 95% with no correction for the number of rows: an interval "
        "that excludes 0 here is a lead for a primary comparison of a later run, not a finding.",
        "",
        markdown(tables["science_differences"]),
        "",
        "## World-model fidelity on the oracle's calls",
        "",
        "During training (the probe: REHEARSE predicts the real responses of the oracle's calls on the "
        "validation tasks; step 0 is the shared SFT start):",
        "",
        markdown(tables["science_fidelity_training"]),
        "",
        "On the test tasks' oracle calls (`eval.gold_fidelity_tasks`):",
        "",
        markdown(tables["science_fidelity"]),
        "",
        "## Test-time rehearsal",
        "",
        "Within one sweep the cells share identical generations (same seeds): attempts 1–2 of N=4 are "
        "N=2's, attempt 1 of N=2 is N=1's, so the N values are compared on common draws. Wall time is "
        "what each cell took in the sweep (the marginal time); generation seconds book every rehearsal "
        "generation at what it cost when it was generated, reused or not. The gains over N=0 are exploratory "
        "(unadjusted 95% intervals, one seed's cell each); a primary comparison above pools a cell over seeds.",
        "",
        markdown(tables["science_testtime"]),
        "",
        "Pooled over the seeds that ran both sides (exploratory, unadjusted 95% intervals; paired on the tasks, "
        "seeds resampled as rows):",
        "",
        markdown(tables["science_testtime_pooled"]) if len(tables["science_testtime_pooled"]) else "(none yet)",
        "",
        *reruns_text(tables["science_testtime_reruns"]),
        "## What each part cost",
        "",
        markdown(tables["science_costs"]),
        "",
        "## Figures",
        "",
        *[f"![{name}]({name})" for name in figures],
        "",
        "## What this shows and does not",
        "",
        f"{cfg.model.name}, {s.steps} GRPO steps per cell, {len(to_plain(s.seeds))} seeds and {s.n_test} test "
        'tasks detect only effects of their size; "not supported" means the primary\'s test did not reach α with '
        "these seeds and tasks, not that the effect is absent. The paper's numbers come from an 8B model trained "
        "for 470 steps on CM2 and evaluated on other benchmarks; they are a reference for direction, not a target "
        "for these values.",
        "",
    ]
    return "\n".join(parts)


def reruns_text(table: Any) -> list[str]:
    """The paragraph on test-time cells that two stages ran (none: nothing)."""
    if not len(table):
        return []
    return [
        "Cells run twice, by stage `testtime` (the run used above) and again by stage `testtime_grid` (which runs "
        "a seed's whole grid, N=0 and parallel N=2 included): what re-running one configuration changes.",
        "",
        markdown(table),
        "",
    ]


def primary_text(primary: Mapping[str, Any]) -> str:
    """What the primary table tests, and what its seeds allow (the smallest attainable p)."""
    m, alpha = primary["family_size"], primary["alpha"]
    if not m:
        return "No primary comparison is declared (`science.primary.comparisons` is empty): nothing is tested."
    seeds = sorted({r["n_seeds"] for r in primary["comparisons"].values()})
    return (
        f"The {m} comparisons declared in `science.primary.comparisons` (chosen before the results), "
        f"tested as a family: {TEST} (envace.reporting.science_family), family-wise α = {alpha}; a primary "
        "is **supported** when its Holm-adjusted p < α. One-sided, since each is the claim that A beats B: "
        'a negative difference reads "not supported", never "A < B". With S seeds the sign-flip p cannot go '
        f"below 1/2^S (this run's comparisons have S ∈ {seeds}: smallest attainable p in the table); Holm's "
        f"first step asks p < α/{m} = {alpha / m:.4g}, which needs at least {seeds_needed(alpha, m)} seeds, "
        f"all in favour of A. Intervals: task-level paired bootstrap at {100 * primary['interval_level']:.4g}% "
        f"= 1 − α/{m} (Bonferroni: simultaneous for the family); they size the effect and do not enter the verdict."
    )
