"""Joining a Ray cluster: an address where no Ray head answers is one line within seconds, not
minutes of Ray's retries or a hang; joining keeps the command line's SIGTERM handler.  The
embedded local cluster itself starts in every slow test (tests/conftest.py)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from ray_layout.errors import ConfigError, RunFailure
from ray_layout.runtime import local
from ray_layout.runtime.local import check_reachable, connected


def free_address() -> str:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@contextmanager
def web_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_address_nothing_answers_at_is_one_line_not_minutes_of_retries(monkeypatch):
    closed = free_address()
    with pytest.raises(ConfigError, match=rf"^\$RAY_ADDRESS {closed}: no Ray cluster answers"):
        check_reachable(closed, "$RAY_ADDRESS")
    with pytest.raises(ConfigError, match=rf"^--ray-address ray://{closed}: no Ray cluster"):
        check_reachable(f"ray://{closed}", "--ray-address")
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        check_reachable("127.0.0.1:head", "--ray-address")
    check_reachable("auto", "$RAY_ADDRESS")  # Ray's to resolve
    monkeypatch.setenv("RAY_ADDRESS", closed)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="unset RAY_ADDRESS"), connected(None, 1, None):
        pass
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("given_by", ["--ray-address", "$RAY_ADDRESS"])
def test_a_web_server_on_the_port_is_one_line_within_seconds_never_ray_init(monkeypatch, given_by):
    """``ray.init`` on a web server hung past 30 s, deaf to SIGTERM, printing Ray's warnings."""
    monkeypatch.setattr(local.ray, "init", lambda **kwargs: pytest.fail("ray.init was called"))
    with web_server() as address:
        flag = address if given_by == "--ray-address" else None
        if flag is None:
            monkeypatch.setenv("RAY_ADDRESS", address)
        started = time.monotonic()
        with pytest.raises(ConfigError) as error, connected(flag, 1, None):
            pass
        assert time.monotonic() - started < 10
    message = str(error.value)
    assert message.startswith(f"{given_by} {address}: not a Ray head: a web server answers there")
    assert "\n" not in message and ("unset RAY_ADDRESS" in message) == (flag is None)


def test_a_given_address_is_named_as_the_flag_that_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    closed = free_address()
    with pytest.raises(ConfigError) as error, connected(closed, 1, None):
        pass
    assert str(error.value).startswith(f"--ray-address {closed}: no Ray cluster answers there")
    assert "\n" not in str(error.value)


def test_joining_keeps_the_command_lines_sigterm_handler(monkeypatch):
    """``ray.init`` installs its own (``sys.exit(15)``): a stopped job would exit 15 in Ray's
    lines of noise instead of the command line's one line and 130."""
    calls = []

    def ray_init(**kwargs: object) -> None:
        calls.append(kwargs)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)

    def ours(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(local.ray, "init", ray_init)
    previous = signal.signal(signal.SIGTERM, ours)
    try:
        local.join(address="10.0.0.1:6379")
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert calls == [{"logging_level": "ERROR", "address": "10.0.0.1:6379"}]


def test_a_real_ray_head_is_accepted(ray_cluster):
    """The session's embedded cluster (tests/conftest.py): its GCS answers the greeting."""
    check_reachable(ray_cluster.address, "--ray-address")


def test_an_embedded_cluster_that_does_not_start_is_one_line_and_is_shut_down(monkeypatch):
    """Ray raises a bare Exception when a node times out at start-up (a loaded machine): the
    user gets one line, and what did start is shut down."""
    shut = []

    class StuckCluster:
        def __init__(self, **kwargs):
            pass

        def add_node(self, **kwargs):
            raise Exception("The current node timed out during startup. This could happen ...")

        def shutdown(self):
            shut.append(True)

    monkeypatch.setattr(local, "Cluster", StuckCluster)
    with pytest.raises(RunFailure) as error:
        local.start_local_cluster(nodes=2)
    message = str(error.value)
    assert "\n" not in message and "did not start (The current node timed out" in message
    assert "--ray-address" in message and shut == [True]


class StartingCluster:
    """A cluster whose every node puts in its own SIGTERM handler, as Ray's nodes do."""

    address = "127.0.0.1:6379"
    shut: ClassVar[list[bool]] = []

    def __init__(self, **kwargs: object) -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)

    def add_node(self, **kwargs: object) -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)

    def wait_for_nodes(self) -> None:
        pass

    def shutdown(self) -> None:
        self.shut.append(True)


def interrupted(cluster: StartingCluster) -> None:
    raise KeyboardInterrupt


def test_starting_the_embedded_cluster_keeps_the_sigterm_handler_and_an_interrupt_stops_it(
    monkeypatch,
):
    for name in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(local, "Cluster", StartingCluster)
    monkeypatch.setattr(local.ray, "init", lambda **kwargs: None)

    def ours(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        assert isinstance(local.start_local_cluster(nodes=2), StartingCluster)
        assert signal.getsignal(signal.SIGTERM) is ours and StartingCluster.shut == []
        monkeypatch.setattr(StartingCluster, "wait_for_nodes", interrupted)  # Ctrl-C mid-start
        with pytest.raises(KeyboardInterrupt):
            local.start_local_cluster(nodes=2)
        assert signal.getsignal(signal.SIGTERM) is ours and StartingCluster.shut == [True]
    finally:
        signal.signal(signal.SIGTERM, previous)
