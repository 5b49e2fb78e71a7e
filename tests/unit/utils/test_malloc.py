"""The allocator switch: names, the library search, the child environment, and the real re-exec/purge."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from envace.utils import malloc
from envace.utils.malloc import AllocatorError, allocator_env, resolve_allocator

JEMALLOC = malloc.find_jemalloc() if sys.platform == "linux" else None
needs_jemalloc = pytest.mark.skipif(JEMALLOC is None, reason="no jemalloc library on this machine")


def test_unknown_allocator_names_the_setting_and_the_choices():
    with pytest.raises(AllocatorError, match=r"ENVACE_ALLOCATOR='tcmalloc' is not one of auto, jemalloc, glibc"):
        resolve_allocator("tcmalloc")


def test_glibc_needs_no_library():
    assert resolve_allocator("glibc") == ("glibc", None)


def test_a_missing_explicit_library_is_an_error_that_says_how_to_fix_it(monkeypatch, tmp_path):
    monkeypatch.setenv(malloc.ENV_LIBRARY, str(tmp_path / "nope.so"))
    with pytest.raises(AllocatorError, match="ENVACE_JEMALLOC=.*nope.so is not a file.*or unset it"):
        resolve_allocator("auto")


def test_jemalloc_without_a_library_fails_and_auto_falls_back(monkeypatch):
    monkeypatch.delenv(malloc.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(malloc, "find_jemalloc", lambda: None)
    with pytest.raises(AllocatorError, match="no jemalloc library was found: install it"):
        resolve_allocator("jemalloc")
    assert resolve_allocator("auto") == ("glibc", None)


def test_child_environment_preloads_jemalloc_and_keeps_the_users_settings(monkeypatch, tmp_path):
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setenv(malloc.ENV_LIBRARY, str(lib))
    env = allocator_env("auto", {"LD_PRELOAD": "/opt/libother.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{lib}:/opt/libother.so"
    assert env["MALLOC_CONF"] == malloc.JEMALLOC_CONF
    assert env["PATH"] == "/bin"
    kept = allocator_env("jemalloc", {"MALLOC_CONF": "narenas:1"})
    assert kept["MALLOC_CONF"] == "narenas:1"  # the user's tuning wins
    back = allocator_env("glibc", {"LD_PRELOAD": f"{lib}:/opt/libother.so"})
    assert back["LD_PRELOAD"] == "/opt/libother.so"
    assert "LD_PRELOAD" not in allocator_env("glibc", {"LD_PRELOAD": str(lib)})


def test_the_choice_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(malloc.ENV_CHOICE, raising=False)
    assert malloc.allocator_choice() == "auto"
    monkeypatch.setenv(malloc.ENV_CHOICE, "glibc")
    assert malloc.allocator_choice() == "glibc"


def test_this_process_runs_on_glibc_unless_preloaded():
    if "jemalloc" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("the test process itself runs with jemalloc preloaded")
    expected = "glibc" if platform.libc_ver()[0] == "glibc" else "other"
    assert malloc.running_allocator() == expected


def test_mmap_threshold_is_fixed_under_glibc_unless_the_user_set_one(monkeypatch):
    """On glibc's malloc the engine pins the mmap threshold; a user's MALLOC_MMAP_THRESHOLD_ wins."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert malloc.fix_mmap_threshold() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert malloc.fix_mmap_threshold() is (malloc.running_allocator() == "glibc")


PROBE = """
import ctypes, json, sys
from envace.utils import malloc
choice = malloc.ensure_allocator(sys.argv[1])
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = []
for _ in range(64):  # 256 MB in 4 MB blocks, every page touched
    p = libc.malloc(4 << 20)
    ctypes.memset(p, 1, 4 << 20)
    blocks.append(p)
for p in blocks:
    libc.free(p)
freed = rss_mb()
malloc.trim_heap()
print(json.dumps({"running": choice, "again": malloc.running_allocator(), "freed_mb": freed, "trimmed_mb": rss_mb()}))
"""


def _probe(choice: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", malloc.ENV_EXEC)}
    out = subprocess.run([sys.executable, "-c", PROBE, choice], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_jemalloc
def test_jemalloc_restarts_the_process_once_and_its_purge_returns_freed_pages():
    """A real re-exec with the preload; with decay off the freed 256 MB stay resident until the purge."""
    got = _probe("jemalloc")
    assert got["running"] == got["again"] == "jemalloc"
    assert got["freed_mb"] - got["trimmed_mb"] > 200, got


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_stays_without_a_restart():
    got = _probe("glibc")
    assert got["running"] == got["again"] == "glibc"
