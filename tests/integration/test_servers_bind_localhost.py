"""Every server the project starts listens on 127.0.0.1 only (issue 15, fault drill 4).

Each server is started the way the project starts it (``make serve-model``, ``make serve``, ``make ui``);
then the listening sockets of the real processes (the started process and all its descendants) are read
with psutil and every one must be on 127.0.0.1. A static check scans the repository's code, config and
docs for binds on all interfaces. The model server is fast (tiny model); the Prefect and MLflow servers
take 10-60 s each and are marked ``e2e``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.openai_server import ChatCompletionServer
from envace.utils.telemetry import TELEMETRY_OFF

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
LOCAL = "127.0.0.1"
# local state a fresh clone would not have (the copies below must not inherit running servers' pid files)
_NOT_COPIED = ("mlflow.db", ".prefect/", ".envace/", "mlartifacts/", "dvc.lock", "metrics/", "plots/", "reports/")

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    kind: str  # tcp | udp
    ip: str
    port: int


def process_tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants (those still alive)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def listeners(processes: list[psutil.Process]) -> list[Listener]:
    """Listening TCP sockets and bound, unconnected UDP sockets of ``processes``."""
    found = []
    for proc in processes:
        try:
            conns, name = proc.net_connections(kind="inet"), proc.name()
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            tcp_listen = c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN
            udp_bound = c.type == socket.SOCK_DGRAM and c.laddr and not c.raddr
            if tcp_listen or udp_bound:
                found.append(Listener(proc.pid, name, "tcp" if tcp_listen else "udp", c.laddr.ip, c.laddr.port))
    return found


def exposed(found: list[Listener]) -> list[Listener]:
    """The listeners not bound to 127.0.0.1."""
    return [s for s in found if s.ip != LOCAL]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCAL, 0))
        return sock.getsockname()[1]


def wait_until(check, what: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what}: the process exited {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(0.2)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def make_env() -> dict[str, str]:
    """The environment a user's shell would have: no pipeline state inherited from this test run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ENVACE_", "MLFLOW_TRACKING_URI", "DVC_", "PREFECT_API_URL", "PREFECT_HOME"))
    }
    env.update(TELEMETRY_OFF)
    return env


def copy_project(dest: Path) -> Path:
    """The project's files (tracked plus untracked-but-not-ignored) without local service state."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    for rel in (f for f in out.stdout.decode().split("\0") if f and not f.startswith(_NOT_COPIED)):
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    return dest


def stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the process group we started (its own session); SIGKILL, by PID, whatever of its process
    tree is still there after ``timeout``."""
    if proc.poll() is not None:
        return
    tree = process_tree(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=10)
    proc.wait(10)


# ---- the check itself can fail -----------------------------------------------------------------------


def test_the_socket_check_flags_a_listener_off_127_0_0_1() -> None:
    """127.0.0.2 is loopback too (nothing is exposed) but not 127.0.0.1: the check must flag it."""
    with socket.socket() as other, socket.socket() as ours:
        other.bind(("127.0.0.2", 0))
        other.listen()
        ours.bind((LOCAL, 0))
        ours.listen()
        found = listeners(process_tree(os.getpid()))
        ports = {s.port: s.ip for s in found}
        assert ports[other.getsockname()[1]] == "127.0.0.2" and ports[ours.getsockname()[1]] == LOCAL
        assert [s.port for s in exposed(found)] == [other.getsockname()[1]]


# ---- our model server -------------------------------------------------------------------------------


class EchoBackend:
    name = "echo"

    def generate(self, requests: list[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(str(r.messages[-1]["content"])) for r in requests]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_model_server_in_process_binds_127_0_0_1(host: str) -> None:
    with ChatCompletionServer(EchoBackend(), "echo", host=host) as server:
        ours = [s for s in listeners(process_tree(os.getpid())) if s.port == server.port]
        assert [(s.kind, s.ip) for s in ours] == [("tcp", LOCAL)]
        assert http_ok(f"http://{LOCAL}:{server.port}/health")


@needs_make
def test_make_serve_model_binds_127_0_0_1_only(tmp_path: Path) -> None:
    """``make serve-model`` with the tiny model: the server process and its children listen on 127.0.0.1."""
    ready, pid_file = tmp_path / "ready.json", tmp_path / "srv.pid"
    cmd = ["make", "-s", "serve-model", f"VENV={VENV}", "SERVE_MODEL=tiny", "MODEL_PORT=0",
           f"ARGS=--ready-file {ready} --pid-file {pid_file}"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=make_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_until(ready.exists, "make serve-model", 120, proc)
        info = json.loads(ready.read_text())
        tree = process_tree(proc.pid)
        assert info["pid"] in [p.pid for p in tree] and pid_file.read_text().strip() == str(info["pid"])
        found = listeners(tree)
        assert info["port"] in [s.port for s in found], found
        assert exposed(found) == [], f"listening off 127.0.0.1: {exposed(found)}"
        assert http_ok(f"http://{LOCAL}:{info['port']}/health")
        os.kill(info["pid"], signal.SIGTERM)  # how a user stops it: by the PID in the pid file
        assert proc.wait(30) == 0
        assert not pid_file.exists()
    finally:
        stop_group(proc)


# ---- the Prefect server and the deployment-serving process (make serve / make stop) -----------------


@needs_make
@pytest.mark.e2e
def test_make_serve_prefect_binds_127_0_0_1_only(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "envace")
    port = free_port()
    args = [f"VENV={VENV}", f"PREFECT_PORT={port}"]
    try:
        subprocess.run(
            ["make", "-s", "serve", *args],
            cwd=project,
            env=make_env(),
            check=True,
            timeout=400,
            capture_output=True,
            text=True,
        )
        run_dir = project / ".prefect" / "run"
        pids = {name: int((run_dir / f"{name}.pid").read_text()) for name in ("server", "serve")}
        tree = [p for pid in pids.values() for p in process_tree(pid)]
        found = listeners(tree)
        assert port in [s.port for s in found], found
        assert exposed(found) == [], f"listening off 127.0.0.1: {exposed(found)}"
    finally:
        subprocess.run(
            ["make", "-s", "stop", *args], cwd=project, env=make_env(), timeout=120, capture_output=True, check=False
        )  # the assertion below says whether it worked
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids.values()
    )


# ---- the MLflow UI (make ui) --------------------------------------------------------------------------


@needs_make
@pytest.mark.e2e
def test_make_ui_mlflow_binds_127_0_0_1_only(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "envace")
    port = free_port()
    proc = subprocess.Popen(
        ["make", "-s", "ui", f"VENV={VENV}", f"MLFLOW_PORT={port}"],
        cwd=project,
        env=make_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(lambda: http_ok(f"http://{LOCAL}:{port}/health"), "make ui", 180, proc)
        found = listeners(process_tree(proc.pid))
        assert port in [s.port for s in found], found
        assert exposed(found) == [], f"listening off 127.0.0.1: {exposed(found)}"
    finally:
        stop_group(proc)


# ---- nothing in the repository binds all interfaces -----------------------------------------------

SCANNED_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".md", ".j2", ".service"}
SCANNED_NAMES = {"Makefile", "Dockerfile", "Procfile"}
ALL_INTERFACES = re.compile(
    r"\b0\.0\.0\.0\b"  # IPv4 any
    r"|INADDR_ANY|IN6ADDR_ANY"
    r"""|["']::["']|--host[= ]::(?:\s|$)"""  # IPv6 any
    r"""|\bhost\s*[=:]\s*["']\s*["']"""  # an empty host binds every interface
    r"""|\.bind\(\(\s*["']\s*["']"""
)
# lines that name an all-interfaces address on purpose, to show that it is refused
ALLOWED_LINES = {
    ("tests/unit/inference/test_openai_server.py", 'ChatCompletionServer(VerdictBackend(), "m", host="0.0.0.0")'),
}


def binds_all_interfaces(text: str) -> bool:
    return ALL_INTERFACES.search(text) is not None


def test_the_static_pattern_catches_binds_on_all_interfaces() -> None:
    any4 = ".".join("0" * 4)
    for line in [
        f"--host {any4} --port 5000",
        f'uvicorn.run(app, host="{any4}")',
        'host: ""',
        "sock.bind(('', 8000))",
        "--host :: --port 1",
    ]:
        assert binds_all_interfaces(line), line
    for line in ["--host 127.0.0.1", "version 10.0.0.1", 'host="localhost"', "a::b"]:
        assert not binds_all_interfaces(line), line


def test_no_code_config_or_docs_binds_all_interfaces() -> None:
    """Scans tracked and untracked-but-not-ignored files (this file holds the patterns: not scanned)."""
    this_file = Path(__file__).resolve().relative_to(REPO).as_posix()
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    files = [
        f
        for f in out.stdout.decode().split("\0")
        if f and f != this_file and (Path(f).suffix in SCANNED_SUFFIXES or Path(f).name in SCANNED_NAMES)
    ]
    assert len(files) > 50  # the scan really saw the repository
    hits = []
    for rel in files:
        path = REPO / rel
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if binds_all_interfaces(line) and (rel, line.strip()) not in ALLOWED_LINES:
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert hits == [], "binds on all interfaces (use 127.0.0.1, or the cluster address for multi-node):\n" + "\n".join(
        hits
    )
