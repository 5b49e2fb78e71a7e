"""Benchmark evaluation: adapters (by registry name), the policy loop, metrics, world-model fidelity."""

from envace.evaluation.base import BenchmarkAdapter, EnvironmentAdapter, sample_tasks, with_trials
from envace.evaluation.episode import ActLoopConfig, Dialogue, ExecutorResponder, TurnView, run_act_loop
from envace.evaluation.fidelity import FidelityReport, compare_responses, field_f1, flatten_json, measure_fidelity
from envace.evaluation.metrics import BenchmarkMetrics, compute_metrics
from envace.evaluation.policies import OracleBackend, build_policy
from envace.evaluation.probes import ProbeSet, ValidationSet, oracle_probe_set
from envace.evaluation.programs import ACTOR, REHEARSER, GenerationLedger, drive, gather
from envace.evaluation.records import EpisodeRecord
from envace.evaluation.registry import benchmark_names, get_benchmark, register_benchmark
from envace.evaluation.runner import BenchmarkRun, evaluate, run_programs

__all__ = [
    "ACTOR",
    "REHEARSER",
    "ActLoopConfig",
    "BenchmarkAdapter",
    "BenchmarkMetrics",
    "BenchmarkRun",
    "Dialogue",
    "EnvironmentAdapter",
    "EpisodeRecord",
    "ExecutorResponder",
    "FidelityReport",
    "GenerationLedger",
    "OracleBackend",
    "ProbeSet",
    "TurnView",
    "ValidationSet",
    "benchmark_names",
    "build_policy",
    "compare_responses",
    "compute_metrics",
    "drive",
    "evaluate",
    "field_f1",
    "flatten_json",
    "gather",
    "get_benchmark",
    "measure_fidelity",
    "oracle_probe_set",
    "register_benchmark",
    "run_act_loop",
    "run_programs",
    "sample_tasks",
    "with_trials",
]
