"""``ToolWorldEnv``: the embedded tool world behind the ``envace.core.env.Environment`` interface.

Tasks of every split are generated once, lazily, from a ``ToolWorldConfig`` (splits are generated
together because they are de-duplicated against each other). Executors are fresh per call of
``make_executor``; the scorer is ``scoring.score`` (strict by default, partial credit optional).
"""

from __future__ import annotations

from envace.core.env import EpisodeResult, Task
from envace.envs.toolworld.executor import ToolWorldExecutor
from envace.envs.toolworld.generator import SPLITS, ToolWorldConfig, generate_tasks
from envace.envs.toolworld.scoring import ScoreBreakdown, score, score_breakdown


class ToolWorldEnv:
    """The embedded, deterministic, executable tool world (name ``toolworld``)."""

    name = "toolworld"

    def __init__(self, config: ToolWorldConfig | None = None, partial_credit: bool = False) -> None:
        self.config = config or ToolWorldConfig()
        self.partial_credit = partial_credit
        self._splits: dict[str, list[Task]] | None = None
        self._by_id: dict[str, Task] = {}

    def _load(self) -> dict[str, list[Task]]:
        if self._splits is None:
            self._splits = generate_tasks(self.config)
            self._by_id = {t.task_id: t for tasks in self._splits.values() for t in tasks}
        return self._splits

    def tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"toolworld has no split {split!r}; valid splits: {list(SPLITS)}")
        return list(self._load()[split])

    def task(self, task_id: str) -> Task:
        self._load()
        if task_id not in self._by_id:
            raise KeyError(f"toolworld (seed {self.config.seed}) has no task {task_id!r}")
        return self._by_id[task_id]

    def make_executor(self, task: Task) -> ToolWorldExecutor:
        return ToolWorldExecutor(task)

    def score(self, task: Task, result: EpisodeResult) -> float:
        return score(task, result, partial_credit=self.partial_credit)

    def score_breakdown(self, task: Task, result: EpisodeResult) -> ScoreBreakdown:
        return score_breakdown(task, result)
