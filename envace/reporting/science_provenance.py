"""Where the science report's numbers came from: one row per part of the matrix that has results (a stage of
``science/dvc.yaml`` or ``science/testtime_grid/dvc.yaml`` whose outputs exist), with the commit(s) its stage
runner recorded in the part's details files (``produced_by``) and whether the part's code, params and data
inputs still equal those its file's ``dvc.lock`` recorded for its run.

The second check is DVC's own per-dependency comparison (the one ``dvc status`` makes). Code (``envace/``)
and params are always here, so they are always compared. A data dependency (the prepared tasks, the SFT
model under ``science.dir``, a cell's checkpoint for the test-time parts) is a by-product that a fresh clone
does not have until it re-runs the part that produces it (which has its own row): it is compared where it
exists on this machine, and named as not checked where it does not. A part is **current** when none of its
code, params or present data inputs differs, i.e. the commit it ran at and HEAD have the same stage
dependencies; a recorded commit with ``code_dirty`` then only means that files outside its dependencies had
uncommitted changes.

A third check covers what DVC cannot see: a stage lists its code dependencies by hand, and the modules its
command imports (envace.utils.imports: the static closure of ``python -m <module>``, an over-approximation)
can reach files it does not list. For each part, the files of that closure outside its declared
dependencies that differ between a commit the part ran at and this working tree (``git diff``) are named
(column "undeclared code changed since"); empty means the part's whole importable code is as it ran, not
only the declared part. A part stays current on DVC's check whatever this column says: the column says
where the reader has to trust that a change did not reach the part's numbers (a reporting module imported
for another part's sake, say); ``unknown`` where git cannot tell (a commit not in this clone's history).

DVC's repository lock is free while a stage's command runs (DVC releases it around the command), so the
aggregate stage can make this check itself; anything DVC refuses is reported as ``unknown`` with its reason,
never guessed."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from envace.reporting.provenance import CODE_DIR
from envace.utils.imports import closure, import_graph, module_paths

DVCFILE = "science/dvc.yaml"
GRID_DVCFILE = "science/testtime_grid/dvc.yaml"  # the first seed's test-time grid on further seeds (organism)
DVCFILES = (DVCFILE, GRID_DVCFILE)
CURRENT, STALE, UNKNOWN = "current", "stale", "unknown"


@dataclass(frozen=True)
class PartState:
    stage: str
    commits: tuple[str, ...]  # short hashes recorded by the part's stage runs, "+dirty" where code_dirty
    state: str
    detail: str = ""
    compared: int = 0  # data dependencies present here and compared with the lock's record
    absent: tuple[str, ...] = ()  # data dependencies not on this machine (not compared)
    # files its command can import, not among its declared deps, changed since its commit(s); None: unknown
    undeclared: tuple[str, ...] | None = ()


def recorded_commits(outs: Iterable[Path]) -> tuple[str, ...]:
    """The ``produced_by`` commits of every details file under ``outs`` (files or directories), sorted."""
    found: set[str] = set()
    for out in outs:
        files = [out] if out.is_file() else sorted(out.rglob("*.details.json")) if out.is_dir() else []
        for path in files:
            if not path.name.endswith(".details.json"):
                continue
            try:
                record = json.loads(path.read_text()).get("produced_by") or {}
            except (OSError, ValueError):
                continue
            if record.get("commit"):
                found.add(str(record["commit"])[:7] + ("+dirty" if record.get("code_dirty") else ""))
    return tuple(sorted(found))


def _is_params(dep: Any) -> bool:
    return type(dep).__name__ == "ParamsDependency"


def _code_or_params(dep: Any) -> bool:
    name = str(dep.def_path)
    return _is_params(dep) or name == CODE_DIR or name.startswith(f"{CODE_DIR}/")


class Package(NamedTuple):
    """A package read once, for many commands: its ``paths`` (``module_paths``) and import ``graph``."""

    paths: dict[str, Path]
    graph: dict[str, set[str]]


def read_package(package_dir: Path) -> Package:
    return Package(module_paths(package_dir), import_graph(package_dir))


def importable_files(root: Path, cmd: str, package: Package | None = None) -> set[str]:
    """The files under ``root/envace`` that ``cmd`` can load (relative, posix): the import closure of each
    ``python -m <module>`` it runs, or every file of the package when it runs none (a script). ``package``:
    ``root/envace`` read already (``read_package``), for a caller asking about many commands."""
    package_dir = Path(root) / CODE_DIR
    if not package_dir.is_dir():
        return set()
    paths, graph = read_package(package_dir) if package is None else package
    starts = [m for m in re.findall(r"python\S*\s+-m\s+(\S+)", cmd) if m in graph]
    modules = set().union(*(closure(graph, m) for m in starts)) if starts else set(paths)
    return {paths[m].relative_to(root).as_posix() for m in modules}


def uncovered(files: Iterable[str], declared: Iterable[str]) -> set[str]:
    """Those of ``files`` (relative, posix) that no ``declared`` dependency covers: neither the file itself nor
    a folder holding it (a trailing ``/`` allowed)."""
    folders = [d.rstrip("/") for d in declared]
    return {f for f in files if not any(f == d or f.startswith(d + "/") for d in folders)}


def undeclared_changes(
    root: Path, files: set[str], declared: Iterable[str], commits: Iterable[str]
) -> tuple[str, ...] | None:
    """Those of ``files`` that no ``declared`` dependency covers (``uncovered``) and that differ between one
    of ``commits`` (short hashes, ``+dirty`` allowed) and the working tree; None when git cannot tell."""
    outside = uncovered(files, declared)
    commits = [c.split("+", 1)[0] for c in commits]
    if not commits:
        return None
    changed: set[str] = set()
    for commit in commits:
        done = subprocess.run(
            ["git", "diff", "--name-only", commit, "--", CODE_DIR], cwd=root, capture_output=True, text=True
        )
        if done.returncode != 0:
            return None
        changed.update(done.stdout.split())
    return tuple(sorted(outside & changed))


def part_states(
    root: Path, dvcfiles: str | tuple[str, ...] = DVCFILES, skip: tuple[str, ...] = ("aggregate",)
) -> list[PartState]:
    """One row per stage of ``dvcfiles`` (but ``skip``) whose outputs exist under ``root``, in file order."""
    try:
        from dvc.repo import Repo

        repo = Repo(str(root))
    except Exception as exc:  # no DVC or not a DVC repository: say so in the table
        return [PartState("(all)", (), UNKNOWN, f"DVC could not open {root}: {exc}", undeclared=None)]
    rows = []
    files = (dvcfiles,) if isinstance(dvcfiles, str) else dvcfiles
    wanted = {(Path(root) / f).resolve(): f for f in files}
    package = read_package(Path(root) / CODE_DIR) if (Path(root) / CODE_DIR).is_dir() else None
    try:
        with repo.lock:
            stages = [s for s in repo.index.stages if Path(str(s.dvcfile.path)).resolve() in wanted]
            order = list(wanted)
            for stage in sorted(stages, key=lambda s: order.index(Path(str(s.dvcfile.path)).resolve())):
                dvcfile = wanted[Path(str(stage.dvcfile.path)).resolve()]
                if stage.name in skip:
                    continue
                address = f"{dvcfile}:{stage.name}"
                outs = [Path(out.fs_path) for out in stage.outs]
                if not any(p.exists() for p in outs):
                    continue  # not run here yet
                commits = recorded_commits(outs)
                lock = dvcfile.replace(".yaml", ".lock")
                try:
                    changed = [str(d.def_path) for d in stage.deps if _code_or_params(d) and d.changed()]
                    data = [d for d in stage.deps if not _code_or_params(d)]
                    absent = [str(d.def_path) for d in data if not d.exists]
                    changed += [str(d.def_path) for d in data if d.exists and d.changed()]
                except Exception as exc:  # a lock entry DVC cannot read: unknown, with DVC's reason
                    rows.append(
                        PartState(address, commits, UNKNOWN, f"DVC: {type(exc).__name__}: {exc}", undeclared=None)
                    )
                    continue
                declared = [str(d.def_path) for d in stage.deps if _code_or_params(d) and not _is_params(d)]
                cmd = " ".join(stage.cmd) if isinstance(stage.cmd, list) else str(stage.cmd)
                loaded = importable_files(Path(root), cmd, package)
                inputs = (
                    len(data) - len(absent),
                    tuple(absent),
                    undeclared_changes(Path(root), loaded, declared, commits),
                )
                if changed and not any(d.hash_info for d in stage.deps if not _is_params(d)):
                    why = f"no record in {lock} (still running, or outputs from elsewhere)"
                    rows.append(PartState(address, commits, STALE, why, *inputs))
                elif changed:
                    why = f"changed since {lock} recorded its run: {', '.join(changed)}"
                    rows.append(PartState(address, commits, STALE, why, *inputs))
                else:
                    what = "code, params and data inputs" if not absent else "code, params and present data inputs"
                    rows.append(PartState(address, commits, CURRENT, f"{what} equal its recorded run's", *inputs))
    except Exception as exc:  # the repository lock itself, or the index
        return [PartState("(all)", (), UNKNOWN, f"DVC: {type(exc).__name__}: {exc}", undeclared=None)]
    finally:
        repo.close()
    return rows


def _undeclared_text(state: PartState, shown: int = 4) -> str:
    if state.undeclared is None:
        return "unknown (git cannot compare its commit)"
    if not state.undeclared:
        return "none"
    names = [f.removeprefix(f"{CODE_DIR}/") for f in state.undeclared]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)}: {', '.join(names[:shown])}{more}"


def _inputs_text(state: PartState) -> str:
    text = f"{state.compared} compared"
    return text + (f"; not here, not compared: {', '.join(state.absent)}" if state.absent else "")


def provenance_table(states: list[PartState]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "part (stage)": s.stage.split(":", 1)[-1],
                "produced by commit": ", ".join(s.commits) or "—",
                "state": "**STALE**" if s.state == STALE else s.state,
                "detail": s.detail,
                "data inputs": _inputs_text(s),
                "undeclared code changed since": _undeclared_text(s),
            }
            for s in states
        ],
        columns=[
            "part (stage)",
            "produced by commit",
            "state",
            "detail",
            "data inputs",
            "undeclared code changed since",
        ],
    )


def provenance_summary(states: list[PartState]) -> dict[str, Any]:
    """For ``science.json``: how many parts are current, the stale ones by name."""
    return {
        "parts": len(states),
        "current": sum(s.state == CURRENT for s in states),
        "stale": [s.stage for s in states if s.state == STALE],
        "unknown": [s.stage for s in states if s.state == UNKNOWN],
        "inputs_not_here": {s.stage: list(s.absent) for s in states if s.absent},
        "undeclared_changes": {s.stage: list(s.undeclared) for s in states if s.undeclared},
        "undeclared_unknown": [s.stage for s in states if s.undeclared is None],
        "commits": sorted({c for s in states for c in s.commits}),
    }
