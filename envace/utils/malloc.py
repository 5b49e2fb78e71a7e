"""Which C allocator a training process runs on, and handing its free pages back between phases.

A GRPO step on CPU alternates two phases with very different heaps: the rollout (KV caches, decoding
scratch) and the update (activations, gradients, autograd's transients). glibc's malloc keeps what a
phase frees as resident heap pages that fragment across the next phase's block sizes; jemalloc reuses
them by size class, and can hand every free page back at once (``arena.<all>.purge``) at a phase
boundary. The environment variable ``ENVACE_ALLOCATOR`` picks (an execution setting like
``OMP_NUM_THREADS``, not an experiment parameter: the allocator changes no computed value, so it is not a
DVC param and switching it stales no stage):

- ``glibc``: the C library's malloc, its mmap threshold fixed at 8 MB (``fix_mmap_threshold``) and
  ``malloc_trim`` between phases;
- ``jemalloc``: jemalloc preloaded (``LD_PRELOAD``) into the stage's process, with page decay off
  (``dirty_decay_ms:-1,muzzy_decay_ms:-1``: a freed page stays mapped for the next allocation instead
  of being handed back after 10 s and page-faulted in again) and an explicit purge between phases;
- ``auto``: jemalloc where a library is found, glibc otherwise.

A library cannot change the allocator of the process it is loaded in, so a stage's command line
re-executes itself once with the preload (``ensure_allocator``, called from ``stage_main``; the
environment variable ``ENVACE_ALLOCATOR_EXEC`` marks the second start). Where jemalloc comes from, in
order: ``$ENVACE_JEMALLOC`` (a path), the system's ``libjemalloc`` (``apt-get install libjemalloc2``),
the copy Ray ships inside its wheel (``ray/core/libjemalloc.so``; Ray is installed with verl). A
``MALLOC_CONF`` the user set is kept as it is.

Nothing here imports torch: it runs before the heavy imports of a stage matter.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ALLOCATORS = ("auto", "jemalloc", "glibc")
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
ENV_CHOICE = "ENVACE_ALLOCATOR"  # auto (default) | jemalloc | glibc
ENV_LIBRARY = "ENVACE_JEMALLOC"  # a jemalloc shared library to preload instead of the one found
ENV_EXEC = "ENVACE_ALLOCATOR_EXEC"  # set on the re-executed process: never re-execute twice
ARENA_ALL = 4096  # jemalloc's MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 8 << 20


class AllocatorError(ValueError):
    """An allocator setting that cannot be honoured (unknown name, jemalloc asked for but missing)."""


def allocator_choice() -> str:
    """``$ENVACE_ALLOCATOR``, ``auto`` when unset (checked by ``resolve_allocator``)."""
    return os.environ.get(ENV_CHOICE, "").strip() or "auto"


def find_jemalloc() -> str | None:
    """The jemalloc library to preload: ``$ENVACE_JEMALLOC``, the system's, or Ray's bundled copy."""
    explicit = os.environ.get(ENV_LIBRARY)
    if explicit:
        if not Path(explicit).is_file():
            raise AllocatorError(
                f"{ENV_LIBRARY}={explicit} is not a file: point it at a jemalloc shared library "
                "(e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2) or unset it"
            )
        return explicit
    system = ctypes.util.find_library("jemalloc")
    if system:
        return system
    spec = importlib.util.find_spec("ray")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "core" / "libjemalloc.so"
        if bundled.is_file():
            return str(bundled)
    return None


def running_allocator() -> str:
    """``jemalloc`` when this process's malloc is jemalloc's, ``glibc`` when glibc's, else ``other``."""
    process = ctypes.CDLL(None)
    if hasattr(process, "mallctl"):
        return "jemalloc"
    if _libc():
        return "glibc"
    return "other"


def resolve_allocator(choice: str) -> tuple[str, str | None]:
    """``(allocator, library)`` for an ``ENVACE_ALLOCATOR`` value; the library is None for glibc.

    An unknown name or ``jemalloc`` without a library found raises ``AllocatorError`` saying how to fix it.
    """
    if choice not in ALLOCATORS:
        raise AllocatorError(
            f"{ENV_CHOICE}={choice!r} is not one of {', '.join(ALLOCATORS)}: set it to one of them or unset it"
        )
    if choice == "glibc" or sys.platform != "linux":
        return "glibc", None
    library = find_jemalloc()
    if library is None and choice == "jemalloc":
        raise AllocatorError(
            f"{ENV_CHOICE}=jemalloc but no jemalloc library was found: install it (apt-get install "
            f"libjemalloc2), set {ENV_LIBRARY} to its path, or set {ENV_CHOICE}=auto"
        )
    return ("jemalloc", library) if library else ("glibc", None)


def allocator_env(choice: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) that starts a child on ``choice``'s allocator."""
    out = dict(os.environ if env is None else env)
    allocator, library = resolve_allocator(choice)
    preload = [p for p in out.get("LD_PRELOAD", "").split(":") if p and "jemalloc" not in Path(p).name]
    if allocator == "jemalloc" and library:
        preload.insert(0, library)
        out.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    if preload:
        out["LD_PRELOAD"] = ":".join(preload)
    else:
        out.pop("LD_PRELOAD", None)
    return out


def ensure_allocator(choice: str | None = None) -> str:
    """Make this process run on ``choice``'s allocator, re-executing its command line once if needed.

    Returns the allocator this process runs on. Only a process's entry point may call it (it may
    replace the process, as ``os.execve`` does); a second start (``ENVACE_ALLOCATOR_EXEC`` set) never
    re-executes, and where the preload did not take (a statically linked Python, a sanitiser that
    refuses it) the process goes on with what it has and the log says so.
    """
    choice = allocator_choice() if choice is None else choice
    allocator, _ = resolve_allocator(choice)
    running = running_allocator()
    if running == allocator or (allocator == "glibc" and running == "other"):
        return running
    if os.environ.get(ENV_EXEC):
        logger.warning(ENV_CHOICE + "=%s resolved to %s, but this process runs on %s", choice, allocator, running)
        return running
    env = allocator_env(choice)
    env[ENV_EXEC] = "1"
    logger.info(ENV_CHOICE + "=%s: restarting on %s (%s)", choice, allocator, env.get("LD_PRELOAD", "no preload"))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
    return allocator  # not reached


_LIBC: Any = None  # glibc once loaded (False where it cannot be)


def _libc() -> Any:
    """glibc, loaded once (False where it cannot be: another C library, another OS)."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
            _LIBC.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


_PURGE: Any = None  # jemalloc's mallctl once found (False when malloc is not jemalloc's)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the OS: jemalloc's purge of every arena, else glibc's
    ``malloc_trim`` (a no-op elsewhere).

    A rollout or an update frees hundreds of MB of few-MB tensors (KV caches, activations); handing
    them back between the phases keeps them from adding to the next phase's resident peak (measured:
    ``scripts/bench_step.py``'s ``peak_rss_mb``).
    """
    global _PURGE
    if _PURGE is None:
        mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
        if mallctl is not None:
            mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        _PURGE = mallctl or False
    if _PURGE:
        _PURGE(f"arena.{ARENA_ALL}.purge".encode(), None, None, None, 0)
    elif _libc():
        _LIBC.malloc_trim(0)


def fix_mmap_threshold() -> bool:
    """Serve allocations of 8 MB and more from their own mappings, returned to the OS when freed (glibc).

    glibc starts at 128 KB and raises the threshold (up to 32 MB) each time a mapped block is freed, so
    after the first few steps every activation and KV-cache block comes from the heap, where freed
    blocks of many sizes fragment it and stay resident. Fixed at 8 MB (SmolLM2 update, bf16, one AMD
    EPYC core, ``scripts/bench_step.py``'s new path: peak RSS 4,940 -> 4,423 MB at the same step time;
    at 256 KB the peak was 3,736 MB but steps ran 1.5x slower, every small block page-faulting).
    A threshold the user set (``MALLOC_MMAP_THRESHOLD_``) is left alone; a no-op without glibc's malloc
    (under jemalloc, ``mallopt`` would only tune glibc's unused allocator). Returns whether it set it.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or running_allocator() != "glibc":
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


__all__ = [
    "ALLOCATORS",
    "AllocatorError",
    "allocator_choice",
    "allocator_env",
    "ensure_allocator",
    "find_jemalloc",
    "fix_mmap_threshold",
    "resolve_allocator",
    "running_allocator",
    "trim_heap",
]
