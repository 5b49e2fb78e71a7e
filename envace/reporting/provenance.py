"""Where the report's inputs came from: the code's commit and, per metrics file, the commit that
produced it and whether the code has changed since (a *stale* input).

The producing commit shown is the one the stage runner records in the details file
(``metrics/<stage>.details.json``, key ``produced_by``: the commit of the code that ran, and whether it
had uncommitted changes). Whether an input is stale is decided, in this order, by:

1. ``dvc status`` (the committed ``dvc.lock`` holds the hashes of the code and data each stage ran
   with): **stale** when the code (``CODE_DIR``) or params the file's stage depends on changed — precise
   per stage (data deps are left out: they differ whenever the workspace holds another run's outputs);
2. inside ``dvc repro`` (``DVC_STAGE`` set; DVC holds its lock, so ``dvc status`` cannot run): current,
   since the running repro re-ran every stage whose deps had changed (not so for ``--single-item``);
3. the recorded commit: **stale** when ``CODE_DIR`` differs between it and HEAD, or has uncommitted
   changes now or had them then (coarse: any change under ``CODE_DIR`` counts);
4. for files written before that record existed, git:

- a file committed and unchanged since: produced by the last commit that touched it
  (``git log -1 -- <file>``); **stale** when ``CODE_DIR`` changed in a later commit or has uncommitted
  changes (the code that would produce it now is not the code that did);
- a file modified or untracked (produced after its last commit, by the working tree): **stale** when a
  file under ``CODE_DIR`` was modified after it (mtime); else current, labelled ``uncommitted``;
- outside a git work tree: ``unknown``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CODE_DIR = "envace"
CURRENT, STALE, UNCOMMITTED, UNKNOWN = "current", "stale", "uncommitted", "unknown"


@dataclass(frozen=True)
class InputState:
    """One metrics file: the commit that produced it (short hash, or None), its state, why."""

    name: str
    commit: str | None
    state: str
    detail: str = ""
    cpu: str = ""  # the CPU the producing stage ran on (produced_by.cpu), "" where not recorded
    precision: str = ""  # the precision it resolved (produced_by.precision), "" where none


def git(args: list[str], cwd: Path) -> str | None:
    """``git <args>`` in ``cwd``: its stdout stripped, None when git fails (not a repo, no git)."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def repo_root(path: Path) -> Path | None:
    top = git(["rev-parse", "--show-toplevel"], path if path.is_dir() else path.parent)
    return Path(top) if top else None


# the code a run's results depend on; not the pipeline's own outputs (metrics/, plots/, dvc.lock, ...), nor
# params.yaml: the config composed for this run (``make params``, ``dvc exp run -S``), recorded as the run's
# profile and overrides, so a non-default profile does not make the code dirty
SOURCE_PATHS = ("envace", "conf", "flows", "tasks", "dvc.yaml", "pyproject.toml")


def head_state(root: Path) -> tuple[str, bool]:
    """(HEAD commit, whether the code has uncommitted changes: tracked edits or untracked files under
    ``SOURCE_PATHS``; outputs the pipeline writes do not make the tree dirty)."""
    commit = git(["rev-parse", "HEAD"], root) or "unknown"
    status = git(["status", "--porcelain", "--", *SOURCE_PATHS], root)
    return commit, bool(status)


def _newest_code_mtime(root: Path) -> float:
    return max((p.stat().st_mtime for p in (root / CODE_DIR).rglob("*.py")), default=0.0)


def _recorded_state(name: str, path: Path, root: Path) -> InputState | None:
    """Rule 1 (module docstring): the commit recorded in the details file, None when there is none."""
    details = path.with_name(path.name[: -len(".json")] + ".details.json")
    try:
        record = json.loads(details.read_text()).get("produced_by") if details.exists() else None
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not record.get("commit") or record["commit"] == "unknown":
        return None
    commit = str(record["commit"])
    short = commit[:7]
    diff = git(["diff", "--name-only", commit, "HEAD", "--", CODE_DIR], root)
    if diff is None:
        return InputState(name, short, UNKNOWN, f"commit {short} is not in this repository")
    why = [f"{CODE_DIR}/ changed since {short}"] if diff else []
    why += [f"{CODE_DIR}/ has uncommitted changes"] if git(["status", "--porcelain", "--", CODE_DIR], root) else []
    why += [f"produced by uncommitted code on top of {short}"] if record.get("code_dirty") else []
    cpu = str(record.get("cpu") or "") + (" (bf16)" if record.get("cpu_bf16") else "")
    return InputState(name, short, STALE if why else CURRENT, "; ".join(why), cpu, str(record.get("precision") or ""))


def _stage_of(stem: str) -> str:
    """``evaluate_bfcl`` -> ``evaluate@bfcl`` (the dvc.yaml stage writing ``metrics/<stem>.json``)."""
    return stem.replace("evaluate_", "evaluate@", 1) if stem.startswith("evaluate_") else stem


@lru_cache(maxsize=8)
def dvc_changed_stages(root: str) -> frozenset[str] | None:
    """Stages whose deps differ from ``dvc.lock`` (``dvc status``), None when DVC cannot answer."""
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    try:
        out = subprocess.run([dvc, "status", "--json"], cwd=root, capture_output=True, text=True, timeout=60)
        status = json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    if not isinstance(status, dict):
        return None
    # code (and config) only: a data dep differs whenever the workspace holds another run's outputs, and
    # an upstream stage whose code changed is reported on its own row
    return frozenset(
        s
        for s, changes in status.items()
        if any(
            dep == "params.yaml" or dep.startswith(f"{CODE_DIR}/") or dep == CODE_DIR
            for c in changes
            if isinstance(c, dict)
            for dep in c.get("changed deps", {})
        )
    )


def input_state(path: Path, name: str | None = None) -> InputState:
    """The provenance of one metrics file (``CODE_DIR`` is resolved in the file's own repository)."""
    name = name or path.name
    path = path.resolve()
    root = repo_root(path) if path.exists() else None
    if root is None:
        return InputState(name, None, UNKNOWN, "not in a git work tree")
    recorded = _recorded_state(name, path, root)
    producer = recorded.commit if recorded is not None else None
    machine = {"cpu": recorded.cpu, "precision": recorded.precision} if recorded is not None else {}
    changed_stages = dvc_changed_stages(str(root.resolve()))
    if changed_stages is not None:
        stage = _stage_of(path.name[: -len(".json")])
        if stage in changed_stages:
            why = f"dvc status: stage {stage}'s code or params changed since dvc.lock recorded its run"
            return InputState(name, producer, STALE, why, **machine)
        return InputState(name, producer, CURRENT, "dvc status: its code and params match dvc.lock", **machine)
    if os.environ.get("DVC_STAGE"):  # inside `dvc repro`, which holds DVC's lock and re-ran what was stale
        return InputState(name, producer, CURRENT, "checked by the running dvc repro against dvc.lock", **machine)
    if recorded is not None:
        return recorded
    rel = str(path.relative_to(root.resolve()))
    last = git(["log", "-1", "--format=%h", "--", rel], root)
    if not last or git(["status", "--porcelain", "--", rel], root):
        newer = _newest_code_mtime(root) > path.stat().st_mtime
        return InputState(
            name,
            None,
            STALE if newer else UNCOMMITTED,
            f"written after its last commit; {CODE_DIR}/ modified after it"
            if newer
            else "written by the working tree, not committed",
        )
    changed = (git(["log", "--format=%h", f"{last}..HEAD", "--", CODE_DIR], root) or "").split()
    dirty = bool(git(["status", "--porcelain", "--", CODE_DIR], root))
    if not changed and not dirty:
        return InputState(name, last, CURRENT)
    why = [f"{len(changed)} later commit(s) changed {CODE_DIR}/"] if changed else []
    why += [f"{CODE_DIR}/ has uncommitted changes"] if dirty else []
    return InputState(name, last, STALE, "; ".join(why))


def header_lines(
    *,
    commit: str,
    dirty: bool,
    profile: str,
    overrides: list[str],
    model: str,
    variant: str,
    seeds: list[int],
    date: str,
    inputs: list[InputState],
) -> list[str]:
    """The report's opening block: what produced it, then one row per input with its state."""
    tree = " (dirty: the code has uncommitted changes)" if dirty else ""
    lines = [
        f"**Produced by** commit `{commit}`{tree}; profile `{profile}`; overrides "
        f"`{' '.join(overrides) or 'none'}` (ENVACE_OVERRIDES, on top of params.yaml); model `{model}`; "
        f"training variant `{variant}`; seed(s) {', '.join(map(str, seeds))}; generated {date}.",
        "",
    ]
    if inputs:
        lines += ["| input | produced by commit | CPU | precision | state |", "|:--|:--|:--|:--|:--|"]
        lines += [
            f"| `{s.name}` | {s.commit or '—'} | {s.cpu or '—'} | {s.precision or '—'} | "
            f"{'**STALE**' if s.state == STALE else s.state}{': ' + s.detail if s.detail else ''} |"
            for s in inputs
        ]
        stale = [s.name for s in inputs if s.state == STALE]
        if stale:
            lines += [
                "",
                f"**Stale inputs** ({len(stale)} of {len(inputs)}): their numbers were produced by "
                f"older code than this commit; the tables built from them are marked. Rerun "
                f"`dvc repro` to refresh them.",
            ]
        lines.append("")
    return lines


def input_states(root: Path, shown: str, names: list[str]) -> list[InputState]:
    """The provenance of ``root/<name>.json`` for each name, shown as ``<shown>/<name>.json``."""
    return [input_state(root / f"{name}.json", f"{shown}/{name}.json") for name in names]


def stale_note(prefixes: list[str], inputs: list[InputState]) -> str | None:
    """A warning for a table built from the metrics files whose stem starts with one of ``prefixes``,
    when any of them is stale."""
    stale = [s.name for s in inputs if s.state == STALE and Path(s.name).stem.startswith(tuple(prefixes))]
    return f"**STALE**: built from {', '.join(f'`{n}`' for n in stale)}, produced by older code." if stale else None
