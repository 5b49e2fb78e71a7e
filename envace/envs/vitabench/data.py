"""VitaBench tasks from a user-supplied checkout of github.com/meituan-longcat/vitabench (MIT).

Layout read (as in the repository): ``<checkout>/data/vita/domains/<domain>/tasks.json`` (Chinese) and
``tasks_en.json`` (English) for ``delivery``, ``instore``, ``ota`` and ``cross_domain``. ``path`` may be
the checkout root, its ``data/vita/domains`` folder, one domain folder or one tasks file.

A task (``vita.data_model.tasks.Task`` in the reference) is a JSON object with ``id``, ``domain``,
``instructions`` (what the *user* wants; only the user simulator and the judge see it),
``user_scenario.user_profile`` (the persona), ``environment`` (the task's own database: ``time``,
``user_id``, ``weather``, ``location``, ``user_historical_behaviors``, ``orders`` and per domain
``stores`` (delivery), ``shops``/``books``/``reservations`` (in-store), ``hotels``/``attractions``/
``flights``/``trains`` (OTA)), ``evaluation_criteria`` (``expected_states`` = alternative end states, each
with ``required_orders``, ``optional_orders`` and ``state_rubrics``; ``overall_rubrics``) and
``message_history`` (always empty in the released data; a non-empty one is rejected here).

The rubric list the judge grades is the reference's: every ``state_rubrics`` entry of every expected
state, then ``overall_rubrics``, duplicates removed, in that order (``rubric_0`` … ``rubric_n``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DOMAINS = ("delivery", "instore", "ota", "cross_domain")
LANGUAGES = {"english": "tasks_en.json", "chinese": "tasks.json"}
OTA_TABLES = ("hotels", "attractions", "flights", "trains")
_DOMAIN_ALIASES = {
    "in-store": "instore",
    "in-store consumption": "instore",
    "instore": "instore",
    "delivery": "delivery",
    "ota": "ota",
    "cross_domain": "cross_domain",
    "cross-domain": "cross_domain",
}


class VitaFormatError(ValueError):
    """A VitaBench file or task does not have the documented shape (names file, row and field)."""


@dataclass(frozen=True)
class VitaTask:
    task_id: str
    domain: str  # delivery | instore | ota | cross_domain (the folder it came from)
    language: str
    instructions: str
    user_profile: dict[str, Any]
    environment: dict[str, Any]
    rubrics: tuple[str, ...]
    expected_states: tuple[dict[str, Any], ...] = ()
    source: str = ""
    raw_domain: str = ""

    @property
    def time(self) -> str:
        return str(self.environment.get("time") or "")

    @property
    def reproduced(self) -> bool:
        """False when the task needs OTA tools, whose environment is not reimplemented here."""
        return not any(self.environment.get(t) for t in OTA_TABLES)

    @property
    def tool_domains(self) -> tuple[str, ...]:
        """Toolkits the task's database calls for (general tools always come along)."""
        present = [("delivery", "stores"), ("instore", "shops")]
        out = [d for d, table in present if table in self.environment]
        if any(t in self.environment for t in OTA_TABLES):
            out.append("ota")
        return tuple(out)


@dataclass(frozen=True)
class TaskFile:
    domain: str
    path: Path


def find_task_files(path: str | Path, domains: Sequence[str], language: str) -> list[TaskFile]:
    """The tasks files of ``domains`` under ``path`` (see the module docstring for accepted layouts)."""
    if language not in LANGUAGES:
        raise ValueError(f"VitaBench language {language!r} unknown; valid: {sorted(LANGUAGES)}")
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(
            f"VitaBench data not found at {root}; clone github.com/meituan-longcat/vitabench and pass the checkout path"
        )
    if root.is_file():
        return [TaskFile(root.parent.name if root.parent.name in DOMAINS else "unknown", root)]
    for base in (root / "data" / "vita" / "domains", root):
        if any((base / d).is_dir() for d in DOMAINS):
            break
    else:
        if root.name in DOMAINS:
            return [TaskFile(root.name, root / LANGUAGES[language])]
        raise VitaFormatError(
            f"{root}: no VitaBench domain folders ({', '.join(DOMAINS)}) under {root / 'data/vita/domains'} or {root}"
        )
    files = []
    for domain in domains:
        file = base / domain / LANGUAGES[language]
        if not file.is_file():
            raise FileNotFoundError(
                f"VitaBench: {file} is missing (domain {domain!r}, language {language!r}); "
                "large files may need `git lfs pull` in the checkout"
            )
        files.append(TaskFile(domain, file))
    return files


def _rubrics(criteria: dict[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for state in criteria.get("expected_states") or []:
        for rubric in (state or {}).get("state_rubrics") or []:
            if rubric not in out:
                out.append(rubric)
    for rubric in criteria.get("overall_rubrics") or []:
        if rubric not in out:
            out.append(rubric)
    return tuple(str(r) for r in out)


def _require(cond: bool, where: str, field_path: str, problem: str) -> None:
    if not cond:
        raise VitaFormatError(f"{where}: field '{field_path}': {problem}")


def task_from_raw(raw: Any, file: TaskFile, row: int, language: str) -> VitaTask:
    where = f"{file.path}: row {row}"
    _require(isinstance(raw, dict), where, "<task>", "a task must be a JSON object")
    where += f" (id {raw.get('id')})" if raw.get("id") is not None else ""
    _require(raw.get("id") not in (None, ""), where, "id", "missing")
    env = raw.get("environment")
    _require(isinstance(env, dict), where, "environment", "missing or not an object (the task's database)")
    _require(
        isinstance(env.get("time"), str) and bool(env.get("time")),
        where,
        "environment.time",
        "missing; expected 'YYYY-mm-dd HH:MM:SS'",
    )
    _require(
        isinstance(raw.get("instructions"), str) and bool(raw["instructions"].strip()),
        where,
        "instructions",
        "missing or empty (the user's goal)",
    )
    profile = (raw.get("user_scenario") or {}).get("user_profile")
    _require(isinstance(profile, dict), where, "user_scenario.user_profile", "missing or not an object")
    criteria = raw.get("evaluation_criteria") or {}
    _require(isinstance(criteria, dict), where, "evaluation_criteria", "must be an object")
    _require(
        not raw.get("message_history"),
        where,
        "message_history",
        "non-empty message histories are not supported (the released tasks have none)",
    )
    for table in ("stores", "shops", "orders", "books", "reservations"):
        _require(isinstance(env.get(table, {}), dict), where, f"environment.{table}", "must be an object keyed by id")
    raw_domain = str(raw.get("domain") or file.domain)
    return VitaTask(
        task_id=str(raw["id"]),
        domain=file.domain if file.domain in DOMAINS else _DOMAIN_ALIASES.get(raw_domain, raw_domain),
        language=language,
        instructions=raw["instructions"],
        user_profile=dict(profile),
        environment=env,
        rubrics=_rubrics(criteria),
        expected_states=tuple(criteria.get("expected_states") or ()),
        source=f"{file.path}:{row}",
        raw_domain=raw_domain,
    )


def load_tasks(
    path: str | Path, domains: Sequence[str] = ("delivery", "instore"), language: str = "english"
) -> list[VitaTask]:
    """Validated tasks of ``domains`` (folder order, then file order); ids are made unique per domain."""
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown:
        raise ValueError(f"VitaBench domains {unknown} unknown; valid: {list(DOMAINS)}")
    tasks: list[VitaTask] = []
    seen: dict[str, str] = {}
    for file in find_task_files(path, domains, language):
        try:
            rows = json.loads(file.path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise VitaFormatError(f"{file.path}: not valid JSON ({exc})") from None
        if not isinstance(rows, list):
            raise VitaFormatError(f"{file.path}: top level must be a JSON list of tasks")
        for row, raw in enumerate(rows):
            task = task_from_raw(raw, file, row, language)
            key = f"{task.domain}/{task.task_id}"
            if key in seen:
                raise VitaFormatError(f"{task.source}: task id {task.task_id!r} already used at {seen[key]}")
            seen[key] = task.source
            tasks.append(task)
    logger.info("loaded %d VitaBench tasks (%s, %s) from %s", len(tasks), ",".join(domains), language, path)
    return tasks


def find_schema_files(path: str | Path) -> dict[str, Path]:
    """``{toolkit: tools_schema.py}`` of the checkout (descriptions only; absent files are skipped)."""
    root = Path(path)
    while root.is_file() or (root.name in DOMAINS or root.name in ("domains", "vita", "data")):
        if (root / "src" / "vita").is_dir():
            break
        root = root.parent
    src = root / "src" / "vita"
    candidates = {"general": src / "environment" / "toolkit_schema.py"}
    candidates.update({d: src / "domains" / d / "tools_schema.py" for d in ("delivery", "instore", "ota")})
    return {k: p for k, p in candidates.items() if p.is_file()}
