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

DVC's repository lock is free while a stage's command runs (DVC releases it around the command), so the
aggregate stage can make this check itself; anything DVC refuses is reported as ``unknown`` with its reason,
never guessed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from envace.reporting.provenance import CODE_DIR

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


def part_states(
    root: Path, dvcfiles: str | tuple[str, ...] = DVCFILES, skip: tuple[str, ...] = ("aggregate",)
) -> list[PartState]:
    """One row per stage of ``dvcfiles`` (but ``skip``) whose outputs exist under ``root``, in file order."""
    try:
        from dvc.repo import Repo

        repo = Repo(str(root))
    except Exception as exc:  # no DVC or not a DVC repository: say so in the table
        return [PartState("(all)", (), UNKNOWN, f"DVC could not open {root}: {exc}")]
    rows = []
    files = (dvcfiles,) if isinstance(dvcfiles, str) else dvcfiles
    wanted = {(Path(root) / f).resolve(): f for f in files}
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
                    rows.append(PartState(address, commits, UNKNOWN, f"DVC: {type(exc).__name__}: {exc}"))
                    continue
                inputs = (len(data) - len(absent), tuple(absent))
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
        return [PartState("(all)", (), UNKNOWN, f"DVC: {type(exc).__name__}: {exc}")]
    finally:
        repo.close()
    return rows


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
            }
            for s in states
        ],
        columns=["part (stage)", "produced by commit", "state", "detail", "data inputs"],
    )


def provenance_summary(states: list[PartState]) -> dict[str, Any]:
    """For ``science.json``: how many parts are current, the stale ones by name."""
    return {
        "parts": len(states),
        "current": sum(s.state == CURRENT for s in states),
        "stale": [s.stage for s in states if s.state == STALE],
        "unknown": [s.stage for s in states if s.state == UNKNOWN],
        "inputs_not_here": {s.stage: list(s.absent) for s in states if s.absent},
        "commits": sorted({c for s in states for c in s.commits}),
    }
