"""Where the report's inputs came from: the code's commit and, per metrics file, the commit that
produced it and whether the code has changed since (a *stale* input).

A metrics file's producer is read from git, not from MLflow: git answers offline and with
``tracking=none``, and ``metrics/`` is git-tracked. The rules:

- a file committed and unchanged since: produced by the last commit that touched it
  (``git log -1 -- <file>``); **stale** when ``CODE_DIR`` changed in a later commit or has uncommitted
  changes (the code that would produce it now is not the code that did);
- a file modified or untracked (produced after its last commit, by the working tree): **stale** when a
  file under ``CODE_DIR`` was modified after it (mtime); else current, labelled ``uncommitted``;
- outside a git work tree: ``unknown``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
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


def head_state(root: Path) -> tuple[str, bool]:
    """(HEAD commit, whether the work tree has changes: tracked edits or untracked files)."""
    commit = git(["rev-parse", "HEAD"], root) or "unknown"
    status = git(["status", "--porcelain"], root)
    return commit, bool(status)


def _newest_code_mtime(root: Path) -> float:
    return max((p.stat().st_mtime for p in (root / CODE_DIR).rglob("*.py")), default=0.0)


def input_state(path: Path, name: str | None = None) -> InputState:
    """The provenance of one metrics file (``CODE_DIR`` is resolved in the file's own repository)."""
    name = name or path.name
    path = path.resolve()
    root = repo_root(path) if path.exists() else None
    if root is None:
        return InputState(name, None, UNKNOWN, "not in a git work tree")
    rel = str(path.relative_to(root.resolve()))
    last = git(["log", "-1", "--format=%h", "--", rel], root)
    if not last or git(["status", "--porcelain", "--", rel], root):
        newer = _newest_code_mtime(root) > path.stat().st_mtime
        return InputState(name, None, STALE if newer else UNCOMMITTED,
                          f"written after its last commit; {CODE_DIR}/ modified after it" if newer
                          else "written by the working tree, not committed")
    changed = (git(["log", "--format=%h", f"{last}..HEAD", "--", CODE_DIR], root) or "").split()
    dirty = bool(git(["status", "--porcelain", "--", CODE_DIR], root))
    if not changed and not dirty:
        return InputState(name, last, CURRENT)
    why = [f"{len(changed)} later commit(s) changed {CODE_DIR}/"] if changed else []
    why += [f"{CODE_DIR}/ has uncommitted changes"] if dirty else []
    return InputState(name, last, STALE, "; ".join(why))


def header_lines(*, commit: str, dirty: bool, profile: str, overrides: list[str], model: str, variant: str,
                 seeds: list[int], date: str, inputs: list[InputState]) -> list[str]:
    """The report's opening block: what produced it, then one row per input with its state."""
    tree = " (dirty: the work tree has uncommitted changes)" if dirty else ""
    lines = [f"**Produced by** commit `{commit}`{tree}; profile `{profile}`; overrides "
             f"`{' '.join(overrides) or 'none'}` (ENVACE_OVERRIDES, on top of params.yaml); model `{model}`; "
             f"training variant `{variant}`; seed(s) {', '.join(map(str, seeds))}; generated {date}.", ""]
    if inputs:
        lines += ["| input | produced by commit | state |", "|:--|:--|:--|"]
        lines += [f"| `{s.name}` | {s.commit or '—'} | {'**STALE**' if s.state == STALE else s.state}"
                  f"{': ' + s.detail if s.detail else ''} |" for s in inputs]
        stale = [s.name for s in inputs if s.state == STALE]
        if stale:
            lines += ["", f"**Stale inputs** ({len(stale)} of {len(inputs)}): their numbers were produced by "
                      f"older code than this commit; the tables built from them are marked. Rerun "
                      f"`dvc repro` to refresh them."]
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
