"""BFCL-v4 as an envace benchmark: ``get_benchmark("bfcl")`` → ``BfclAdapter``.

* ``tasks(subset, limit, seed)`` — ``subset`` is a category, a group (``offline``, ``non_live``, ``live``,
  ``multi_turn``, ``memory``, ``all``/``test`` …) or a comma list; ``limit`` applies *per category*
  (deterministic crc32 sample, bfcl order kept). Categories that cannot run here are skipped and listed
  in ``skipped`` with the reason (``category_status`` reports every category of a subset).
* ``episode_program`` — the loop of ``episode.py``; the score is bfcl's checker verdict (1 or 0), and the
  record keeps the raw generations (``info["bfcl_outputs"]``) so ``score`` and the result-file writer can
  redo everything from the record.
* ``real_executor`` — a fresh ``BfclExecutor`` for multi-turn and memory tasks (None for single-turn).
  ``executor_wrapper`` wraps every executor an episode creates (recording, isolation tests).
* memory — questions need their scenario's prerequisite conversations played first (by the same
  policy). The first question of a (category, scenario, trial) plays them and caches the snapshot folder
  for the rest of this adapter's life: **one adapter instance = one policy** for memory categories
  (``reset_memory()`` to reuse it). ``prepare_program(tasks)`` plays all needed prerequisites up front
  (batched), which avoids duplicate plays when several questions of a scenario start together.
  (Extension of the ``BenchmarkAdapter`` interface, which has no set-up phase.)
* trials — ``task.meta["trial"]`` (default 0) enters every generation seed (extension; the interface
  has no notion of trials).
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from envace.core.env import Executor, Task
from envace.envs.bfcl.categories import (
    CATEGORIES,
    SINGLE_TURN_KINDS,
    CategoryKind,
    category_of,
    resolve_categories,
)
from envace.envs.bfcl.convert import openai_tools
from envace.envs.bfcl.data import (
    BfclEntry,
    entry_to_task,
    load_category,
    load_memory_prereqs,
)
from envace.envs.bfcl.episode import (
    BfclConfig,
    Transcript,
    conversation_program,
    single_turn_program,
)
from envace.envs.bfcl.executor import BfclExecutor, memory_initial_config
from envace.envs.bfcl.oracle import BfclOracle
from envace.envs.bfcl.results import result_entry
from envace.envs.bfcl.scoring import bfcl_summary, check_entry
from envace.envs.bfcl.upstream import bfcl
from envace.evaluation.base import BenchmarkAdapter, sample_tasks
from envace.evaluation.episode import TurnHook, trial_of
from envace.evaluation.programs import Failed, GenerationLedger, Program, gather
from envace.evaluation.records import EpisodeRecord

logger = logging.getLogger(__name__)

ExecutorWrapper = Callable[[Executor], Executor]


def entry_of(task: Task) -> BfclEntry:
    """The bfcl entry behind a task (from ``meta``, else looked up by id)."""
    entry = task.meta.get("bfcl_entry")
    if isinstance(entry, BfclEntry):
        return entry
    category = task.meta.get("bfcl_category") or category_of(task.task_id)
    for candidate in load_category(category):
        if candidate.id == task.task_id:
            return candidate
    raise KeyError(f"no BFCL entry {task.task_id!r} in category {category!r}")


def category_status(subset: str) -> dict[str, dict[str, str]]:
    """``{category: {"status": "runnable" | "not_runnable_offline", "reason": …}}`` for a subset."""
    out = {}
    for name in resolve_categories(subset):
        spec = CATEGORIES[name]
        out[name] = {"status": "runnable" if spec.offline else "not_runnable_offline", "reason": spec.reason}
    return out


def memory_question(entry: dict[str, Any], category: str, raw: BfclExecutor) -> list[list[dict[str, Any]]]:
    """The entry's turns with bfcl's memory instructions (and current core memory) in the system message."""
    question = copy.deepcopy(entry["question"])
    instance = raw.instances[entry["involved_classes"][0]]
    return bfcl().handler_utils.add_memory_instruction_system_prompt(question, category, entry["scenario"], instance)


def category_counts(records: list[EpisodeRecord]) -> dict[str, tuple[int, int]]:
    """``{category: (correct, total)}``; crashed tasks are in the total."""
    counts: dict[str, list[int]] = {}
    for record in records:
        category = record.info.get("bfcl_category", record.domain)
        pair = counts.setdefault(category, [0, 0])
        pair[0] += int(record.success)
        pair[1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def category_table(subset: str, records: list[EpisodeRecord]) -> dict[str, dict[str, Any]]:
    """Every category of ``subset`` with its status, and its accuracy when it ran."""
    counts = category_counts(records)
    crashed: dict[str, int] = {}
    for r in records:
        crashed[r.domain] = crashed.get(r.domain, 0) + int(r.crashed)
    table = {}
    for name, status in category_status(subset).items():
        row: dict[str, Any] = dict(status)
        if name in counts:
            correct, total = counts[name]
            row.update(
                status="ran",
                n=total,
                correct=correct,
                crashed=crashed.get(name, 0),
                accuracy=correct / total if total else 0.0,
            )
        elif status["status"] == "runnable":
            row["status"] = "no_tasks_selected"
        table[name] = row
    return table


class BfclAdapter(BenchmarkAdapter):
    """``get_benchmark("bfcl", config=BfclConfig(...), executor_wrapper=None, work_dir=None)``."""

    name = "bfcl"

    def __init__(
        self,
        config: BfclConfig | None = None,
        *,
        executor_wrapper: ExecutorWrapper | None = None,
        work_dir: str | Path | None = None,
        **config_kwargs: Any,
    ) -> None:
        if config is not None and config_kwargs:
            raise ValueError(f"BfclAdapter: config given, so {sorted(config_kwargs)} cannot configure it")
        self.config = config or BfclConfig(**config_kwargs)
        self.executor_wrapper = executor_wrapper
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self.skipped: dict[str, str] = {}
        self._snapshots: dict[tuple[str, str, int], Path] = {}

    @property
    def work_dir(self) -> Path:
        """Where memory snapshots go (a fresh temporary folder unless one was given)."""
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="envace-bfcl-"))
            # a folder we made is ours to remove: when the adapter is collected or the process exits
            weakref.finalize(self, shutil.rmtree, str(self._work_dir), ignore_errors=True)
        return self._work_dir

    # ---- tasks ------------------------------------------------------------------------------
    def tasks(self, subset: str = "test", limit: int | None = None, seed: int = 0) -> list[Task]:
        out: list[Task] = []
        for category in resolve_categories(subset):
            spec = CATEGORIES[category]
            if not spec.offline:
                self.skipped[category] = spec.reason
                logger.warning("BFCL %s skipped: %s", category, spec.reason)
                continue
            chosen = sample_tasks(load_category(category), limit, seed, task_id=lambda e: e.id)
            out.extend(entry_to_task(entry, subset) for entry in chosen)
        return out

    # ---- executors ----------------------------------------------------------------------------
    def _executor(
        self, entry: dict[str, Any], category: str, memory_root: Path | None = None
    ) -> tuple[BfclExecutor, Executor]:
        config = entry.get("initial_config", {})
        if memory_root is not None:
            config = memory_initial_config(entry, category, memory_root)
        raw = BfclExecutor(entry["id"], category, config, entry["involved_classes"])
        return raw, (self.executor_wrapper(raw) if self.executor_wrapper else raw)

    def real_executor(self, task: Task) -> Executor | None:
        entry = entry_of(task)
        if entry.spec.kind in SINGLE_TURN_KINDS:
            return None
        root = self.work_dir / f"fidelity-{uuid.uuid4().hex[:8]}" if entry.spec.kind is CategoryKind.MEMORY else None
        return self._executor(entry.prompt, entry.category, root)[1]

    # ---- memory prerequisites -------------------------------------------------------------------
    def reset_memory(self) -> None:
        """Forget the cached prerequisite snapshots (before evaluating another policy)."""
        self._snapshots.clear()

    def _play_prereqs(self, category: str, scenario: str, trial: int, ledger: GenerationLedger) -> Program[Path]:
        root = self.work_dir / f"{category}-{scenario}-t{trial}-{uuid.uuid4().hex[:8]}"
        for entry in load_memory_prereqs(category)[scenario]:
            prereq_category = category_of(entry["id"])
            raw, executor = self._executor(entry, prereq_category, root)
            try:
                question = memory_question(entry, prereq_category, raw)
                yield from conversation_program(
                    question,
                    openai_tools(entry["function"]),
                    executor,
                    self.config,
                    ledger,
                    (entry["id"], trial),
                    purpose="memory_prereq",
                )
                raw.instances[entry["involved_classes"][0]]._flush_memory_to_local_file()
            finally:
                raw.close()
        return root

    def _memory_root(self, entry: BfclEntry, trial: int, ledger: GenerationLedger) -> Program[Path]:
        key = (entry.category, entry.prompt["scenario"], trial)
        if key not in self._snapshots:
            root = yield from self._play_prereqs(*key, ledger)
            self._snapshots.setdefault(key, root)
        return self._snapshots[key]

    def prepare_program(self, tasks: Sequence[Task]) -> Program[None]:
        """Play the prerequisite conversations every memory task needs (batched across scenarios)."""
        keys = sorted(
            {
                (e.category, e.prompt["scenario"], trial_of(t))
                for t in tasks
                if (e := entry_of(t)).spec.kind is CategoryKind.MEMORY
            }
            - set(self._snapshots)
        )
        roots = yield from gather((self._play_prereqs(*k, GenerationLedger()) for k in keys), isolate=True)
        for key, root in zip(keys, roots):
            if isinstance(root, Failed):
                logger.warning("BFCL memory prerequisites %s failed: %s", key, root.error)
            else:
                self._snapshots.setdefault(key, root)

    # ---- episodes ---------------------------------------------------------------------------------
    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        start = time.perf_counter()
        ledger = ledger if ledger is not None else GenerationLedger()
        entry = entry_of(task)
        trial = trial_of(task)
        seed_tag = (task.task_id, trial)
        if entry.spec.kind in SINGLE_TURN_KINDS:
            ledger.count_real_execution()  # no executor: the one real answer
            t = yield from single_turn_program(
                entry.prompt["question"], task.tools, self.config, ledger, seed_tag, turn_hook
            )
            return self._record(task, entry, t, ledger, start, {}, {})
        extra: dict[str, Any] = {}
        root = None
        if entry.spec.kind is CategoryKind.MEMORY:
            root = yield from self._memory_root(entry, trial, ledger)
            extra["memory_snapshot"] = str(root)
        raw, executor = self._executor(entry.prompt, entry.category, root)
        ledger.count_real_execution()
        try:
            question = memory_question(entry.prompt, entry.category, raw) if root else entry.prompt["question"]
            t = yield from conversation_program(
                question,
                task.tools,
                executor,
                self.config,
                ledger,
                seed_tag,
                holdout=entry.prompt.get("missed_function"),
                hook=turn_hook,
            )
            state = executor.state()
        finally:
            raw.close()
        return self._record(task, entry, t, ledger, start, state, extra)

    def _record(
        self,
        task: Task,
        entry: BfclEntry,
        t: Transcript,
        ledger: GenerationLedger,
        start: float,
        state: dict[str, Any],
        extra: dict[str, Any],
    ) -> EpisodeRecord:
        verdict = check_entry(entry, t.outputs)
        info = {
            "bfcl_category": entry.category,
            "bfcl_outputs": t.outputs,
            "trial": trial_of(task),
            "bfcl_result": result_entry(entry.id, entry.category, t.outputs),
            "bfcl_verdict": {"valid": verdict.valid, "error_type": verdict.error_type},
            **extra,
        }
        return EpisodeRecord(
            benchmark=self.name,
            task_id=task.task_id,
            domain=task.domain,
            split=task.split,
            held_out=bool(task.meta.get("held_out", False)),
            score=1.0 if verdict.valid else 0.0,
            success=verdict.valid,
            final_answers=tuple(t.answers),
            turns=tuple(t.turns),
            termination=t.termination,
            act_generations=t.generations,
            parse_failures=t.parse_failures,
            parse_error_codes=tuple(t.codes),
            real_calls=t.real_calls,
            final_state=state,
            costs=ledger.to_json(),
            wall_s=time.perf_counter() - start,
            info=info,
        )

    def score(self, task: Task, record: EpisodeRecord) -> float:
        outputs = record.info.get("bfcl_outputs")
        if record.crashed or outputs is None:
            return 0.0
        return 1.0 if check_entry(entry_of(task), outputs).valid else 0.0

    def oracle(self, tasks: Sequence[Task]) -> Any:
        return BfclOracle(tasks)

    def summarize(self, subset: str, records: Sequence[EpisodeRecord]) -> dict[str, Any]:
        records = list(records)
        return {"categories": category_table(subset, records), "aggregates": bfcl_summary(category_counts(records))}


def with_trial(task: Task, trial: int) -> Task:
    """A copy of ``task`` for trial ``trial`` (different generation seeds, same entry)."""
    return replace(task, meta={**task.meta, "trial": trial})
