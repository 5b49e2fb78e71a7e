"""BFCL-v4 through ``bfcl-eval``: its bundled data, its executable backends and its own checkers.

Modules (bfcl-eval itself is imported lazily, on first loading/scoring — see ``upstream``):

* ``categories`` — every BFCL-v4 scoring category, how it runs, and why some cannot run offline;
* ``data`` — bfcl entries and their ``core.env.Task`` view (tools as OpenAI schemas, gold for oracles);
* ``convert`` — records ↔ bfcl formats (decoded AST, execution strings, gold calls, responses);
* ``executor`` — ``BfclExecutor``, the real executor of multi-turn / memory entries;
* ``episode`` — the policy loop (generation programs), following bfcl's FC inference loop;
* ``scoring`` — bfcl's checkers on our parsed outputs, and bfcl's aggregates over what ran;
* ``adapter`` — ``BfclAdapter`` (``get_benchmark("bfcl")``); ``oracle`` — ``BfclOracle``;
* ``results`` — bfcl result files and ``bfcl evaluate`` in a subprocess (cross-checks);
* ``runner`` — ``run_bfcl``: evaluate + per-category table with statuses + summary.

Importing this package registers the adapter under the benchmark name ``"bfcl"``.
"""

from __future__ import annotations

from envace.envs.bfcl.adapter import BfclAdapter, category_status, entry_of, with_trial
from envace.envs.bfcl.categories import (
    CATEGORIES,
    GROUPS,
    CategoryKind,
    resolve_categories,
)
from envace.envs.bfcl.episode import BfclConfig
from envace.envs.bfcl.executor import BfclExecutor
from envace.envs.bfcl.oracle import BfclOracle, PerturbedOracle
from envace.envs.bfcl.runner import BfclReport, run_bfcl
from envace.evaluation.registry import benchmark_names, register_benchmark

if "bfcl" not in benchmark_names():
    register_benchmark("bfcl", BfclAdapter)

__all__ = [
    "CATEGORIES",
    "GROUPS",
    "BfclAdapter",
    "BfclConfig",
    "BfclExecutor",
    "BfclOracle",
    "BfclReport",
    "CategoryKind",
    "PerturbedOracle",
    "category_status",
    "entry_of",
    "resolve_categories",
    "run_bfcl",
    "with_trial",
]
