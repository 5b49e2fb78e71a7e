"""Stage ``template_prompts``: validated rows → role-prompt records for both engines.

Per row: one ACT record (role system prompt + first user turn, rendered with the row's tools) and one
REHEARSE record per reference tool call: ``envace.core.rehearse_context.rehearse_context`` over the
reference conversation up to that call (user turns, reference replies and earlier calls with their
recorded responses — nothing later), the layout every REHEARSE path uses. Each record holds its chat
messages, the rendered prompt's token length under the configured model's chat template, and where it came
from. Records longer than ``rollout.max_prompt_tokens`` are filtered out, and so is the row they belong to
(``kept_uuids.json`` lists the rows training may use).

Outputs in ``paths.prompts``: ``{split}.jsonl`` (local engine, inspection), ``{split}.parquet`` (verl:
``data_source``, ``messages``, ``extra_info``), ``filtered.jsonl``, ``kept_uuids.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from envace.config.load import to_plain
from envace.config.schema import Config
from envace.core.prompts import DEFAULT_ROLE_PROMPTS, ChatFormatter, act_messages
from envace.core.rehearse_context import Answered, Said, rehearse_context
from envace.data.cm2 import cm2_row_to_episode_spec
from envace.models import load_model_and_tokenizer
from envace.stages.common import model_spec
from envace.stages.runner import NULL_TRACKER, Tracker, configure_torch, stage_main
from envace.utils.io import atomic_dir, read_jsonl, write_json, write_jsonl

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SPLITS = ("train", "val")


def row_prompts(row: dict[str, Any], variant: int) -> list[dict[str, Any]]:
    """ACT and REHEARSE prompt messages of one CM2 row (no rendering yet)."""
    spec = cm2_row_to_episode_spec(row, variant)
    out = [
        {
            "role": "ACT",
            "turn": 0,
            "index": 0,
            "tools": list(spec.tools),
            "messages": act_messages(DEFAULT_ROLE_PROMPTS, spec.system_prompt, spec.user_turns[0]),
        }
    ]
    history: list[Any] = []
    for turn, exchanges in enumerate(spec.exchanges):
        history.append(Said("user", spec.user_turns[turn]))
        for ex in exchanges:
            out.append(
                {
                    "role": "REHEARSE",
                    "turn": turn,
                    "index": len(out),
                    "tools": None,
                    "messages": rehearse_context(DEFAULT_ROLE_PROMPTS, spec.tools, history, ex.call),
                }
            )
            history.append(Answered(ex.call, ex.response))
        reply = (spec.reference_replies[turn] if turn < len(spec.reference_replies) else "") or ""
        if reply.strip():
            history.append(Said("assistant", reply))
    return out


def render_records(rows: list[dict[str, Any]], split: str, formatter: Any, variant: int) -> list[dict[str, Any]]:
    """Prompt records of ``rows`` with their token lengths under ``formatter`` (the model's template)."""
    records = []
    for row in tqdm(rows, desc=f"template {split}", leave=False):
        for prompt in row_prompts(row, variant):
            text = formatter.render(prompt["messages"], prompt["tools"], True)
            records.append(
                {
                    "schema_version": SCHEMA_VERSION,
                    "uuid": row["uuid"],
                    "split": split,
                    **prompt,
                    "n_tokens": len(formatter.encode(text)),
                }
            )
    return records


def write_parquet(path: Path, records: list[dict[str, Any]], source: str) -> None:
    """verl's RL-dataset layout: chat ``messages`` plus ``extra_info`` (tools as JSON text)."""
    frame = pd.DataFrame(
        {
            "data_source": [f"envace/{source}"] * len(records),
            "messages": [r["messages"] for r in records],
            "extra_info": [
                {
                    "uuid": r["uuid"],
                    "role": r["role"],
                    "turn": r["turn"],
                    "index": r["index"],
                    "n_tokens": r["n_tokens"],
                    "split": r["split"],
                    "tools": json.dumps(r["tools"]) if r["tools"] else "",
                }
                for r in records
            ],
        }
    )
    frame.to_parquet(path, index=False)


def length_stats(records: list[dict[str, Any]], role: str) -> dict[str, float]:
    lengths = [r["n_tokens"] for r in records if r["role"] == role]
    if not lengths:
        return {f"{role.lower()}_records": 0}
    return {
        f"{role.lower()}_records": len(lengths),
        f"{role.lower()}_tokens_mean": statistics.fmean(lengths),
        f"{role.lower()}_tokens_max": max(lengths),
    }


def run(cfg: Config, tracker: Tracker = NULL_TRACKER) -> dict[str, Any]:
    configure_torch(cfg)
    _, tokenizer = load_model_and_tokenizer(model_spec(cfg))
    formatter = ChatFormatter(tokenizer)
    limit, variant = int(cfg.rollout.max_prompt_tokens), int(cfg.data.checklist_variant)
    metrics: dict[str, Any] = {"max_prompt_tokens": limit}
    kept: dict[str, list[str]] = {}
    filtered: list[dict[str, Any]] = []
    with atomic_dir(cfg.paths.prompts) as tmp:
        for split in SPLITS:
            records = render_records(read_jsonl(Path(cfg.paths.prepared) / f"{split}.jsonl"), split, formatter, variant)
            too_long = {r["uuid"] for r in records if r["n_tokens"] > limit}
            filtered += [
                {**r, "reason": f"n_tokens {r['n_tokens']} > {limit}"} for r in records if r["n_tokens"] > limit
            ]
            records = [r for r in records if r["uuid"] not in too_long]
            kept[split] = sorted({r["uuid"] for r in records})
            write_jsonl(tmp / f"{split}.jsonl", records)
            write_parquet(tmp / f"{split}.parquet", records, to_plain(cfg.data.source))
            metrics.update({f"{split}/{k}": v for k, v in length_stats(records, "ACT").items()})
            metrics.update({f"{split}/{k}": v for k, v in length_stats(records, "REHEARSE").items()})
            metrics[f"{split}/rows_kept"] = len(kept[split])
            metrics[f"{split}/rows_dropped"] = len(too_long)
        write_jsonl(tmp / "filtered.jsonl", filtered)
        write_json(tmp / "kept_uuids.json", kept)
        if not kept["train"]:
            tracker.log_artifact(tmp / "filtered.jsonl", "prompts")
            raise ValueError(
                f"template_prompts: every training row has a prompt over rollout.max_prompt_tokens="
                f"{limit}; raise it or shorten the data (see the artifact prompts/filtered.jsonl)"
            )
    tracker.log_artifact(Path(cfg.paths.prompts) / "filtered.jsonl", "prompts")
    metrics["records_filtered"] = len(filtered)
    logger.info(
        "template_prompts: kept rows %s, %d over-long records filtered",
        {s: len(v) for s, v in kept.items()},
        len(filtered),
    )
    return metrics


main = stage_main("template_prompts", run)

if __name__ == "__main__":
    raise SystemExit(main())
