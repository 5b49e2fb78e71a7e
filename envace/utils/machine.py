"""What machine this is: the CPU's model name and feature flags (no torch: the report stage reads them too).

Every figure a stage records names the CPU it ran on (``produced_by`` in the details files, the MLflow
runs), since bf16 numerics and speed differ between instruction sets.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (empty where ``/proc/cpuinfo`` is not readable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_model() -> str:
    """``lscpu``'s model name (from ``/proc/cpuinfo``), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matmul instructions (AVX512-BF16 or AMX-BF16)."""
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)
