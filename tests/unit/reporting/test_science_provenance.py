"""The science report's provenance rows, from a real DVC repository: a part is current while its code and
params equal what dvc.lock recorded for its run, stale after either changes, and absent until it has run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.reporting.science_provenance import CURRENT, STALE, part_states, provenance_summary, provenance_table

DVC = str(Path(sys.executable).with_name("dvc"))

DVC_YAML = """\
stages:
  part:
    cmd: python make_part.py
    deps:
      - envace/code.py
      - data/input.txt
    params:
      - knob
    outs:
      - m:
          cache: false
  never_run:
    cmd: echo never
    deps:
      - envace/code.py
    outs:
      - never.txt
  aggregate:
    cmd: echo aggregate
    deps:
      - m
"""


# the part's command: writes its metrics directory with a details file naming the producing commit
MAKE_PART = """\
import json, pathlib
out = pathlib.Path("m")
out.mkdir(exist_ok=True)
(out / "x.details.json").write_text(json.dumps({"produced_by": {"commit": "abcdef1234", "code_dirty": False}}))
"""


def _run(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env.update({"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` = this one
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _run(["git", "init", "-q"], tmp_path)
    _run([DVC, "init", "-q"], tmp_path)
    (tmp_path / "envace").mkdir()
    (tmp_path / "envace" / "code.py").write_text("X = 1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "input.txt").write_text("rows\n")
    (tmp_path / "params.yaml").write_text("knob: 1\n")
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "make_part.py").write_text(MAKE_PART)
    _run([DVC, "repro", "-q", "part"], tmp_path)
    return tmp_path


def test_a_part_is_current_until_its_code_params_or_data_inputs_change(repo: Path) -> None:
    (state,) = part_states(repo, "dvc.yaml")
    assert (state.stage, state.state, state.commits) == ("dvc.yaml:part", CURRENT, ("abcdef1",))
    assert (state.compared, state.absent) == (1, ())
    assert provenance_table([state]).loc[0, "data inputs"] == "1 compared"
    (repo / "data" / "input.txt").write_text("other rows\n")  # a data dep: another run's by-product
    (state,) = part_states(repo, "dvc.yaml")
    assert state.state == STALE and "data/input.txt" in state.detail
    (repo / "data" / "input.txt").write_text("rows\n")
    assert part_states(repo, "dvc.yaml")[0].state == CURRENT
    (repo / "envace" / "code.py").write_text("X = 2\n")
    (state,) = part_states(repo, "dvc.yaml")
    assert state.state == STALE and "envace/code.py" in state.detail
    (repo / "envace" / "code.py").write_text("X = 1\n")
    (repo / "params.yaml").write_text("knob: 2\n")
    (state,) = part_states(repo, "dvc.yaml")
    assert state.state == STALE and "params.yaml" in state.detail
    summary = provenance_summary([state])
    assert summary["stale"] == ["dvc.yaml:part"] and summary["current"] == 0 and summary["commits"] == ["abcdef1"]
    table = provenance_table([state])
    assert table.loc[0, "part (stage)"] == "part" and table.loc[0, "state"] == "**STALE**"


def test_outside_a_dvc_repository_the_table_says_so(tmp_path: Path) -> None:
    (state,) = part_states(tmp_path, "dvc.yaml")
    assert state.state == "unknown" and "DVC could not open" in state.detail
    assert json.dumps(provenance_summary([state]))  # serialisable for science.json


def test_outputs_without_a_lock_record_are_stale(repo: Path) -> None:
    """Outputs present but no dvc.lock entry (a part still running, or files copied from elsewhere)."""
    (repo / "dvc.lock").unlink()
    (state,) = part_states(repo, "dvc.yaml")
    assert state.state == STALE and "no record in dvc.lock" in state.detail


def test_a_data_input_absent_here_is_named_not_compared(repo: Path) -> None:
    """A fresh clone lacks the by-products earlier parts wrote: the part stays current on code and params,
    and the table says which inputs it could not compare."""
    (repo / "data" / "input.txt").unlink()
    (state,) = part_states(repo, "dvc.yaml")
    assert state.state == CURRENT and "present data inputs" in state.detail
    assert (state.compared, state.absent) == (0, ("data/input.txt",))
    assert provenance_table([state]).loc[0, "data inputs"] == "0 compared; not here, not compared: data/input.txt"
    assert provenance_summary([state])["inputs_not_here"] == {"dvc.yaml:part": ["data/input.txt"]}


def test_parts_of_several_dvc_files_are_listed_file_by_file(repo: Path) -> None:
    """The organism's further-seed test-time grid lives in a dvc.yaml of its own; its parts join the table."""
    (repo / "sub").mkdir()
    (repo / "sub" / "dvc.yaml").write_text(
        "stages:\n  grid:\n    wdir: ..\n    cmd: python make_grid.py\n    deps:\n      - m\n"
        "    outs:\n      - g:\n          cache: false\n"
    )
    (repo / "make_grid.py").write_text(MAKE_PART.replace('pathlib.Path("m")', 'pathlib.Path("g")'))
    _run([DVC, "repro", "-q", "--single-item", "sub/dvc.yaml:grid"], repo)
    states = part_states(repo, ("dvc.yaml", "sub/dvc.yaml"))
    assert [s.stage for s in states] == ["dvc.yaml:part", "sub/dvc.yaml:grid"]
    grid = states[1]
    assert (grid.state, grid.compared, grid.absent) == (CURRENT, 1, ())  # its input m: the other file's output
    assert part_states(repo, "dvc.yaml")[0].stage == "dvc.yaml:part"


def _commit_all(repo: Path) -> str:
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-q", "-m", "x"], repo)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def test_code_outside_the_declared_deps_changed_since_the_producing_commit_is_named(repo: Path) -> None:
    """DVC compares only the files a stage lists; a module the part can import but does not list, changed
    since the commit it ran at, is named (the part stays current on DVC's check)."""
    (repo / "envace" / "helper.py").write_text("Y = 1\n")
    head = _commit_all(repo)
    details = repo / "m" / "x.details.json"
    details.write_text(json.dumps({"produced_by": {"commit": head, "code_dirty": False}}))
    (state,) = part_states(repo, "dvc.yaml")
    assert (state.state, state.undeclared) == (CURRENT, ())  # nothing changed since it ran
    assert provenance_table([state]).loc[0, "undeclared code changed since"] == "none"
    (repo / "envace" / "helper.py").write_text("Y = 2\n")  # not a dep of the part (a script: all of envace/)
    (state,) = part_states(repo, "dvc.yaml")
    assert (state.state, state.undeclared) == (CURRENT, ("envace/helper.py",))
    assert provenance_table([state]).loc[0, "undeclared code changed since"] == "1: helper.py"
    assert provenance_summary([state])["undeclared_changes"] == {"dvc.yaml:part": ["envace/helper.py"]}
    (repo / "envace" / "code.py").write_text("X = 2\n")  # a declared dep: DVC's check, not this column
    (state,) = part_states(repo, "dvc.yaml")
    assert (state.state, state.undeclared) == (STALE, ("envace/helper.py",))


def test_a_producing_commit_git_does_not_know_leaves_the_undeclared_check_unknown(repo: Path) -> None:
    _commit_all(repo)  # the fixture's part records commit abcdef1234, which this history lacks
    (state,) = part_states(repo, "dvc.yaml")
    assert state.state == CURRENT and state.undeclared is None
    assert provenance_table([state]).loc[0, "undeclared code changed since"].startswith("unknown")
    assert provenance_summary([state])["undeclared_unknown"] == ["dvc.yaml:part"]


def test_the_importable_files_of_a_module_command_are_its_import_closure(tmp_path: Path) -> None:
    from envace.reporting.science_provenance import importable_files

    package = tmp_path / "envace"
    (package / "stages").mkdir(parents=True)
    for name, text in {
        "__init__.py": "",
        "stages/__init__.py": "",
        "stages/run.py": "from envace.stages import lib\n\ndef later():\n    import envace.late\n",
        "stages/lib.py": "X = 1\n",
        "late.py": "",
        "unused.py": "import envace.stages.run\n",
    }.items():
        (package / name).write_text(text)
    assert importable_files(tmp_path, "python -m envace.stages.run --seed 1") == {
        "envace/__init__.py",
        "envace/stages/__init__.py",
        "envace/stages/run.py",
        "envace/stages/lib.py",
        "envace/late.py",  # imported inside a function: counted (the safe side)
    }
    assert len(importable_files(tmp_path, "python make_part.py")) == 6  # a script: the whole package
    from envace.reporting.science_provenance import read_package

    read = read_package(package)  # read once, asked about many commands: the same answers
    assert importable_files(tmp_path, "python -m envace.stages.lib", read) == {
        "envace/__init__.py",
        "envace/stages/__init__.py",
        "envace/stages/lib.py",
    }
    assert importable_files(tmp_path, "python make_part.py", read) == importable_files(tmp_path, "python x.py")


def test_a_file_is_covered_by_itself_or_a_folder_holding_it_not_by_a_name_it_starts_with() -> None:
    from envace.reporting.science_provenance import uncovered

    files = ["envace/utils/io.py", "envace/utils_extra.py", "envace/core/a.py", "envace/stages/x.py"]
    assert uncovered(files, ["envace/utils", "envace/core/", "envace/stages/x.py"]) == {"envace/utils_extra.py"}
    assert uncovered(files, []) == set(files)
