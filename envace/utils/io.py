"""Atomic file and directory writes, JSON/JSONL helpers.

Every output a stage produces goes through these: a file is written to a temporary sibling and moved
into place with ``os.replace``; a directory is filled under a temporary sibling and renamed over the
target. A crash therefore never leaves a half-written output that DVC would later hash as valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

StrPath = str | os.PathLike


@contextlib.contextmanager
def atomic_path(path: StrPath) -> Iterator[Path]:
    """Yield a temporary file path next to ``path``; on success move it over ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: StrPath) -> Iterator[Path]:
    """Yield an empty temporary directory next to ``path``; on success it replaces ``path`` whole."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        old = None
        if target.exists() or target.is_symlink():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            _remove(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def write_text(path: StrPath, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: StrPath, obj: Any, *, indent: int = 2) -> Path:
    """Write JSON atomically (sorted keys, trailing newline; non-JSON values via ``str``)."""
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=True, default=str) + "\n")


def read_json(path: StrPath) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_jsonl(path: StrPath, records: Iterable[Any]) -> int:
    """Write one JSON document per line atomically; return the number of lines."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, sort_keys=True, default=str, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: StrPath) -> list[Any]:
    """Read a JSONL file; a malformed line raises naming the file and line number."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg}); regenerate the file") from exc
    return rows
