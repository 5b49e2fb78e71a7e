"""The stage command lines, run for real in subprocesses: ``--help`` gives the stage's purpose and how
overrides work; a bad override, a missing input file or a stage failure is one stderr line and an exit
status (2 configuration/usage, 1 failed), without a traceback unless ENVACE_DEBUG=1; the failed stage's
MLflow run ends FAILED with the traceback in error.txt."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envace.config.load import ConfigError, load_params, write_params
from envace.stages import STAGES
from envace.stages.runner import EXAMPLES, _failure, one_line, stage_purpose

ROOT = Path(__file__).resolve().parents[3]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENVACE_", "MLFLOW_TRACKING_URI", "DVC_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def _stages(cwd: Path, *calls: tuple[str, ...], **env: str) -> list[subprocess.CompletedProcess]:
    """Run ``python -m envace.stages.<name> <args…>`` for each ``(name, *args)`` side by side in ``cwd``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", f"envace.stages.{name}", *args],
            cwd=cwd,
            env=_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, *args in calls
    ]
    done = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def _error_lines(stderr: str) -> list[str]:
    """The lines a failing stage writes for the user (logging lines carry a level name)."""
    return [line for line in stderr.splitlines() if ": error: " in line]


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """``--help`` of every stage (each imports its stage module)."""
    return dict(zip(STAGES, _stages(ROOT, *((name, "--help") for name in STAGES))))


@pytest.fixture(scope="module")
def smoke_params(tmp_path_factory) -> Path:
    return write_params(["profile=smoke"], root=tmp_path_factory.mktemp("params"), conf_dir=ROOT / "conf")


@pytest.fixture
def project(tmp_path: Path, smoke_params: Path) -> Path:
    """An empty working directory holding only the smoke profile's params.yaml (no stage outputs)."""
    shutil.copy(smoke_params, tmp_path / "params.yaml")
    return tmp_path


@pytest.mark.parametrize("name", STAGES)
def test_help_prints_the_purpose_and_how_overrides_work(helps, name):
    result = helps[name]
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    doc = ast.get_docstring(ast.parse((ROOT / "envace" / "stages" / f"{name}.py").read_text()))
    purpose = stage_purpose(doc)
    assert purpose.startswith(f"Stage ``{name}``") and purpose in text
    assert f"usage: python -m envace.stages.{name}" in text and "key=value" in text
    assert "params.yaml" in text and "make params ARGS=" in text and "ENVACE_DEBUG=1" in text
    for example in EXAMPLES[name]:
        assert f"python -m envace.stages.{name} {example}" in text
    assert "Traceback" not in result.stderr


def test_every_help_example_is_a_valid_override_of_params_yaml():
    for name in STAGES:
        for example in EXAMPLES[name]:
            overrides = [o.strip("'") for o in example.split()]
            load_params(ROOT / "params.yaml", overrides)  # ConfigError names a key that does not exist


def test_a_bad_override_is_one_line_and_exit_2(project):
    bad_key, bad_value, group, bare, option = _stages(
        project,
        ("prepare_data", "data.n_trian=3"),
        ("train", "train.steps=lots"),
        ("train", "profile=cpu"),
        ("train", "train.steps"),
        ("train", "--steps=3"),
    )
    for result in (bad_key, bad_value, group, bare, option):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [line] = _error_lines(bad_key.stderr)
    assert line.startswith("prepare_data: error: bad configuration:") and "n_trian" in line
    [line] = _error_lines(bad_value.stderr)
    assert "train.steps" in line and "lots" in line
    assert "make params ARGS='profile=cpu'" in _error_lines(group.stderr)[0]
    assert "key=value" in _error_lines(bare.stderr)[0]
    assert "unrecognized arguments: --steps=3" in option.stderr
    assert not (project / "metrics").exists() and not (project / "mlflow.db").exists()  # nothing ran


NO_CM2 = ("data.source=cm2", "paths.raw_cm2=no_such_dir")  # prepare_data then fails on its first read


def test_a_missing_input_is_one_line_exit_1_and_a_failed_mlflow_run(project):
    from mlflow.tracking import MlflowClient

    from envace.tracking.store import runs_table

    [result] = _stages(project, ("prepare_data", *NO_CM2))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = _error_lines(result.stderr)
    assert line.startswith("prepare_data: error: data.source=cm2 but no_such_dir holds no *.json/*.jsonl")
    uri = f"sqlite:///{project / 'mlflow.db'}"
    runs = runs_table("envace", tracking_uri=uri, stage="prepare_data")
    assert list(runs["status"]) == ["FAILED"]
    client = MlflowClient(tracking_uri=uri)
    failed = client.get_run(runs.iloc[0]["run_id"])
    assert failed.data.tags["error.type"] == "FileNotFoundError"
    assert "error.txt" in [a.path for a in client.list_artifacts(failed.info.run_id)]


def test_envace_debug_adds_the_traceback(project):
    (quiet,) = _stages(project, ("prepare_data", *NO_CM2, "tracking.backend=none"))
    (loud,) = _stages(project, ("prepare_data", *NO_CM2, "tracking.backend=none"), ENVACE_DEBUG="1")
    assert quiet.returncode == loud.returncode == 1
    assert "Traceback" not in quiet.stderr
    assert "Traceback (most recent call last)" in loud.stderr and "FileNotFoundError" in loud.stderr
    assert _error_lines(loud.stderr) == _error_lines(quiet.stderr)  # the same one line closes both


def test_a_missing_file_is_named_with_its_path_and_other_errors_keep_their_type(tmp_path):
    try:
        (tmp_path / "data" / "train.jsonl").read_text()
    except FileNotFoundError as exc:
        assert one_line(exc).startswith(f"missing input {tmp_path / 'data' / 'train.jsonl'} (No such file")
    error = ValueError("first line\n   second line")
    error.add_note("MLflow run abc (FAILED) holds the traceback in error.txt")
    assert one_line(error) == "first line; second line"
    assert _failure("train", error) == 1 and _failure("train", ConfigError("bad\nkey")) == 2
