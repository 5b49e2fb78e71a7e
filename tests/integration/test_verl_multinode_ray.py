"""The multi-node submit line against a real local Ray head (CPU, 127.0.0.1).

``ray job submit`` needs Ray's job server (``ray[default]``'s dashboard), which the CPU install leaves out; the
test therefore starts the job's entry point itself with the environment Ray's job supervisor gives it
(``RAY_JOB_CONFIG_JSON_ENV_VAR`` holding the Job's runtime env, its env vars set, ``RAY_ADDRESS``), and the
entry point runs verl's own ``run_ppo`` up to a stand-in TaskRunner (tests/fixtures/verl/main_ppo_ray_init.py).
That is where Ray merges the Job's runtime env with the one ``main_ppo`` passes to ``ray.init``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

from envace.config.load import compose
from envace.engines.verl.launcher import multinode_commands, plan_launch

ENTRY = Path(__file__).resolve().parents[1] / "fixtures" / "verl" / "main_ppo_ray_init.py"
RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 90
JOB_TIMEOUT_S = 180


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture
def ray_head() -> Iterator[str]:
    """A Ray head on 127.0.0.1 (4 logical CPUs, no dashboard), started with ``--block`` and stopped by its PID
    (SIGTERM: it stops the processes it started); yields its GCS address."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must stay under 107 chars
    gcs, node, objects, agent, agent_grpc, metrics, env_agent = free_ports(7)
    command = [
        str(RAY), "start", "--head", "--block", "--num-cpus=4", "--num-gpus=0",
        "--node-ip-address=127.0.0.1", f"--port={gcs}", "--include-dashboard=false",
        f"--node-manager-port={node}", f"--object-manager-port={objects}",
        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={env_agent}",
        f"--temp-dir={temp}", "--disable-usage-stats",
    ]  # fmt: skip
    head = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started, lines = threading.Event(), []

    def read() -> None:  # keep draining the pipe so the head never blocks on it
        for line in head.stdout:
            lines.append(line)
            if "Ray runtime started" in line:
                started.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not started.wait(START_TIMEOUT_S):
            pytest.fail(f"ray start did not come up in {START_TIMEOUT_S} s:\n{''.join(lines)[-3000:]}")
        yield f"127.0.0.1:{gcs}"
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def submit_parts(submit: str) -> tuple[dict, list[str]]:
    """(the Job's runtime env, the entry point argv) of a generated ``ray job submit … -- <entry>`` line."""
    argv = shlex.split(submit)
    cut = argv.index("--")
    options, entry = argv[:cut], argv[cut + 1 :]
    runtime_env: dict = {}
    for option in options:
        if option.startswith("--runtime-env-json="):
            runtime_env = json.loads(option.split("=", 1)[1])
    return runtime_env, entry


def job_environment(runtime_env: dict, address: str) -> dict[str, str]:
    """What Ray's job supervisor gives an entry point: its own environment with the Job's env vars set, the Job's
    config (runtime env) in ``RAY_JOB_CONFIG_JSON_ENV_VAR`` and the cluster address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(runtime_env.get("env_vars") or {})
    env[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps({"runtime_env": runtime_env, "metadata": {}})
    env["RAY_ADDRESS"] = address
    env["PYTHONUNBUFFERED"] = "1"
    return env


def test_multinode_runtime_env_accepted_by_ray(ray_head: str, tmp_path: Path) -> None:
    cfg = OmegaConf.to_container(
        compose(["profile=smoke", "model.kind=path", f"model.path={tmp_path / 'model'}"]), resolve=True
    )
    plan = plan_launch(cfg, output_dir=tmp_path / "run", dry_run=True, tracking_uri=f"sqlite:///{tmp_path}/m.db")
    runtime_env, entry = submit_parts(multinode_commands(plan.overrides, head="127.0.0.1")["submit"])
    assert entry[:3] == ["python", "-m", "verl.trainer.main_ppo"] and entry[3:] == plan.overrides
    report = tmp_path / "worker_env.json"
    started = time.monotonic()
    job = subprocess.run(
        [sys.executable, str(ENTRY), str(report), *entry[3:]],
        env=job_environment(runtime_env, ray_head),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    output = (job.stdout + job.stderr)[-4000:]
    assert "Failed to merge the Job's runtime env" not in output, output
    assert job.returncode == 0, output
    seen = json.loads(report.read_text())
    missing = {k: v for k, v in plan.env_vars.items() if seen.get(k) != v}
    assert not missing, f"env vars that did not reach the job's actors: {missing}"
    assert time.monotonic() - started < JOB_TIMEOUT_S
