"""PID discipline of ``flows.server`` (``make serve`` / ``make stop``): a PID file counts only while it names
the process it was written for. The real server and deployment: tests/e2e/test_prefect_deployment.py."""

from __future__ import annotations

import subprocess

import pytest

from flows import server


@pytest.fixture
def other_program():
    """A live process that is neither the Prefect server nor the serving process (as when a PID is
    reused after a crash left a PID file behind)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_stop_never_signals_a_process_its_pid_file_does_not_name(tmp_path, other_program):
    files = [tmp_path / ".prefect" / "server.pid", tmp_path / ".prefect" / "run" / "serve.pid"]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{other_program.pid}\n")
    assert server.read_pid(tmp_path, "serve") is None
    server.stop(tmp_path, timeout=1)
    assert other_program.poll() is None, "stop signalled a process that is not the server or the serving process"
    assert not any(path.exists() for path in files), "stale PID files are removed"
