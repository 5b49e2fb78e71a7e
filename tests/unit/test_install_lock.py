"""The install inputs agree with each other and with the code.

* every package the code imports is declared in pyproject.toml (dependencies or an extra);
* every requirement of requirements/*.in is pinned with hashes in its lock, and nothing the lock
  leaves out on purpose (requirements/excludes.txt) crept back in;
* pyproject's ranges accept the versions the locks pin, and the bench lock keeps the default lock's pins;
* scripts/install.sh refuses a Python other than 3.11 with a message that says how to fix it.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
SCANNED = ("envace", "flows", "tasks", "hydra_plugins", "scripts")
LOCAL = {"envace", "flows", "tasks", "hydra_plugins", "scripts"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")


def imported_top_level_names() -> dict[str, str]:
    """{top-level import name: first file importing it} over the scanned folders (absolute imports)."""
    found: dict[str, str] = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return {k: v for k, v in found.items() if k not in sys.stdlib_module_names and k not in LOCAL}


def declared_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return reqs + [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]


def read_lock(name: str) -> dict[str, tuple[str, int]]:
    """{canonical name: (version, number of hashes)} of requirements/<name>.lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for line in (REQ / f"{name}.lock").read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match[1])
            pins[current] = (match[2], 0)
        if current and "--hash=sha256:" in line:
            version, n = pins[current]
            pins[current] = (version, n + line.count("--hash=sha256:"))
        if not line.rstrip().endswith("\\"):
            current = None
    return pins


def listed_names(path: Path) -> set[str]:
    """Canonical package names of a requirements-style input file (comments and options skipped)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(canonicalize_name(Requirement(line).name))
    return names


def test_every_imported_package_is_declared():
    declared = {canonicalize_name(r.name) for r in declared_requirements()}
    mapping = md.packages_distributions()
    missing = []
    for top, where in sorted(imported_top_level_names().items()):
        dists = {canonicalize_name(d) for d in mapping.get(top, [])} or {canonicalize_name(top)}
        if not dists & declared:
            missing.append(f"{top} (imported in {where}; distribution {'/'.join(sorted(dists))})")
    assert not missing, (
        "imported but not declared in pyproject.toml dependencies or an extra "
        f"(add it there and to requirements/cpu.in, then bash requirements/lock.sh): {missing}"
    )


def test_the_scan_sees_known_imports():
    names = imported_top_level_names()
    for expected in ("torch", "verl", "mlflow", "psutil", "yaml", "tokenizers", "loguru", "holidays"):
        assert expected in names, f"the import scan missed {expected}"
    assert "json" not in names and "envace" not in names


@pytest.mark.parametrize("name", ["cpu", "bench"])
def test_lock_pins_every_input_with_hashes(name):
    pins = read_lock(name)
    wanted = listed_names(REQ / f"{name}.in")
    unpinned = sorted(wanted - set(pins))
    assert not unpinned, (
        f"requirements/{name}.in lists {unpinned}, not pinned in {name}.lock: run bash requirements/lock.sh"
    )
    unhashed = sorted(p for p, (_, n) in pins.items() if n == 0)
    assert not unhashed, f"requirements/{name}.lock pins {unhashed} without --hash (install.sh uses --require-hashes)"
    back = sorted(listed_names(REQ / "excludes.txt") & set(pins))
    assert not back, f"requirements/{name}.lock pins {back}, which requirements/excludes.txt leaves out"


def test_torch_is_the_cpu_build():
    assert read_lock("cpu")["torch"][0] == "2.13.0+cpu"


def test_bench_lock_keeps_the_default_pins():
    cpu, bench = read_lock("cpu"), read_lock("bench")
    moved = {p: (cpu[p][0], v) for p, (v, _) in bench.items() if p in cpu and cpu[p][0] != v}
    assert not moved, f"bench.lock changes versions of the default lock (cpu, bench): {moved}"
    assert "trl" in bench and "trl" not in cpu


def test_pyproject_ranges_accept_the_locked_versions():
    pins = {**read_lock("bench"), **read_lock("cpu")}
    bad = []
    for req in declared_requirements():
        name = canonicalize_name(req.name)
        if name not in pins:
            continue  # an extra the locks do not install (gpu, bfcl-online): resolved by pip from the ranges
        if not req.specifier.contains(Version(pins[name][0]), prereleases=True):
            bad.append(f"{req} vs locked {pins[name][0]}")
    assert not bad, f"pyproject.toml ranges reject locked versions: {bad}"


def test_default_lock_leaves_out_ray_extras_and_wandb():
    pins = read_lock("cpu")
    for gone in ("wandb", "tensorboard", "faiss-cpu", "sentence-transformers", "torchcodec", "plotly"):
        assert gone not in pins
    assert "ray" in pins and "verl" in pins  # importing verl imports ray: both stay


def other_python() -> tuple[str, str] | None:
    """A runnable CPython other than 3.11 on this machine (path, "X.Y"), or None."""
    candidates = [shutil.which(f"python3.{minor}") for minor in (12, 13, 10)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.1[023]*/bin/python3"))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue  # e.g. a pyenv shim for a version that is not selected
        if out != "3.11":
            return exe, out
    return None


def test_install_refuses_another_python(tmp_path):
    found = other_python()
    if found is None:
        pytest.skip("no Python other than 3.11 on this machine to offer install.sh")
    exe, version = found
    venv = tmp_path / "venv"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), str(venv)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": exe},
    )
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert f"is Python {version}" in line and "built for Python 3.11" in line and "PYTHON=python3.11" in line, line
    assert not venv.exists()


def test_install_refuses_an_unknown_set(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), str(tmp_path / "v"), "nosuchset"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "unknown install set 'nosuchset'" in proc.stderr and "bench" in proc.stderr


def test_pyproject_and_the_installer_name_one_python():
    from packaging.specifiers import SpecifierSet

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == "==3.11.*" and "3.11.9" in SpecifierSet(requires) and "3.12.0" not in SpecifierSet(requires)
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert not re.search(r"^PY_NEEDED=3", script, re.M), "install.sh must read the Python from pyproject.toml"


FAKE_PYTHON = """#!/usr/bin/env bash
# the real venv's python, except that `-m pip` only records its arguments (nothing is installed)
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "${*:3}" >> "$(dirname "$0")/../pip.log"; exit 0; fi
exec {python} "$@"
"""


def test_an_up_to_date_venv_is_not_reinstalled(tmp_path):
    """`make` runs the installer on every call with the default, relative, VENV=.venv: once its stamp
    matches the install inputs it must touch nothing (no pip at all), and say so."""
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON.replace("{python}", sys.executable))
    python.chmod(0o755)

    def install() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(ROOT / "scripts" / "install.sh"), "v"],  # relative, as the Makefile passes .venv
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = install()
    assert first.returncode == 0, first.stderr
    assert (venv / ".envace-installed").exists() and "-e" in (venv / "pip.log").read_text()
    (venv / "pip.log").unlink()
    again = install()
    assert again.returncode == 0, again.stderr
    assert "is up to date" in again.stdout and not (venv / "pip.log").exists(), again.stdout
