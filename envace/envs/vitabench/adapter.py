"""VitaBench as an envace benchmark: ``get_benchmark("vitabench", path=<checkout>, user_simulator=…, judge=…)``.

Status: **needs endpoints: user simulator, judge.** Every VitaBench episode talks to a simulated user and is
graded by an LLM judge; both are OpenAI-compatible endpoints given as ``OpenAIChatBackend`` kwargs
(``{"base_url": …, "model": …, "api_key_env": …}``) or any ``ChatBackend``. Without them the adapter still
loads and lists tasks, and ``status()`` says what is missing; every episode then fails with that message
(a recorded failure, never a crash of the run).

* ``tasks(subset, limit, seed)`` — ``subset``: ``test``/``all`` or a comma list of loaded domains
  (``delivery``, ``instore``, ``ota``, ``cross_domain``). Tasks that need the OTA tools (not reimplemented,
  see ``environment.py``) are left out unless ``include_unreproduced=True``.
* ``episode_program`` — ``episode.VitaConversation`` on a fresh ``VitaExecutor``, then the rubric judge
  (``judge.py``) unless the conversation ended prematurely (score 0, as the reference). Score = reward
  (1 when every rubric is met); ``info["vitabench"]`` holds the rubric score, per-rubric verdicts, the end
  reason, the transcript and the judge's request count. A judge that fails after its retries leaves
  ``error="JudgeFailed: …"`` on the record: the task is *not judged* (``vitabench_report`` excludes and
  counts it) rather than scored 0.
* Concurrency: ACT generations of tasks run together (``evaluate(..., concurrency=k)``) are batched; the
  user-simulator and judge calls are made from the episode itself, one task at a time, and a task's
  per-rubric judge requests run concurrently up to ``judge_config.concurrency``; the HTTP client bounds and
  retries its own requests.
* No oracle policy: VitaBench has no gold trajectory (the user turns are simulated and the score is an LLM
  judge's rubric verdict); ``expected_states`` describe acceptable end states only.
* No test-time rehearsal: ``rehearsal_context`` needs the user turns in advance, which a simulated user
  does not have; ``episode_program`` refuses a ``turn_hook`` with a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envace.core.env import Task
from envace.core.records import Termination
from envace.envs.vitabench.data import VitaTask, find_schema_files, load_tasks
from envace.envs.vitabench.environment import VitaExecutor
from envace.envs.vitabench.episode import ConversationState, VitaConversation, VitaLoopConfig
from envace.envs.vitabench.judge import JudgeFailed, RubricJudge, RubricJudgeConfig, RubricJudgement
from envace.envs.vitabench.prompts import GREETING, agent_system_prompt, weekday
from envace.envs.vitabench.schemas import read_reference_descriptions, tool_schemas
from envace.evaluation.base import BenchmarkAdapter, sample_tasks
from envace.evaluation.episode import ActLoopConfig, TurnHook, trial_of
from envace.evaluation.programs import GenerationLedger, Program
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatBackend
from envace.inference.openai_client import OpenAIChatBackend

NEEDS_ENDPOINTS = "needs endpoints: user simulator, judge"
_END_TO_TERMINATION = {
    "user_stop": Termination.FINAL_REPLY,
    "agent_stop": Termination.FINAL_REPLY,
    "max_steps": Termination.MAX_STEPS,
    "invalid_agent_message": Termination.ACT_PARSE_ERROR,
    "act_parse_error": Termination.ACT_PARSE_ERROR,
}


def _backend(spec: ChatBackend | Mapping[str, Any] | None, **defaults: Any) -> ChatBackend | None:
    if spec is None or hasattr(spec, "generate"):
        return spec  # type: ignore[return-value]
    return OpenAIChatBackend(**{**defaults, **dict(spec)})


def vita_task_of(task: Task) -> VitaTask:
    spec = task.meta.get("vita_task")
    if not isinstance(spec, VitaTask):
        raise KeyError(f"task {task.task_id!r} is not a VitaBench task (no meta['vita_task'])")
    return spec


class VitaBenchAdapter(BenchmarkAdapter):
    """VitaBench over a user-supplied checkout (see the module docstring)."""

    name = "vitabench"

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        domains: Sequence[str] = ("delivery", "instore"),
        language: str = "english",
        user_simulator: ChatBackend | Mapping[str, Any] | None = None,
        judge: ChatBackend | Mapping[str, Any] | None = None,
        judge_config: RubricJudgeConfig | Mapping[str, Any] | None = None,
        config: ActLoopConfig | None = None,
        max_steps: int = 300,
        user_max_new_tokens: int = 512,
        include_unreproduced: bool = False,
    ) -> None:
        if path is None:
            raise ValueError(
                "VitaBenchAdapter needs path=<checkout of github.com/meituan-longcat/vitabench> "
                "(data/vita/domains/<domain>/tasks_en.json is read from it)"
            )
        self.path = Path(path)
        self.language = language
        self.include_unreproduced = include_unreproduced
        self.loop = VitaLoopConfig(config or ActLoopConfig(), max_steps, user_max_new_tokens)
        judge_cfg = (
            judge_config
            if isinstance(judge_config, RubricJudgeConfig)
            else RubricJudgeConfig(**dict(judge_config or {}))
        )
        self.user_backend = _backend(user_simulator)
        judge_backend = _backend(
            judge,
            max_retries=judge_cfg.max_retries,
            backoff_s=judge_cfg.backoff_s,
            max_backoff_s=judge_cfg.max_backoff_s,
            concurrency=judge_cfg.concurrency,
        )
        self.judge = None if judge_backend is None else RubricJudge(judge_backend, judge_cfg)
        self.specs = load_tasks(self.path, tuple(domains), language)
        self.reference_descriptions = read_reference_descriptions(find_schema_files(self.path), language)
        self._tasks = [self._to_task(s) for s in self.specs]

    def _to_task(self, spec: VitaTask) -> Task:
        return Task(
            task_id=f"{spec.domain}/{spec.task_id}",
            domain=spec.domain,
            split="test",
            system_prompt=agent_system_prompt(spec.time, spec.language),
            tools=tool_schemas(spec.tool_domains, self.reference_descriptions),
            user_turns=(),
            meta={"vita_task": spec, "reproduced": spec.reproduced, "n_rubrics": len(spec.rubrics)},
        )

    def status(self) -> dict[str, Any]:
        missing = [n for n, b in (("user simulator", self.user_backend), ("judge", self.judge)) if b is None]
        reproduced = sum(1 for s in self.specs if s.reproduced)
        return {
            "status": f"needs endpoints: {', '.join(missing)}" if missing else "runnable",
            "n_tasks": len(self.specs),
            "n_reproduced": reproduced,
            "not_reproduced": "OTA tools (hotels, attractions, flights, trains); get_holiday_date",
            "tool_descriptions": "reference tables" if self.reference_descriptions else "built-in",
        }

    def tasks(self, subset: str = "test", limit: int | None = None, seed: int = 0) -> list[Task]:
        wanted = {s.strip() for s in subset.split(",") if s.strip()}
        loaded = {t.domain for t in self._tasks}
        if not wanted & {"test", "all"} and wanted - loaded:
            raise ValueError(
                f"VitaBench subset {sorted(wanted - loaded)} not loaded; valid: test, all, "
                f"{', '.join(sorted(loaded))} (load more with domains=[...])"
            )
        chosen = [
            t
            for t in self._tasks
            if (wanted & {"test", "all"} or t.domain in wanted) and (self.include_unreproduced or t.meta["reproduced"])
        ]
        return sample_tasks(chosen, limit, seed)

    def real_executor(self, task: Task) -> VitaExecutor:
        spec = vita_task_of(task)
        return VitaExecutor(spec.environment, spec.tool_domains)

    # ---- episodes ------------------------------------------------------------------------------
    def episode_program(
        self, task: Task, *, ledger: GenerationLedger | None = None, turn_hook: TurnHook | None = None
    ) -> Program[EpisodeRecord]:
        if turn_hook is not None:
            raise ValueError(
                "VitaBench: test-time rehearsal is not supported - its user turns come from a user "
                "simulator, so there are none to rehearse in advance"
            )
        if self.user_backend is None or self.judge is None:
            raise RuntimeError(
                f"VitaBench {self.status()['status']}: pass user_simulator= and judge= "
                "(OpenAI-compatible endpoints, e.g. {'base_url': ..., 'model': ...})"
            )
        start = time.perf_counter()
        ledger = ledger if ledger is not None else GenerationLedger()
        spec = vita_task_of(task)
        executor = self.real_executor(task)
        conversation = VitaConversation(
            task.task_id,
            task.system_prompt,
            task.tools,
            GREETING.get(spec.language, GREETING["english"]),
            spec.user_profile,
            spec.instructions,
            spec.language,
            executor,
            self.user_backend,
            self.loop,
            ledger,
            trial=trial_of(task),
        )
        state = yield from conversation.run()
        verdict, error = self._judge(task, spec, state)
        return self._record(task, spec, state, executor, verdict, error, ledger, time.perf_counter() - start)

    def _judge(self, task: Task, spec: VitaTask, state: ConversationState) -> tuple[RubricJudgement | None, str | None]:
        if state.premature:
            return None, None
        env_info = f"System time: {spec.time} {weekday(spec.time, spec.language)}".strip()
        try:
            return self.judge.judge(
                task.task_id,
                env_info,
                spec.instructions,
                spec.rubrics,  # type: ignore[union-attr]
                state.transcript,
            ), None
        except JudgeFailed as exc:
            return None, f"JudgeFailed: {exc}"

    def _record(
        self,
        task: Task,
        spec: VitaTask,
        state: ConversationState,
        executor: VitaExecutor,
        verdict: RubricJudgement | None,
        error: str | None,
        ledger: GenerationLedger,
        wall_s: float,
    ) -> EpisodeRecord:
        reward = verdict.reward if verdict is not None else 0.0
        info = {
            "end": state.end,
            "judged": verdict is not None,
            "judge_status": "failed" if error else ("ok" if verdict is not None else "skipped (premature end)"),
            "reward": reward,
            "rubric_score": verdict.rubric_score if verdict else 0.0,
            "rubrics": [s.to_json() for s in verdict.states] if verdict else [],
            "judge_requests": verdict.requests if verdict else 0,
            "user_turns": state.user_turns,
            "tool_failures": executor.failures,
            "transcript": state.transcript,
        }
        return EpisodeRecord(
            benchmark=self.name,
            task_id=task.task_id,
            domain=task.domain,
            split=task.split,
            held_out=False,
            score=reward,
            success=reward >= 1.0,
            final_answers=tuple(state.answers),
            turns=tuple(state.turns),
            termination=_END_TO_TERMINATION.get(state.end, Termination.ERROR),
            act_generations=state.generations,
            parse_failures=state.parse_failures,
            parse_error_codes=tuple(state.codes),
            real_calls=executor.calls,
            final_state=executor.state(),
            error=error,
            costs=ledger.to_json(),
            wall_s=wall_s,
            info={"vitabench": info},
        )

    def score(self, task: Task, record: EpisodeRecord) -> float:
        return float(record.info.get("vitabench", {}).get("reward", 0.0))

    def summarize(self, subset: str, records: Sequence[EpisodeRecord]) -> dict[str, Any]:
        return {"vitabench": vitabench_report(records), "status_info": self.status()}


def vitabench_report(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """Success rate (mean reward) and mean rubric score over *judged-or-premature* tasks, per domain.

    Tasks whose judge failed are excluded and counted (``n_judge_failed``); other crashes count as 0.
    """
    kept = [r for r in records if not (r.error or "").startswith("JudgeFailed")]

    def summary(rows: Sequence[EpisodeRecord]) -> dict[str, Any]:
        n = len(rows)
        rubric = [float(r.info.get("vitabench", {}).get("rubric_score", 0.0)) for r in rows]
        return {
            "n": n,
            "success_rate": sum(r.score for r in rows) / n if n else 0.0,
            "mean_rubric_score": sum(rubric) / n if n else 0.0,
        }

    domains = sorted({r.domain for r in kept})
    return {
        "overall": summary(kept),
        "per_domain": {d: summary([r for r in kept if r.domain == d]) for d in domains},
        "n_judge_failed": len(records) - len(kept),
        "n_crashed": sum(1 for r in kept if r.crashed),
    }
