"""Files domain: a tiny file store with fixed top-level folders and short text files.

State: ``{"folders": [name, ...], "files": {"folder/name.ext": {"content"}}}``. Paths are always
``folder/name.ext``; there are no nested folders, so no id counters are needed.
"""

from __future__ import annotations

import random
from typing import Any

from envace.envs.toolworld.schema import (
    ALREADY_EXISTS,
    INVALID_VALUE,
    NOT_FOUND,
    Param,
    ToolError,
    ToolSpec,
)

NAME = "files"
DESCRIPTION = "a small file store: list folders, read, write, move and delete text files"
FOLDERS = ("docs", "archive", "reports", "personal")
FILE_NAMES = (
    "notes.txt",
    "todo.txt",
    "budget.csv",
    "plan.md",
    "ideas.txt",
    "report.txt",
    "draft.md",
    "summary.txt",
    "agenda.md",
    "recipes.txt",
)
CONTENTS = (
    "meeting moved to friday",
    "buy milk and eggs",
    "q1 revenue up 4%",
    "call the landlord",
    "ship v2 in april",
    "renew passport",
    "book flights to lisbon",
    "water the plants",
    "send invoices on monday",
    "draft the blog post",
)
PATH_PATTERN = r"^[a-z]+/[a-z0-9_]+\.(txt|md|csv)$"


def folder_of(path: str) -> str:
    return path.split("/", 1)[0]


def require_file(state: dict[str, Any], path: str) -> dict[str, Any]:
    found = state["files"].get(path)
    if found is None:
        raise ToolError(NOT_FOUND, f"no file at '{path}'")
    return found


def require_folder(state: dict[str, Any], folder: str) -> None:
    if folder not in state["folders"]:
        raise ToolError(NOT_FOUND, f"no folder named '{folder}'")


def folder_files(state: dict[str, Any], folder: str) -> list[str]:
    """Paths in ``folder``, sorted, as ``list_files`` reports them."""
    return sorted(p for p in state["files"] if folder_of(p) == folder)


def _list_files(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    require_folder(state, args["folder"])
    return {"folder": args["folder"], "files": folder_files(state, args["folder"])}


def _read_file(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    return {"path": args["path"], "content": require_file(state, args["path"])["content"]}


def _write_file(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    path = args["path"]
    require_folder(state, folder_of(path))
    if path in state["files"] and not args["overwrite"]:
        raise ToolError(ALREADY_EXISTS, f"{path} already exists; pass overwrite=true to replace it")
    state["files"][path] = {"content": args["content"]}
    return {"path": path, "size": len(args["content"])}


def _move_file(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    path, folder = args["path"], args["folder"]
    found = require_file(state, path)
    require_folder(state, folder)
    if folder_of(path) == folder:
        raise ToolError(INVALID_VALUE, f"{path} is already in {folder}")
    new_path = f"{folder}/{path.split('/', 1)[1]}"
    if new_path in state["files"]:
        raise ToolError(ALREADY_EXISTS, f"{new_path} already exists")
    state["files"][new_path] = found
    del state["files"][path]
    return {"old_path": path, "new_path": new_path}


def _delete_file(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    require_file(state, args["path"])
    del state["files"][args["path"]]
    return {"path": args["path"], "deleted": True}


_PATH = Param(
    "path", "string", "File path as folder/name.ext, e.g. docs/notes.txt.", pattern=PATH_PATTERN, hint="folder/name.ext"
)
_FOLDER = Param("folder", "string", "Folder name, e.g. docs.")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("list_files", NAME, "List the file paths in a folder.", (_FOLDER,), _list_files),
    ToolSpec("read_file", NAME, "Read a text file.", (_PATH,), _read_file),
    ToolSpec(
        "write_file",
        NAME,
        "Create a text file, or replace it when overwrite is true.",
        (
            _PATH,
            Param("content", "string", "Text to write."),
            Param("overwrite", "boolean", "Replace an existing file.", required=False, default=False),
        ),
        _write_file,
    ),
    ToolSpec(
        "move_file",
        NAME,
        "Move a file into another folder, keeping its name.",
        (_PATH, Param("folder", "string", "Destination folder.")),
        _move_file,
    ),
    ToolSpec("delete_file", NAME, "Delete a file.", (_PATH,), _delete_file),
)


def seed_state(rng: random.Random) -> dict[str, Any]:
    """Five files spread over the folders (one folder is left empty)."""
    folders = list(FOLDERS)
    empty = rng.choice(folders)
    used = [f for f in folders if f != empty]
    names = rng.sample(FILE_NAMES, 5)
    contents = rng.sample(CONTENTS, 5)
    files = {f"{rng.choice(used)}/{name}": {"content": text} for name, text in zip(names, contents)}
    return {"folders": folders, "files": files}
