"""Episodes on the wire: ``EpisodeSpec`` ⇄ JSON, and the parquet rows verl's RL dataset reads.

verl hands every column of a dataset row to the agent loop as keyword arguments. One row here is one
instruction (never one REHEARSE record: the loop plays both roles itself) with these columns:

- ``prompt``: the initial ACT messages (system + first user turn); verl keeps them as ``raw_prompt``.
- ``agent_name``: ``envace_act_rehearse``, so verl routes the row to our loop.
- ``envace_episode``: the whole ``EpisodeSpec`` as JSON text (user turns, tools, checklists, gold steps
  with their recorded responses). Text, not a nested column: heterogeneous nested values (tool schemas,
  arbitrary responses) do not fit one Arrow schema.
- ``envace_row``: the raw CM2 row as JSON text ("" when unknown); workers rebuild real executors from it
  (``grpo`` with executor responses on the tool world).
- ``data_source`` and ``extra_info`` ({index, uuid, split}) as verl expects.

Specs are built from prepared rows with the same rules as the ``train`` stage (tool-world rows are
rebuilt into tasks whose gold calls run on a real executor, so recorded responses are real).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, act_messages
from envace.core.records import EpisodeSpec, GoldStep, ToolCall
from envace.engines.verl.settings import AGENT_LOOP_NAME
from envace.envs.data_sources import data_source

logger = logging.getLogger(__name__)

EPISODE_COLUMN = "envace_episode"
ROW_COLUMN = "envace_row"
EPISODE_SCHEMA_VERSION = 1


# ---- EpisodeSpec <-> JSON ------------------------------------------------------------------------
def _call_json(call: ToolCall) -> dict[str, Any]:
    return {"name": call.name, "arguments": call.arguments, "id": call.id}


def spec_to_json(spec: EpisodeSpec) -> dict[str, Any]:
    """A JSON-able dict holding every field of ``spec`` (values that are not JSON become strings)."""
    gold = [
        [
            {
                "calls": [_call_json(c) for c in step.calls],
                "responses": None if step.responses is None else list(step.responses),
            }
            for step in turn
        ]
        for turn in spec.gold
    ]
    data = {
        "schema_version": EPISODE_SCHEMA_VERSION,
        "task_id": spec.task_id,
        "system_prompt": spec.system_prompt,
        "tools": list(spec.tools),
        "user_turns": list(spec.user_turns),
        "checklists": [list(items) for items in spec.checklists],
        "gold": gold,
        "gold_answers": list(spec.gold_answers),
        "answer_values": [list(v) for v in spec.answer_values],
        "domain": spec.domain,
        "source": spec.source,
        "meta": dict(spec.meta),
    }
    return json.loads(json.dumps(data, default=str))


def spec_from_json(data: Mapping[str, Any] | str) -> EpisodeSpec:
    """Inverse of ``spec_to_json`` (accepts the JSON text too)."""
    if isinstance(data, str):
        data = json.loads(data)
    version = data.get("schema_version")
    if version != EPISODE_SCHEMA_VERSION:
        raise ValueError(
            f"{EPISODE_COLUMN} has schema_version={version!r}, this envace reads "
            f"{EPISODE_SCHEMA_VERSION}; rebuild the verl dataset with this envace version"
        )
    gold = tuple(
        tuple(
            GoldStep(
                calls=tuple(ToolCall(**c) for c in step["calls"]),
                responses=None if step["responses"] is None else tuple(step["responses"]),
            )
            for step in turn
        )
        for turn in data["gold"]
    )
    return EpisodeSpec(
        task_id=data["task_id"],
        system_prompt=data["system_prompt"],
        tools=tuple(data["tools"]),
        user_turns=tuple(data["user_turns"]),
        checklists=tuple(tuple(items) for items in data["checklists"]),
        gold=gold,
        gold_answers=tuple(data["gold_answers"]),
        answer_values=tuple(tuple(v) for v in data["answer_values"]),
        domain=data["domain"],
        source=data["source"],
        meta=dict(data["meta"]),
    )


# ---- prepared rows -> specs (same rules as the train stage) -------------------------------------
def spec_from_row(row: Mapping[str, Any], source: str) -> EpisodeSpec:
    """The episode spec of one prepared row of data source ``source`` (``envace.envs.data_sources``)."""
    return data_source(source).spec_from_row(row)


def dataset_record(
    spec: EpisodeSpec, index: int, split: str, source: str, row: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One verl dataset row for ``spec`` (see the module docstring for the columns)."""
    return {
        "data_source": f"envace/{source}",
        "prompt": act_messages(DEFAULT_ROLE_PROMPTS, spec.system_prompt, spec.user_turns[0]),
        "agent_name": AGENT_LOOP_NAME,
        EPISODE_COLUMN: json.dumps(spec_to_json(spec), ensure_ascii=False),
        ROW_COLUMN: "" if row is None else json.dumps(dict(row), ensure_ascii=False, default=str),
        "extra_info": {"index": int(index), "uuid": spec.task_id, "split": split},
    }


def write_dataset(path: Path | str, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write dataset records as parquet (atomically: a temp file renamed into place)."""
    if not records:
        raise ValueError(f"write_dataset: no records for {path}; the split is empty")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pd.DataFrame(list(records)).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def act_prompt_uuids(parquet: Path) -> list[str]:
    """uuids of the ACT records in a ``template_prompts`` parquet, in file order (one per kept row)."""
    frame = pd.read_parquet(parquet, columns=["extra_info"])
    uuids: list[str] = []
    for info in frame["extra_info"]:
        info = json.loads(info) if isinstance(info, str) else dict(info)
        if info.get("role", "ACT") == "ACT" and info.get("uuid") not in uuids:
            uuids.append(str(info["uuid"]))
    return uuids


def split_records(
    uuids: Iterable[str], rows: Sequence[Mapping[str, Any]], split: str, source: str
) -> list[dict[str, Any]]:
    """Dataset records for ``uuids`` (in that order), built from the prepared ``rows`` of the split."""
    by_uuid = {str(r["uuid"]): r for r in rows}
    records = []
    missing = [u for u in uuids if u not in by_uuid]
    if missing:
        raise ValueError(
            f"{len(missing)} prompt uuids of split {split!r} have no prepared row (first: "
            f"{missing[0]!r}); re-run prepare_data and template_prompts together"
        )
    for index, uuid in enumerate(uuids):
        row = by_uuid[uuid]
        records.append(dataset_record(spec_from_row(row, source), index, split, source, row))
    return records
