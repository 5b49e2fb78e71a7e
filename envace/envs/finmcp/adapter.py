"""FinMCP-Bench as an envace benchmark: ``get_benchmark("finmcp", path=...)`` → ``FinMCPAdapter``.

* ``tasks(subset, limit, seed)`` — ``subset``: ``test``/``all`` (every sample), a task type
  (``single_step``, ``multi_step``, ``multi_turn``) or a comma list of them; ``limit``: deterministic crc32
  sample. ``task.domain`` is the scenario's first level (``first-class``).
* ``episode_program`` — the ACT loop (``evaluation.episode.run_act_loop``) with ``ReplayResponder``:
  responses come from the record (``replay.py``), never from a live server.
  ``history="gold"`` (default, the authors' protocol in ``infer/inference_api.py``): every user turn starts
  from the *gold* conversation before it, so a mistake in turn k does not change turn k+1's context;
  ``history="own"``: one continuous dialogue on the policy's own earlier turns.
* score — the sample's tool-name F1 (TF1); ``success`` — exact tool-sequence match. ``record.info``
  holds ``finmcp`` (TP/FP/FN, P/R/F1, exact, predicted and gold sequences, labels) and ``replay`` (how each
  call was answered). ``finmcp_report(records)`` aggregates macro/micro P/R/F1 and exact match overall and
  per category / difficulty / task type (``scoring.py``).
* tools offered: ``tool_scope="all"`` (default; the authors offer the whole MCP server's tool list) — the
  schema file's tools (``tools_path``) or, without one, every tool seen in the loaded data with inferred
  schemas; ``"sample"`` — only the tools the sample uses (easier: it hints at the answer).
* ``real_executor`` — a ``ReplayExecutor`` over the record (fidelity studies); ``status()`` — what is loaded.
  Every episode serves its recorded responses through one such executor; ``executor_wrapper`` wraps it
  (recording, isolation tests; a wrapper should delegate ``lookup``, else only ``execute`` is used).
* unrecorded calls — ``unrecorded="error" | "rehearse" | "simulate"`` (see ``replay.py``); ``rehearse``
  uses the policy itself unless ``fallback_backend`` is given; ``simulate`` needs ``simulator`` (a
  ``ChatBackend`` or ``OpenAIChatBackend`` kwargs such as ``{"base_url": …, "model": …}``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from envace.core.env import Task
from envace.core.records import Termination
from envace.core.rehearse_context import events_from_messages
from envace.envs.finmcp.data import FinMCPSample, load_samples
from envace.envs.finmcp.replay import ReplayConfig, ReplayExecutor, ReplayResponder, UnrecordedMode
from envace.envs.finmcp.scoring import ToolCallScore, grouped_metrics, score_tool_names
from envace.envs.finmcp.tools import infer_tool_schemas, load_tool_schemas
from envace.evaluation.base import BenchmarkAdapter, sample_tasks
from envace.evaluation.episode import ActLoopConfig, Dialogue, LoopResult, TurnHook, run_act_loop
from envace.evaluation.programs import GenerationLedger, Program
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend
from envace.inference.openai_client import OpenAIChatBackend

TASK_TYPES = ("single_step", "multi_step", "multi_turn")
HISTORY_MODES = ("gold", "own")
TOOL_SCOPES = ("all", "sample")


def _backend(spec: ChatBackend | Mapping[str, Any] | None) -> ChatBackend | None:
    if spec is None or hasattr(spec, "generate"):
        return spec  # type: ignore[return-value]
    return OpenAIChatBackend(**dict(spec))


def _choice(name: str, value: str, valid: Sequence[str]) -> str:
    if value not in valid:
        raise ValueError(f"FinMCPAdapter: {name}={value!r} is not one of {list(valid)}")
    return value


def sample_of(task: Task) -> FinMCPSample:
    sample = task.meta.get("finmcp_sample")
    if not isinstance(sample, FinMCPSample):
        raise KeyError(f"task {task.task_id!r} is not a FinMCP-Bench task (no meta['finmcp_sample'])")
    return sample


class FinMCPAdapter(BenchmarkAdapter):
    """FinMCP-Bench over a user-supplied data file (hub-only benchmark; see the module docstring)."""

    name = "finmcp"

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        tools_path: str | Path | None = None,
        config: ActLoopConfig | None = None,
        history: str = "gold",
        tool_scope: str = "all",
        unrecorded: str = "error",
        fallback_backend: ChatBackend | None = None,
        simulator: ChatBackend | Mapping[str, Any] | None = None,
        replay_max_new_tokens: int = 512,
        executor_wrapper: Callable[[Any], Any] | None = None,
    ) -> None:
        if path is None:
            raise ValueError(
                "FinMCPAdapter needs path=<FinMCP-Bench JSON/JSONL file or folder>: the benchmark is published "
                "on a model hub only (DianJin/FinMCP-Bench); download it and pass the file, e.g. "
                "benchmark_final.json"
            )
        self.path = Path(path)
        self.executor_wrapper = executor_wrapper
        self.config = config or ActLoopConfig()
        self.history = _choice("history", history, HISTORY_MODES)
        self.tool_scope = _choice("tool_scope", tool_scope, TOOL_SCOPES)
        mode = UnrecordedMode(_choice("unrecorded", unrecorded, [m.value for m in UnrecordedMode]))
        self.replay = ReplayConfig(
            mode, replay_max_new_tokens, self.config.temperature, self.config.seed, self.config.role_prompts
        )
        self.fallback_backend = _backend(simulator) if mode is UnrecordedMode.SIMULATE else fallback_backend
        if mode is UnrecordedMode.SIMULATE and self.fallback_backend is None:
            raise ValueError(
                "FinMCPAdapter: unrecorded='simulate' needs simulator=<ChatBackend or {'base_url': ..., 'model': ...}>"
            )
        self.samples = load_samples(self.path)
        schemas = load_tool_schemas(tools_path) if tools_path else infer_tool_schemas(self.samples)
        self.tool_schemas = {s["function"]["name"]: s for s in schemas}
        self.tool_schema_source = str(tools_path) if tools_path else "inferred from recorded calls"
        self._tasks = [self._to_task(s) for s in self.samples]

    # ---- tasks ---------------------------------------------------------------------------------
    def _tools_for(self, sample: FinMCPSample) -> tuple[dict[str, Any], ...]:
        own = {t["function"]["name"]: t for t in sample.tools}
        known = {**self.tool_schemas, **own}
        extra = infer_tool_schemas([sample], [n for n in sample.tool_names if n not in known])
        known.update({t["function"]["name"]: t for t in extra})
        names = list(known) if self.tool_scope == "all" else list(sample.tool_names)
        return tuple(known[n] for n in names)

    def _to_task(self, sample: FinMCPSample) -> Task:
        return Task(
            task_id=sample.sample_id,
            domain=sample.category,
            split=sample.task_type,
            system_prompt=sample.system_prompt,
            tools=self._tools_for(sample),
            user_turns=sample.user_turns,
            gold_calls=sample.gold_calls,
            gold_answers=sample.gold_answers,
            meta={"finmcp_sample": sample, "difficulty": sample.difficulty, "scenario": sample.scenario},
        )

    def tasks(self, subset: str = "test", limit: int | None = None, seed: int = 0) -> list[Task]:
        wanted = {s.strip() for s in subset.split(",") if s.strip()}
        if wanted & {"test", "all"}:
            chosen = list(self._tasks)
        else:
            unknown = wanted - set(TASK_TYPES)
            if unknown:
                raise ValueError(
                    f"FinMCP-Bench subset {sorted(unknown)} unknown; valid: test, all, "
                    f"{', '.join(TASK_TYPES)} (or a comma list)"
                )
            chosen = [t for t in self._tasks if t.split in wanted]
        return sample_tasks(chosen, limit, seed)

    def real_executor(self, task: Task) -> Any:
        raw = ReplayExecutor(sample_of(task).recorded)
        return self.executor_wrapper(raw) if self.executor_wrapper else raw

    def summarize(self, subset: str, records: Sequence[EpisodeRecord]) -> dict[str, Any]:
        return {"finmcp": finmcp_report(records, self.tasks(subset)), "status_info": self.status()}

    def status(self) -> dict[str, Any]:
        return {
            "status": "runnable (offline replay)",
            "n_samples": len(self.samples),
            "path": str(self.path),
            "tool_schemas": self.tool_schema_source,
            "unrecorded": self.replay.unrecorded.value,
        }

    # ---- episodes ------------------------------------------------------------------------------
    def _gold_mode(
        self,
        task: Task,
        sample: FinMCPSample,
        responder: ReplayResponder,
        ledger: GenerationLedger,
        turn_hook: TurnHook | None,
    ) -> Program[list[LoopResult]]:
        loops = []
        for turn, text in enumerate(task.user_turns):
            history = sample.history_before(turn)
            dialogue = Dialogue.of_task(
                task,
                user_turns=(text,),
                first_turn_index=turn,
                history=history,
                history_events=tuple(events_from_messages(history)),
            )
            loop = yield from run_act_loop(dialogue, responder, self.config, ledger, turn_hook=turn_hook)
            loops.append(loop)
        return loops

    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        start = time.perf_counter()
        ledger = ledger if ledger is not None else GenerationLedger()
        sample = sample_of(task)
        responder = ReplayResponder(
            task.task_id,
            sample.recorded,
            task.tools,
            self.replay,
            ledger,
            self.fallback_backend,
            executor=self.real_executor(task),
        )
        ledger.count_real_execution()
        if self.history == "gold":
            loops = yield from self._gold_mode(task, sample, responder, ledger, turn_hook)
        else:
            dialogue = Dialogue.of_task(task)
            loops = [(yield from run_act_loop(dialogue, responder, self.config, ledger, turn_hook=turn_hook))]
        ends = [lp.termination for lp in loops if lp.termination is not Termination.FINAL_REPLY]
        record = EpisodeRecord(
            benchmark=self.name,
            task_id=task.task_id,
            domain=task.domain,
            split=task.split,
            held_out=False,
            score=0.0,
            success=False,
            final_answers=tuple(a for lp in loops for a in lp.final_answers),
            turns=tuple(t for lp in loops for t in lp.turns),
            termination=ends[0] if ends else Termination.FINAL_REPLY,
            act_generations=sum(lp.act_generations for lp in loops),
            parse_failures=sum(lp.parse_failures for lp in loops),
            parse_error_codes=tuple(c for lp in loops for c in lp.parse_error_codes),
            real_calls=responder.stats["replayed"] + responder.stats["repeated"],
            costs=ledger.to_json(),
            wall_s=time.perf_counter() - start,
            info={
                "replay": {"stats": dict(responder.stats), "fallback_calls": responder.fallback_calls},
                "history": self.history,
            },
        )
        return self.scored(task, record)

    # ---- scoring -------------------------------------------------------------------------------
    def tool_score(self, task: Task, record: EpisodeRecord) -> ToolCallScore:
        predicted = [c.name for turn in record.turns for c in turn.tool_calls]
        return score_tool_names(predicted, sample_of(task).gold_tool_sequence)

    def score(self, task: Task, record: EpisodeRecord) -> float:
        return self.tool_score(task, record).f1

    def scored(self, task: Task, record: EpisodeRecord) -> EpisodeRecord:
        """The record with score = TF1, success = exact sequence match and ``info['finmcp']`` filled."""
        sample = sample_of(task)
        result = self.tool_score(task, record)
        info = {
            **result.to_json(),
            "predicted": [c.name for t in record.turns for c in t.tool_calls],
            "gold": list(sample.gold_tool_sequence),
            "category": sample.category,
            "difficulty": sample.difficulty,
            "task_type": sample.task_type,
        }
        return replace(record, score=result.f1, success=result.exact, info={**record.info, "finmcp": info})


def finmcp_report(
    records: Sequence[EpisodeRecord], tasks: Sequence[Task], *, drop_errors: bool = False
) -> dict[str, Any]:
    """Macro/micro tool P/R/F1 and exact-match rate, overall and per category / difficulty / task type.

    A crashed record counts as no predicted calls (all gold calls missed) unless ``drop_errors``.
    """
    by_id = {t.task_id: t for t in tasks}
    rows = []
    for record in records:
        if record.crashed and drop_errors:
            continue
        if record.task_id not in by_id:
            raise KeyError(f"finmcp_report: no task for record {record.task_id!r}; pass the tasks evaluated")
        sample = sample_of(by_id[record.task_id])
        stored = record.info.get("finmcp")
        score = ToolCallScore.from_json(stored) if stored else score_tool_names([], sample.gold_tool_sequence)
        labels = {"category": sample.category, "difficulty": sample.difficulty, "task_type": sample.task_type}
        rows.append((score, labels))
    return {**grouped_metrics(rows), "n_crashed": sum(1 for r in records if r.crashed)}
