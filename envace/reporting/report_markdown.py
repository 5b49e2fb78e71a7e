"""The report's markdown: title, provenance header (commit, profile, seeds, inputs), one section per table with
its notes, the plots and the paper's reference note (the ``report`` stage writes it to ``reports/report.md``)."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from envace.config.load import to_plain
from envace.reporting.comparison import CURRENT_RUN
from envace.reporting.experiments import OUTPUT_NAME
from envace.reporting.gain import GAIN_NOTE
from envace.reporting.layout import (
    EFFICIENCY_NOTE,
    FIDELITY_NOTE,
    FRACTION_TABLES,
    PER_ROLE_VERL_NOTE,
    REFERENCE_NOTE,
    REFERENCE_TITLE,
    SFT_NOTE,
    TABLE_INPUTS,
    TESTTIME_NOTE,
    TITLES,
)
from envace.reporting.provenance import InputState, head_state, header_lines, repo_root, stale_note
from envace.reporting.tables import (
    overall_note,
    render_markdown,
)
from envace.tracking.runs import ENV_OVERRIDES

logger = logging.getLogger(__name__)


def cross_run_note(cfg: DictConfig, what: str, collected: bool) -> str:
    source = f"`{cfg.paths.metrics}/{OUTPUT_NAME}`"
    if not collected:
        return (
            f"Only this run (`{CURRENT_RUN}`): no {source} yet. Run `make ablation`, or `dvc exp run -S "
            "algo=grpo` (`-S model=...` for scale), then "
            "`python -m envace.reporting.experiments collect && dvc repro report`."
        )
    return f"Rows: this run (`{CURRENT_RUN}`) and the latest experiment per {what} in {source} (`run` names it)."


def ablation_note(cfg: DictConfig, table: pd.DataFrame, collected: bool) -> str:
    """Where the ablation rows come from; under engine=verl without a per_role row, why that row is missing."""
    note = cross_run_note(cfg, "variant", collected)
    variants = set(table["variant"]) if "variant" in table else set()
    if to_plain(cfg.engine.name) == "verl" and "per_role" not in variants:
        note += " " + PER_ROLE_VERL_NOTE
    return note


def provenance(cfg: DictConfig, tables: dict[str, pd.DataFrame], inputs: list[InputState]) -> list[str]:
    where = repo_root(Path.cwd())
    commit, dirty = head_state(where) if where else ("unknown", False)
    seeds = {int(cfg.seed)} | {
        int(s)
        for key in ("ablation", "scale")
        if "seeds" in tables[key]
        for cell in tables[key]["seeds"]
        for s in str(cell).split(", ")
        if s.isdigit()
    }
    overrides = json.loads(os.environ.get(ENV_OVERRIDES) or "[]")
    return header_lines(
        commit=commit,
        dirty=dirty,
        profile=to_plain(cfg.profile),
        overrides=list(overrides),
        model=cfg.model.name,
        variant=to_plain(cfg.algo.name),
        seeds=sorted(seeds),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        inputs=inputs,
    )


def markdown(
    cfg: DictConfig,
    tables: dict[str, pd.DataFrame],
    plots: list[str],
    skipped: dict[str, str],
    collected: bool,
    inputs: list[InputState] | None = None,
) -> str:
    inputs = inputs or []
    head = [
        f"# envace report — profile `{to_plain(cfg.profile)}`, experiment `{cfg.experiment_name}`",
        "",
        *provenance(cfg, tables, inputs),
        (
            f"Model `{cfg.model.name}`, training variant `{to_plain(cfg.algo.name)}`, engine "
            f"`{to_plain(cfg.engine.name)}`. Every number in our columns was measured by this pipeline (this run "
            "and, in the ablation and scale tables, the collected DVC experiments); the paper's numbers appear "
            "only in the column `paper (Qwen3-8B, reference)`."
        ),
        "",
    ]
    notes = {
        "ablation": ablation_note(cfg, tables["ablation"], collected),
        "scale": cross_run_note(cfg, "model", collected),
        "main": overall_note(tables["main"], to_plain(cfg.eval.benchmarks)),
        "gain": GAIN_NOTE,
        "testtime": TESTTIME_NOTE,
        "efficiency": EFFICIENCY_NOTE,
        "fidelity": FIDELITY_NOTE,
    }
    if int(cfg.train.sft_epochs) > 0:
        notes["training"] = SFT_NOTE
    body = []
    for key, title in TITLES.items():
        stale = stale_note(TABLE_INPUTS.get(key, []), inputs)
        body += [
            f"## {title}",
            "",
            *([stale, ""] if stale else []),
            *([notes[key], ""] if key in notes else []),
            render_markdown(
                tables[key].drop(columns=["contender"], errors="ignore"), 3 if key in FRACTION_TABLES else 1
            ),
            "",
        ]
    body += ["## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    body += [f"- `{name}` not drawn: {why}." for name, why in skipped.items()]
    return "\n".join(head + body + ["", f"## {REFERENCE_TITLE}", "", REFERENCE_NOTE, ""])
