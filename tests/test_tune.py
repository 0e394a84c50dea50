"""``python -m ray_layout.tune`` (``ray_layout/tune.py``): the entry ``ray job submit`` runs,
started as a user starts it; its exit status is the tune command's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ray_layout.commands import tune
from tests.helpers.command_exits import UNWRITABLE, entry, with_unwritable_stdout
from tests.helpers.paths import ROOT


def run_entry(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ray_layout.tune", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )


def test_help_names_the_entry_and_exits_0():
    done = run_entry("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ray_layout.tune ")
    assert "--pipeline-model-parallel-layout" in " ".join(done.stdout.split())


def test_bad_input_exits_2_in_one_line_before_any_cluster():
    done = run_entry("configs/handbook_7b_a1b.yaml", "--ab-top", "-1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: --ab-top must be >= 0, got -1\n"


def test_ep_overlap_on_the_cpu_megatron_core_backend_exits_2_before_any_cluster(tmp_path):
    config = tmp_path / "handbook_ep.yaml"
    flags = "megatron_args: [--overlap-moe-expert-parallel-comm, --delay-wgrad-compute]\n"
    config.write_text((ROOT / "configs" / "handbook_7b_a1b.yaml").read_text() + flags)
    done = run_entry(str(config), "--pp", "4", "--vpp", "2", "--backend", "megatron-core")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "--overlap-moe-expert-parallel-comm cannot run" in done.stderr


BAD = ["configs/handbook_7b_a1b.yaml", "--ab-top", "-1"]
UNWRITTEN = [(BAD, where) for where in UNWRITABLE]
UNWRITTEN += [(["--help"], where) for where in UNWRITABLE if where != "closed pipe"]


@pytest.mark.parametrize(
    ("argv", "where"),
    UNWRITTEN,
    ids=lambda value: value if isinstance(value, str) else value[-1],
)
def test_output_that_cannot_be_written_is_one_line_and_non_zero(argv, where):
    """A refusal or the help (whole in a pipe before its reader leaves), with stdout at
    ``/dev/full``, closed, or a pipe closed early: one line on stderr, never a traceback, never
    exit 0 in silence."""
    ended = with_unwritable_stdout(entry("ray_layout.tune", *argv), where)
    assert ended.status in (1, 2) and ended.stderr.count("\n") == 1, ended
    assert ended.stderr.startswith("error: ") and "Traceback" not in ended.stderr


def test_a_web_server_at_the_ray_address_is_one_line_not_a_hang():
    """``ray.init`` on it hung past 30 s, deaf to SIGTERM, printing Ray's warnings."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        done = run_entry("configs/handbook_7b_a1b.yaml", "--pp", "4", "--ray-address", address)
        took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: --ray-address {address}: not a Ray head: a web server")
    assert took < 30


def test_sigterm_after_joining_ray_ends_the_tune_in_one_line_and_130(ray_cluster, tmp_path):
    """What ``ray job stop`` sends, once the driver has joined: ``ray.init`` had put in its own
    handler (``sys.exit(15)``, after Ray's C++ handler printed a stack dump); the command line's
    is kept, so every run stops and the tune ends in its one line."""
    places = ["--store", str(tmp_path / "store"), "--report-dir", str(tmp_path / "report")]
    flags = ["--pp", "2", "--global-batch-size", "32", "--hbm-gb", "131", "--profile-iters", "6"]
    hardware = ["--hardware", str(ROOT / "cluster_configs/hardware/h200_emulated.yaml")]
    command = entry(
        "ray_layout.tune",
        "configs/handbook_7b_a1b.yaml",
        *flags,
        *hardware,
        *places,
        "--ray-address",
        ray_cluster.address,
    )
    env = os.environ | {"RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    with (tmp_path / "stderr").open("w") as stderr:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:  # joined, and profiling
                if "[2/7] profile" in line:
                    break
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    err = (tmp_path / "stderr").read_text()
    assert process.returncode == 130, err
    assert err == f"interrupted: {tune.STOPPED}\n", err
