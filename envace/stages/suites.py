"""What the ``evaluate`` and ``rehearsal_sweep`` stages run on each benchmark, and how its adapter is built.

``eval.*`` holds the defaults; ``eval.suites.<benchmark>`` overrides them per benchmark (its split, task
count, budgets) and carries the options only some adapters understand:

===============  ==========================================================================================
option           used by
===============  ==========================================================================================
``max_steps``    τ² (orchestrator steps of a whole episode), VitaBench (conversation steps)
``mode``         τ² (``solo`` | ``user_llm`` | ``scripted_user``)
``data_path``    FinMCP-Bench (its JSON/JSONL file or folder), VitaBench (a checkout of its repository)
``tools_path``   FinMCP-Bench (the MCP tool list; default: schemas inferred from the recorded calls)
``unrecorded``   FinMCP-Bench: a call the record lacks → ``error`` | ``rehearse`` (the evaluated model's own
                 REHEARSE role) | ``simulate`` (the ``user_*`` endpoint)
``user_*``       the LLM on the other side: τ²'s customer (``user_llm``), VitaBench's user simulator,
                 FinMCP's simulator (``base_url``, ``model``, ``api_key_env`` — the env var holding the key)
``judge_*``      VitaBench's rubric judge endpoint
===============  ==========================================================================================

Setting an option a benchmark does not use fails with the list of who uses what.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from envace.config.load import to_plain
from envace.config.schema import Config
from envace.envs.bfcl.episode import BfclConfig
from envace.envs.tau2.config import Tau2Config
from envace.envs.toolworld import ToolWorldEnv, task_from_cm2_row
from envace.evaluation import ActLoopConfig, ValidationSet, get_benchmark, oracle_probe_set, sample_tasks
from envace.stages.common import Budgets, data_seed, toolworld_config


@dataclass(frozen=True)
class Suite:
    """What an evaluation runs on one benchmark: ``eval.*`` with ``eval.suites.<benchmark>`` on top."""

    benchmark: str
    split: str
    n_tasks: int  # 0 = all (per BFCL category / τ² domain)
    budgets: Budgets
    options: dict[str, Any]  # benchmark-specific extras (see the module docstring)
    trials: int = 1  # runs per task (eval only)
    gold_fidelity_tasks: int = 0  # tasks whose oracle calls REHEARSE is also scored on (eval only)

    @property
    def limit(self) -> int | None:
        return self.n_tasks or None


_USER = ("user_base_url", "user_model", "user_api_key_env")
_JUDGE = ("judge_base_url", "judge_model", "judge_api_key_env")
# which benchmark-specific suite options each adapter understands
SUITE_OPTION_USERS: dict[str, tuple[str, ...]] = {
    "toolworld": (),
    "bfcl": (),
    "tau2": ("max_steps", "mode", *_USER),
    "finmcp": ("data_path", "tools_path", "unrecorded", *_USER),
    "vitabench": ("data_path", "max_steps", *_USER, *_JUDGE),
}
SUITE_OPTIONS = tuple(dict.fromkeys(o for opts in SUITE_OPTION_USERS.values() for o in opts))


def eval_suite(cfg: Config, benchmark: str, section: str = "eval") -> Suite:
    """The resolved settings of ``benchmark`` from the typed config. ``section="eval"``: ``eval.*`` overridden
    by ``eval.suites.<benchmark>``. ``section="rehearsal"``: the sweep's own task count (``rehearsal.n_tasks``)
    and split; its *committed* execution decodes with the evaluation's budgets (greedy, the same step and
    token limits), so that the sweep's N=0 cell is the evaluation itself on the same tasks. Only the private
    attempts sample, with ``rehearsal.act_temperature`` and ``rehearsal.max_steps_per_turn``
    (``envace.rehearsal.controller``)."""
    over = getattr(cfg.eval.suites, benchmark)
    options = {k: to_plain(getattr(over, k)) for k in SUITE_OPTIONS if getattr(over, k) is not None}
    ev = cfg.eval

    def pick(key: str) -> Any:  # eval.suites.<benchmark>.<key>, null = eval.<key>
        value = getattr(over, key)
        return getattr(ev, key) if value is None else value

    budgets = Budgets(pick("max_steps_per_turn"), pick("act_max_new_tokens"), ev.temperature, cfg.seed)
    if section == "rehearsal":
        r = cfg.rehearsal
        return Suite(benchmark, over.split or r.split, r.n_tasks, budgets, options)
    trials = over.trials or 1
    if trials < 1:
        raise ValueError(f"eval.suites.{benchmark}.trials={trials}: must be >= 1")
    return Suite(
        benchmark,
        over.split or ev.split,
        pick("n_tasks"),
        budgets,
        options,
        trials,
        pick("gold_fidelity_tasks"),  # its own switch: the oracle-call probe runs without eval.fidelity
    )


def _endpoint(options: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    """``{"base_url", "model", "api_key_env"}`` from ``<prefix>_*`` options; None when no endpoint is set."""
    spec = {k: options[f"{prefix}_{k}"] for k in ("base_url", "model", "api_key_env") if f"{prefix}_{k}" in options}
    return spec or None


def _needs_path(benchmark: str, options: dict[str, Any]) -> str:
    if "data_path" not in options:
        raise ValueError(
            f"{benchmark} reads user-supplied data: set eval.suites.{benchmark}.data_path=/path "
            "(see README, 'Benchmarks')"
        )
    return str(options["data_path"])


def _act_loop(budgets: Budgets) -> Any:
    return ActLoopConfig(**vars(budgets))


def _toolworld_kwargs(cfg: Config, suite: Suite, rehearser: Any) -> dict[str, Any]:
    return {"config": _act_loop(suite.budgets), "env": ToolWorldEnv(toolworld_config(cfg))}


def _bfcl_kwargs(cfg: Config, suite: Suite, rehearser: Any) -> dict[str, Any]:
    return {"config": BfclConfig(**vars(suite.budgets))}


def _tau2_kwargs(cfg: Config, suite: Suite, rehearser: Any) -> dict[str, Any]:
    # τ² budgets a whole episode in orchestrator steps (max_steps), not steps per user turn
    b = suite.budgets
    return {
        "config": Tau2Config(max_new_tokens=b.max_new_tokens, temperature=b.temperature, seed=b.seed, **suite.options)
    }


def _finmcp_kwargs(cfg: Config, suite: Suite, rehearser: Any) -> dict[str, Any]:
    o = suite.options
    unrecorded = o.get("unrecorded", "error")
    if unrecorded == "rehearse" and rehearser is None:
        raise ValueError("eval.suites.finmcp.unrecorded=rehearse needs the evaluated model's REHEARSE backend")
    return {
        "path": _needs_path("finmcp", o),
        "tools_path": o.get("tools_path"),
        "config": _act_loop(suite.budgets),
        "unrecorded": unrecorded,
        "fallback_backend": rehearser if unrecorded == "rehearse" else None,
        "simulator": _endpoint(o, "user"),
    }


def _vitabench_kwargs(cfg: Config, suite: Suite, rehearser: Any) -> dict[str, Any]:
    o = suite.options
    extra = {"max_steps": int(o["max_steps"])} if "max_steps" in o else {}
    return {
        "path": _needs_path("vitabench", o),
        "config": _act_loop(suite.budgets),
        "user_simulator": _endpoint(o, "user"),
        "judge": _endpoint(o, "judge"),
        **extra,
    }


# benchmark name -> constructor kwargs of its adapter (one line per benchmark; names = config.Benchmark)
BENCHMARK_KWARGS: dict[str, Callable[[Config, Suite, Any], dict[str, Any]]] = {
    "toolworld": _toolworld_kwargs,
    "bfcl": _bfcl_kwargs,
    "tau2": _tau2_kwargs,
    "finmcp": _finmcp_kwargs,
    "vitabench": _vitabench_kwargs,
}


def make_adapter(cfg: Config, suite: Suite, rehearser: Any = None) -> Any:
    """The adapter registered as ``suite.benchmark``, configured by the suite. ``rehearser``: the evaluated
    model's REHEARSE backend, for adapters that can fall back on it (FinMCP ``unrecorded=rehearse``)."""
    unknown = sorted(set(suite.options) - set(SUITE_OPTION_USERS[suite.benchmark]))
    if unknown:
        users = "; ".join(f"{b}: {', '.join(o) or '-'}" for b, o in SUITE_OPTION_USERS.items())
        raise ValueError(
            f"eval.suites.{suite.benchmark} sets {unknown}, which {suite.benchmark} does not use; "
            f"remove them (options per benchmark — {users})"
        )
    return get_benchmark(suite.benchmark, **BENCHMARK_KWARGS[suite.benchmark](cfg, suite, rehearser))


def suite_tasks(cfg: Config, suite: Suite, adapter: Any, *, who: str, fix: str) -> list[Any]:
    """The tasks ``adapter`` runs for ``suite`` (its split and limit, sampled with the data seed); an error
    naming ``who`` asked, the split, what the adapter skipped and ``fix`` when there are none."""
    tasks = adapter.tasks(suite.split, limit=suite.limit, seed=data_seed(cfg))
    if not tasks:
        skipped = dict(getattr(adapter, "skipped", {}))
        raise ValueError(
            f"{who}: {suite.benchmark} has no runnable tasks in split {suite.split!r}"
            + (f" (skipped: {skipped})" if skipped else "")
            + f"; {fix}"
        )
    return tasks


def _toolworld_probe_set(cfg: Config, rows: list[dict[str, Any]]) -> Any:
    """The oracle's episodes (real responses) on ``train.fidelity_tasks`` of the validation ``rows``."""
    if not rows:
        raise ValueError(
            f"train.fidelity_every={cfg.train.fidelity_every} needs validation tasks, but none were "
            f"kept in {cfg.paths.prepared}/val.jsonl; set data.n_val > 0 or train.fidelity_every=0"
        )
    tasks = sample_tasks([task_from_cm2_row(r) for r in rows], int(cfg.train.fidelity_tasks), data_seed(cfg))
    steps = max((len(turn) for t in tasks for turn in t.gold_calls), default=0) + 1  # gold steps + the reply
    suite = Suite("toolworld", "val", 0, Budgets(steps, 64, 0.0, int(cfg.seed)), {})
    return oracle_probe_set(make_adapter(cfg, suite), tasks)


# data.source -> the training-time fidelity probe set from validation rows (None: no real executor)
PROBE_SETS: dict[str, Callable[[Config, list[dict[str, Any]]], Any] | None] = {
    "toolworld": _toolworld_probe_set,
    "cm2": None,
}


def _toolworld_validation_set(cfg: Config) -> ValidationSet:
    """``train.val_tasks`` validation tasks (0 = all) with the evaluation's adapter and budgets: the tasks and
    episodes ``evaluate`` plays with ``eval.split=val`` (greedy), so the probe after the last step and an
    evaluation of the exported weights agree."""
    suite = replace(eval_suite(cfg, "toolworld"), split="val", n_tasks=int(cfg.train.val_tasks))
    adapter = make_adapter(cfg, suite)
    tasks = suite_tasks(
        cfg,
        suite,
        adapter,
        who=f"train.val_every={cfg.train.val_every}",
        fix=f"set data.n_val > 0 (now {cfg.data.n_val}) or train.val_every=0",
    )
    return ValidationSet(
        adapter,
        tuple(tasks),
        concurrency=int(cfg.eval.concurrency),
        prefix_cache_tokens=int(cfg.eval.prefix_cache_tokens),
    )


# data.source -> the training-time task-success probe's validation set (None: no real executor)
VALIDATION_SETS: dict[str, Callable[[Config], ValidationSet] | None] = {
    "toolworld": _toolworld_validation_set,
    "cm2": None,
}
