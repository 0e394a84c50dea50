"""``ray job submit -- python -m ray_layout.tune ...`` against a local ``ray start --head``, as
a user runs it on a real cluster: the job joins the head (RAY_ADDRESS), ``ray job stop`` leaves
nothing running, and the same job submitted again resumes from the store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

BIN = Path(sys.executable).parent
HEAD_GPUS = 4
# each poll is a `ray` CLI process (about a CPU-second): polled often, it takes the cores the
# job's ranks need
POLL_S = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """A head node with a dashboard (the job server) and 4 fake GPUs; stopped by SIGTERM to its
    ``ray start --block`` process, never with ``ray stop``.  Its own ``--temp-dir``: Ray gives
    a job the address of the newest cluster started on the host (from the shared /tmp/ray), so
    with another suite's cluster started after this one a job joined that cluster instead."""
    if os.environ.get("RAY_LAYOUT_SKIP_RAY") == "1":
        pytest.skip("Ray disabled")
    logs = tmp_path_factory.mktemp("head")
    env = os.environ | {
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("RAY_ADDRESS", None)
    dashboard = free_port()
    temp = Path(tempfile.mkdtemp(prefix="rl-head-", dir="/tmp"))  # short: socket paths
    command = [str(BIN / "ray"), "start", "--head", "--port", str(free_port()),
               "--temp-dir", str(temp),
               "--dashboard-port", str(dashboard), "--include-dashboard", "true",
               "--num-cpus", "4", "--num-gpus", str(HEAD_GPUS),
               "--object-store-memory", str(100 * 2**20), "--block"]  # fmt: skip
    # the session's simulated cluster holds Ray's default agent ports: the head's job agent
    # must not collide with it, or jobs are refused with "No available agent"
    for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                 "--runtime-env-agent-port", "--metrics-export-port"):  # fmt: skip
        command[-1:-1] = [flag, str(free_port())]
    with open(logs / "head.log", "w") as log:
        head = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 90
        while ray_cli("job", "list", "--address", address, env=env).returncode != 0:
            assert head.poll() is None, (logs / "head.log").read_text()
            assert time.monotonic() < deadline, "the job server did not come up"
            time.sleep(1.0)
        yield address, env
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def submit(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """``ray job submit``, again while the head's job agent is still starting (the job server
    answers before it: "No available agent to submit job")."""
    deadline = time.monotonic() + 90
    while True:
        done = ray_cli("job", "submit", *args, env=env, timeout=timeout)
        if "No available agent" not in done.stdout + done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(POLL_S)


def entrypoint(tmp_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "ray_layout.tune", str(ROOT / "configs/handbook_7b_a1b.yaml"),
        "--pp", "2", "--global-batch-size", "32", "--profile-iters", "6", "--ab-top", "2",
        "--ab-warmup", "2", "--ab-batch", "3", "--ab-looks", "2,4",
        "--hardware", str(ROOT / "cluster_configs/hardware/h200_emulated.yaml"),
        "--store", str(tmp_path / "store"), "--study", "job", "--log-dir", str(tmp_path / "logs"),
        "--report-dir", str(tmp_path / "report"), "--timeout-s", "240", "--heartbeat-s", "120",
    ]  # fmt: skip


def job_status(address: str, job: str, env: dict[str, str]) -> str:
    shown = ray_cli("job", "status", "--address", address, job, env=env).stdout.lower()
    for status in ("succeeded", "failed", "stopped", "running", "pending"):
        if status in shown:
            return status.upper()
    return "UNKNOWN"


def live_groups(address: str, env: dict[str, str]) -> list[dict]:
    listed = ray_cli("list", "placement-groups", "--address", address, "--format", "json",
                     env=env)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    return [g for g in json.loads(listed.stdout) if g["state"] != "REMOVED"]


def wait_for_job(address: str, job: str, env: dict[str, str], timeout_s: float) -> str:
    """The job's logs once it has succeeded; on failure or past ``timeout_s`` the assertion
    shows the tail of its logs (the phase it was in) and how long it ran."""
    started = time.monotonic()
    while (status := job_status(address, job, env)) in ("PENDING", "RUNNING", "UNKNOWN"):
        if time.monotonic() - started > timeout_s:
            break
        time.sleep(POLL_S)
    logs = ray_cli("job", "logs", "--address", address, job, env=env).stdout
    ran = time.monotonic() - started
    assert status == "SUCCEEDED", f"job {job} {status} after {ran:.0f} s:\n{logs[-4000:]}"
    return logs


def test_submit_stop_and_resubmit_a_tune_job(ray_head, tmp_path):
    address, env = ray_head
    runtime = json.dumps({"env_vars": {"RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}})
    where = ["--address", address, "--runtime-env-json", runtime]

    first = submit(*where, "--submission-id", "tune-1", "--no-wait", "--", *entrypoint(tmp_path),
                   env=env)  # fmt: skip
    assert first.returncode == 0, first.stderr
    deadline = time.monotonic() + 480
    while "A/B:" not in (logs := ray_cli("job", "logs", "--address", address, "tune-1",
                                         env=env).stdout):  # fmt: skip
        assert job_status(address, "tune-1", env) in ("PENDING", "RUNNING"), logs
        assert time.monotonic() < deadline, logs
        time.sleep(POLL_S)
    assert f"joined {address.split('//')[1].split(':')[0]}" in logs or "cluster: joined" in logs
    assert ray_cli("job", "stop", "--address", address, "tune-1", env=env).returncode == 0
    deadline = time.monotonic() + 60
    while True:
        status, groups = job_status(address, "tune-1", env), live_groups(address, env)
        if status == "STOPPED" and not groups:
            break
        shown = ray_cli("job", "status", "--address", address, "tune-1", env=env).stdout
        assert time.monotonic() < deadline, f"job {status} ({shown}), groups left: {groups}"
        time.sleep(1.0)

    second = submit(*where, "--submission-id", "tune-2", "--no-wait", "--",
                    *entrypoint(tmp_path), env=env)  # fmt: skip
    assert second.returncode == 0, second.stderr
    logs = wait_for_job(address, "tune-2", env, timeout_s=900)
    assert logs.count("(from the store)") >= 2  # the profiling runs were not redone
    assert "Paste: --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout" in logs
    assert (tmp_path / "report" / "report.html").is_file()
    assert not live_groups(address, env)
