"""Start/stop the local Prefect server and the process serving ``envace/full-pipeline``.

    python -m flows.server start [--port 4200]   # both in the background, waits until healthy
    python -m flows.server stop                  # stops both by the PIDs it recorded
    python -m flows.server status

State lives under ``<repo>/.prefect``: SQLite database (PREFECT_HOME), ``run/*.pid`` and ``run/*.log``.
Each process is started in its own session, so stopping signals exactly that process group.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from envace.utils.telemetry import TELEMETRY_OFF

logger = logging.getLogger(__name__)
DEPLOYMENT = "envace/full-pipeline"
PROCESSES = ("server", "serve")


def prefect_env(root: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TELEMETRY_OFF,
        PREFECT_HOME=str(root / ".prefect"),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def _run_dir(root: Path) -> Path:
    path = root / ".prefect" / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _spawn(name: str, cmd: list[str], root: Path, env: dict[str, str]) -> int:
    run = _run_dir(root)
    with open(run / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (run / f"{name}.pid").write_text(f"{proc.pid}\n")
    logger.info("started %s (pid %d): %s", name, proc.pid, " ".join(cmd))
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _wait(check, what: str, timeout: float, pid: int, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not _alive(pid):
            raise RuntimeError(f"{what}: the process exited early; see {log}")
        time.sleep(1.0)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f} s; see {log}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _deployment_ready(env: dict[str, str]) -> bool:
    cmd = [str(Path(sys.executable).parent / "prefect"), "deployment", "inspect", DEPLOYMENT]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 0


def start(root: Path, port: int = 4200, timeout: float = 180.0) -> dict[str, int]:
    """Start the server, wait for /api/health, start serving, wait for the deployment."""
    root = root.resolve()
    if any(read_pid(root, n) for n in PROCESSES):
        raise RuntimeError(f"already running (pid files in {_run_dir(root)}); `make stop` first")
    env = prefect_env(root, port)
    prefect = str(Path(sys.executable).parent / "prefect")
    server = _spawn("server", [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], root, env)
    try:
        _wait(lambda: _healthy(port), "prefect server", timeout, server, _run_dir(root) / "server.log")
        serve = _spawn("serve", [sys.executable, "-m", "flows.serve"], root, env)
        _wait(lambda: _deployment_ready(env), DEPLOYMENT, timeout, serve, _run_dir(root) / "serve.log")
    except BaseException:
        stop(root)
        raise
    return {"server": server, "serve": serve}


def read_pid(root: Path, name: str) -> int | None:
    path = _run_dir(root) / f"{name}.pid"
    if not path.exists():
        return None
    pid = int(path.read_text().strip() or 0)
    if pid and _alive(pid):
        return pid
    path.unlink()
    return None


def stop(root: Path, timeout: float = 30.0) -> None:
    """SIGTERM each recorded process group (serve first), SIGKILL what is left after ``timeout``."""
    for name in reversed(PROCESSES):
        pid = read_pid(root, name)
        if pid is None:
            continue
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        (_run_dir(root) / f"{name}.pid").unlink(missing_ok=True)
        logger.info("stopped %s (pid %d)", name, pid)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="python -m flows.server")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PREFECT_PORT", "4200")))
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    if args.action == "start":
        pids = start(args.root, args.port)
        logger.info("Prefect UI/API: http://127.0.0.1:%d  (pids %s)", args.port, pids)
    elif args.action == "stop":
        stop(args.root)
    else:
        for name in PROCESSES:
            logger.info("%s: %s", name, read_pid(args.root, name) or "not running")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
