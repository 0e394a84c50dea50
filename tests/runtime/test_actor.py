"""One rank's process as its actor owns it, run here without Ray: its output streamed and
parsed, its heartbeats and failure marks, and a stop that always ends it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ray_layout.errors import ConfigError
from ray_layout.measure.log_format import iteration_line
from ray_layout.runtime.actor import RankProcess, launcher_niceness, take_niceness
from ray_layout.runtime.failures import MAX_LINE
from tests.helpers.runtime_processes import alive, wait_for


def run_script(tmp_path: Path, source: str, env: dict[str, str] | None = None) -> RankProcess:
    """A rank that ran ``source`` as its Python script to its end, its output all read."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(source))
    process = RankProcess()
    process.start([sys.executable, str(script)], env or {}, "run/rank-0")
    wait_for(lambda: process.poll().returncode is not None, 20.0)
    process.stop(grace_s=1.0)  # exited already: this only waits for the reader
    return process


def test_rank_process_streams_marks_and_stops_a_stubborn_process(tmp_path):
    """The subprocess part of the rank actor, run here without Ray."""
    script = tmp_path / "stubborn.py"
    script.write_text(
        textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(" iteration        1/      10 | lm loss: 1.0 |", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory.", flush=True)
        time.sleep(60)
        """)
    )
    process = RankProcess()
    pid = process.start([sys.executable, str(script)], {}, "stubborn/rank-0")
    wait_for(lambda: "oom" in process.poll().marks, 10.0)
    running = process.poll()
    assert running.returncode is None and running.idle_s < 10.0
    started = time.monotonic()
    final = process.stop(grace_s=0.5)
    assert final is not None and final.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5.0
    assert not alive(pid)
    output = process.finish(grace_s=0.5)  # what it printed, parsed where it ran
    assert "CUDA out of memory" in output.text


def test_a_finished_rank_returns_its_whole_log_parsed(tmp_path: Path) -> None:
    lines = [iteration_line(i, 3, i * 8, 100.0, 8, {"lm loss": 1.0}) for i in (1, 2, 3)]
    process = run_script(tmp_path, f"for line in {lines!r}:\n    print(line)\n")
    final = process.poll()
    assert final.returncode == 0 and final.exit_after_s is not None and not final.marks
    assert process.iteration_lines(0) == lines and process.iteration_lines(2) == lines[2:]
    output = process.finish(grace_s=0.5)
    assert output is not None and output.text == "".join(line + "\n" for line in lines)
    assert [record.iteration for record in output.parsed.iterations] == [1, 2, 3]


def test_a_rank_that_printed_nothing_megatrons_keeps_why(tmp_path: Path) -> None:
    output = run_script(tmp_path, "print('hello')").finish(grace_s=0.5)
    assert output is not None and output.parsed is None
    assert output.parse_error.startswith("run/rank-0: no Megatron timers")


def test_the_rank_sees_its_variables_and_unbuffered_output(tmp_path: Path) -> None:
    source = "import os\nprint(os.environ['RANK'], os.environ['PYTHONUNBUFFERED'], os.getppid())"
    process = run_script(tmp_path, source, {"RANK": "3"})
    assert process.poll().tail == (f"3 1 {os.getpid()}",)  # a child of its actor, never detached


def test_the_tail_keeps_the_last_lines_each_cut_and_the_first_line_of_each_mark(
    tmp_path: Path,
) -> None:
    source = """
    print("CUDA out of memory: first")
    for i in range(100):
        print(i)
    print("CUDA out of memory: second")
    print("x" * 2000)
    """
    status = run_script(tmp_path, source).poll()
    assert status.marks == {"oom": "CUDA out of memory: first"}
    assert len(status.tail) == 50 and status.tail[-1] == "x" * MAX_LINE
    assert status.tail[0] == "52" and status.tail[-2] == "CUDA out of memory: second"


def test_a_command_that_cannot_start_is_a_one_line_config_error(tmp_path: Path) -> None:
    process = RankProcess()
    missing = str(tmp_path / "no-python")
    with pytest.raises(ConfigError, match=rf"^cannot launch '{missing}': No such file"):
        process.start([missing], {}, "run/rank-0")
    assert process.stop(grace_s=0.1) is None and process.finish(grace_s=0.1) is None


def test_a_rank_that_exits_on_sigterm_is_not_killed(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    process = RankProcess()
    pid = process.start([sys.executable, str(script)], {}, "run/rank-0")
    wait_for(lambda: process.poll().tail == ("up",), 10.0)
    started = time.monotonic()
    final = process.stop(grace_s=10.0)
    assert final.returncode == -signal.SIGTERM and time.monotonic() - started < 5.0
    assert not alive(pid)


def test_the_free_port_can_be_bound() -> None:
    port = RankProcess().free_port()
    with socket.socket() as sock:
        sock.bind(("", port))


def test_a_rank_started_by_a_niced_worker_gets_its_launchers_niceness() -> None:
    """Ray's workers run at nice 15; the rank is put back to what its launcher has."""
    child = subprocess.Popen(["nice", "-n", "10", "sleep", "30"])
    try:
        wait_for(lambda: os.getpriority(os.PRIO_PROCESS, child.pid) == 10, 5.0)
        kept = take_niceness(child.pid, 0)
        if kept is None:
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == 0
        else:  # no CAP_SYS_NICE here: the rank stays niced and says why
            assert kept.startswith("runs at nice 10") and "CAP_SYS_NICE" in kept
        assert take_niceness(child.pid, 19) is None  # never made nicer than it is
        assert os.getpriority(os.PRIO_PROCESS, child.pid) <= 10
    finally:
        child.kill()
        child.wait()


def test_the_launchers_niceness_is_the_parent_processes() -> None:
    assert launcher_niceness() == os.getpriority(os.PRIO_PROCESS, os.getppid())
