"""Files scenarios: read, list a folder, write a new file, move, delete, open the first file of a
folder (list_files → read_file on the listed path), read two files in parallel, and follow-ups on
"it" (move it, delete it)."""

from __future__ import annotations

from envace.envs.toolworld.domains.files import (
    CONTENTS,
    FILE_NAMES,
    FOLDERS,
    folder_files,
    folder_of,
)
from envace.envs.toolworld.planning import PlannedTurn, Ref, Scenario, ScenarioInput
from envace.envs.toolworld.scenarios.common import (
    call,
    enumerate_fields,
    one_step,
    phrase,
)


def _paths(inp: ScenarioInput) -> list[str]:
    return sorted(inp.state["files"])


def _other_folder(inp: ScenarioInput, path: str) -> str | None:
    """A folder other than ``path``'s where a file of the same name does not exist yet."""
    name = path.split("/", 1)[1]
    options = [f for f in FOLDERS if f != folder_of(path) and f"{f}/{name}" not in inp.state["files"]]
    return inp.rng.choice(options) if options else None


def _read(inp: ScenarioInput) -> PlannedTurn | None:
    if not inp.state["files"]:
        return None
    path = inp.rng.choice(_paths(inp))
    k = inp.key("read")
    user = phrase(inp, ("What does {path} say?", "Please read {path} to me.", "Open {path}."), path=path)
    return PlannedTurn(
        user,
        one_step(call(k, "read_file", path=path)),
        '{path} says: "{content}".',
        {"path": path, "content": Ref(k, ("content",))},
        ("content",),
        {"file": {"path": path}},
    )


def _list(inp: ScenarioInput) -> PlannedTurn:
    folder = inp.rng.choice(FOLDERS)
    k = inp.key("list")
    user = phrase(
        inp, ("Which files are in {folder}?", "List the {folder} folder.", "What's inside {folder}?"), folder=folder
    )
    paths = folder_files(dict(inp.state), folder)
    if not paths:
        return PlannedTurn(
            user,
            one_step(call(k, "list_files", folder=folder)),
            "The {folder} folder is empty.",
            {"folder": folder},
            ("folder",),
        )
    fields = {"folder": folder, "listing": ", ".join(paths), **enumerate_fields("path", paths)}
    return PlannedTurn(
        user,
        one_step(call(k, "list_files", folder=folder)),
        "{folder} contains: {listing}.",
        fields,
        tuple(f"path_{i}" for i in range(len(paths))),
    )


def _write(inp: ScenarioInput) -> PlannedTurn | None:
    options = [f"{f}/{n}" for f in FOLDERS for n in FILE_NAMES if f"{f}/{n}" not in inp.state["files"]]
    path, content = inp.rng.choice(options), inp.rng.choice(CONTENTS)
    k = inp.key("write")
    user = phrase(
        inp,
        (
            "Create {path} with the text '{content}'.",
            "Write '{content}' into a new file {path}.",
            "Save a note at {path} saying '{content}'.",
        ),
        path=path,
        content=content,
    )
    return PlannedTurn(
        user,
        one_step(call(k, "write_file", path=path, content=content)),
        "Saved {path} ({size} characters).",
        {"path": path, "size": Ref(k, ("size",))},
        ("path", "size"),
        {"file": {"path": Ref(k, ("path",))}},
    )


def _move(inp: ScenarioInput) -> PlannedTurn | None:
    if not inp.state["files"]:
        return None
    path = inp.rng.choice(_paths(inp))
    folder = _other_folder(inp, path)
    if folder is None:
        return None
    k = inp.key("move")
    user = phrase(
        inp, ("Move {path} to the {folder} folder.", "Please put {path} into {folder}."), path=path, folder=folder
    )
    return PlannedTurn(
        user,
        one_step(call(k, "move_file", path=path, folder=folder)),
        "Moved {path} to {new_path}.",
        {"path": path, "new_path": Ref(k, ("new_path",))},
        ("new_path",),
    )


def _delete(inp: ScenarioInput) -> PlannedTurn | None:
    if not inp.state["files"]:
        return None
    path = inp.rng.choice(_paths(inp))
    user = phrase(inp, ("Delete {path}.", "Please remove the file {path}."), path=path)
    return PlannedTurn(
        user, one_step(call(inp.key("delete"), "delete_file", path=path)), "Deleted {path}.", {"path": path}, ("path",)
    )


def _open_first(inp: ScenarioInput) -> PlannedTurn | None:
    folders = [f for f in FOLDERS if folder_files(dict(inp.state), f)]
    if not folders:
        return None
    folder = inp.rng.choice(folders)
    kl, kr = inp.key("list"), inp.key("read")
    user = phrase(
        inp,
        (
            "Open the first file in {folder} and tell me what it says.",
            "What does the first file in the {folder} folder say?",
        ),
        folder=folder,
    )
    first = Ref(kl, ("files", 0))
    steps = ((call(kl, "list_files", folder=folder),), (call(kr, "read_file", path=first),))
    return PlannedTurn(
        user,
        steps,
        '{path} says: "{content}".',
        {"path": first, "content": Ref(kr, ("content",))},
        ("content",),
        {"file": {"path": first}},
    )


def _read_two(inp: ScenarioInput) -> PlannedTurn | None:
    if len(inp.state["files"]) < 2:
        return None
    first, second = sorted(inp.rng.sample(_paths(inp), 2))
    ka, kb = inp.key("read_a"), inp.key("read_b")
    user = phrase(inp, ("Show me {a} and {b}.", "What do {a} and {b} say?"), a=first, b=second)
    steps = ((call(ka, "read_file", path=first), call(kb, "read_file", path=second)),)
    fields = {"a": first, "b": second, "ca": Ref(ka, ("content",)), "cb": Ref(kb, ("content",))}
    return PlannedTurn(user, steps, '{a}: "{ca}"; {b}: "{cb}".', fields, ("ca", "cb"))


def _move_follow_up(inp: ScenarioInput) -> PlannedTurn | None:
    path_ref = inp.context["file"]["path"]
    folder = _other_folder(inp, inp.value(path_ref))
    if folder is None:
        return None
    k = inp.key("move")
    user = phrase(inp, ("Now move it to {folder}.", "Please file it under {folder}."), folder=folder)
    return PlannedTurn(
        user,
        one_step(call(k, "move_file", path=path_ref, folder=folder)),
        "Moved it to {new_path}.",
        {"new_path": Ref(k, ("new_path",))},
        ("new_path",),
    )


def _delete_follow_up(inp: ScenarioInput) -> PlannedTurn:
    path_ref = inp.context["file"]["path"]
    user = phrase(inp, ("Actually, delete it.", "I don't need it any more, please delete it."))
    return PlannedTurn(
        user,
        one_step(call(inp.key("delete"), "delete_file", path=path_ref)),
        "Deleted {path}.",
        {"path": path_ref},
        ("path",),
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("read_file", ("read_file",), _read, provides=("file",)),
    Scenario("list_folder", ("list_files",), _list),
    Scenario("write_file", ("write_file",), _write, provides=("file",)),
    Scenario("move_file", ("move_file",), _move),
    Scenario("delete_file", ("delete_file",), _delete),
    Scenario("open_first", ("list_files", "read_file"), _open_first, provides=("file",)),
    Scenario("read_two", ("read_file",), _read_two),
    Scenario("move_it", ("move_file",), _move_follow_up, requires="file"),
    Scenario("delete_it", ("delete_file",), _delete_follow_up, requires="file"),
)
