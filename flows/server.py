"""Start/stop the local Prefect server and the process serving ``envace/full-pipeline``.

    python -m flows.server start [--port 4200]   # both in the background, waits until the deployment is served
    python -m flows.server stop                  # stops both, waits until they have exited
    python -m flows.server status

The server is Prefect's own background server on 127.0.0.1: ``prefect server start --background`` (its
PID in ``<repo>/.prefect/server.pid``), ``prefect server status --wait`` until it answers, ``prefect server
stop``. The serving process (``python -m flows.serve``) is ours: started in its own session, its PID in
``.prefect/run/serve.pid`` and its output in ``.prefect/run/serve.log``, stopped by signalling that
process group. A PID file counts only while its process is alive and is the one it names (its command
line; a reused PID is another process, never signalled); ``stop`` waits for each process to exit and
kills what is left after ``timeout``. State lives under ``<repo>/.prefect`` (PREFECT_HOME: the SQLite
database too).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from prefect.cli._server_utils import SERVER_PID_FILE_NAME

from envace.utils.telemetry import TELEMETRY_OFF

logger = logging.getLogger(__name__)
DEPLOYMENT = "envace/full-pipeline"
HOST = "127.0.0.1"
# what the command line of each process holds: a PID file naming another process is stale
COMMAND_MARKS = {"server": "prefect.server.api.server", "serve": "flows.serve"}


def prefect_env(root: Path, port: int = 4200) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TELEMETRY_OFF,
        PREFECT_HOME=str(root / ".prefect"),
        PREFECT_API_URL=f"http://{HOST}:{port}/api",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def prefect(args: list[str], root: Path, env: dict[str, str], timeout: float = 60.0) -> str:
    """Run ``prefect <args>`` of this venv in ``root``; its output, or a RuntimeError holding it."""
    cmd = [str(Path(sys.executable).parent / "prefect"), *args]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"`prefect {' '.join(args)}` failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def pid_file(root: Path, name: str) -> Path:
    """The server's PID file is the one Prefect writes; ``serve``'s is ours."""
    run = root / ".prefect" / "run"
    run.mkdir(parents=True, exist_ok=True)
    return run.parent / SERVER_PID_FILE_NAME if name == "server" else run / f"{name}.pid"


def read_pid(root: Path, name: str) -> int | None:
    """The PID of ``name`` (server | serve) while it runs; a stale PID file is removed."""
    path = pid_file(root, name)
    if not path.exists():
        return None
    pid = int(path.read_text().strip() or 0)
    try:
        if _running(pid) and COMMAND_MARKS[name] in " ".join(psutil.Process(pid).cmdline()):
            return pid
    except psutil.Error:
        pass
    path.unlink()
    return None


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is gone; PID 0, an empty file, is none)."""
    try:
        return pid > 0 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _spawn_serve(root: Path, env: dict[str, str]) -> int:
    with open(pid_file(root, "serve").with_suffix(".log"), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.serve"],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file(root, "serve").write_text(f"{proc.pid}\n")
    logger.info("serving %s (pid %d, log %s)", DEPLOYMENT, proc.pid, log.name)
    return proc.pid


def _await_deployment(env: dict[str, str], timeout: float, pid: int, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cmd = [str(Path(sys.executable).parent / "prefect"), "deployment", "inspect", DEPLOYMENT]
        if subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 0:
            return
        if not _running(pid):
            raise RuntimeError(f"{DEPLOYMENT}: the serving process exited early; see {log}")
        time.sleep(1.0)
    raise TimeoutError(f"{DEPLOYMENT}: not served after {timeout:.0f} s; see {log}")


def start(root: Path, port: int = 4200, timeout: float = 180.0) -> dict[str, int]:
    """Start the server, wait until it answers, start serving, wait for the deployment."""
    root = root.resolve()
    running = {name: read_pid(root, name) for name in COMMAND_MARKS}
    if any(running.values()):
        raise RuntimeError(f"already running ({running}, PID files under {root / '.prefect'}); `make stop` first")
    env = prefect_env(root, port)
    try:
        prefect(["server", "start", "--background", "--host", HOST, "--port", str(port)], root, env)
        prefect(["server", "status", "--wait", "--timeout", str(int(timeout))], root, env, timeout + 30)
        serve = _spawn_serve(root, env)
        _await_deployment(env, timeout, serve, pid_file(root, "serve").with_suffix(".log"))
    except BaseException:
        stop(root)
        raise
    return {"server": read_pid(root, "server"), "serve": serve}


def stop(root: Path, timeout: float = 30.0) -> None:
    """Stop serving (SIGTERM to its process group), then ``prefect server stop``; wait for each to exit,
    SIGKILL what is left after ``timeout``."""
    root = root.resolve()
    serve = read_pid(root, "serve")
    if serve is not None:
        os.killpg(serve, signal.SIGTERM)
        _await_exit(serve, timeout, lambda: os.killpg(serve, signal.SIGKILL))
        pid_file(root, "serve").unlink(missing_ok=True)
    server = read_pid(root, "server")
    if server is not None:
        prefect(["server", "stop"], root, prefect_env(root))
        _await_exit(server, timeout, lambda: os.kill(server, signal.SIGKILL))
    logger.info("stopped: serve %s, server %s", serve or "not running", server or "not running")


def _await_exit(pid: int, timeout: float, kill: Callable[[], None]) -> None:
    """Wait up to ``timeout`` for ``pid`` to exit; ``kill`` it when it has not."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    _, alive = psutil.wait_procs([proc], timeout=timeout)
    if alive:
        logger.warning("pid %d still running %.0f s after SIGTERM: killed", pid, timeout)
        kill()
        psutil.wait_procs(alive, timeout=5)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="python -m flows.server")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PREFECT_PORT", "4200")))
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    if args.action == "start":
        pids = start(args.root, args.port)
        logger.info("Prefect UI/API: http://%s:%d  (pids %s)", HOST, args.port, pids)
    elif args.action == "stop":
        stop(args.root)
    else:
        for name in COMMAND_MARKS:
            logger.info("%s: %s", name, read_pid(args.root, name) or "not running")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
