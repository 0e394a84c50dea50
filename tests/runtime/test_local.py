"""Joining a Ray cluster: an address nothing answers at is one line at once, not minutes of
Ray's retries.  The embedded local cluster itself starts in every slow test (tests/conftest.py)."""

from __future__ import annotations

import socket
import time

import pytest

from ray_layout.errors import ConfigError, RunFailure
from ray_layout.runtime import local
from ray_layout.runtime.local import check_reachable, connected


def test_an_address_nothing_answers_at_is_one_line_not_minutes_of_retries(monkeypatch):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(ConfigError, match=rf"no Ray cluster answers at {closed} \(\$RAY_ADDRESS\)"):
        check_reachable(closed, "$RAY_ADDRESS")
    with pytest.raises(ConfigError, match=r"ray://" + closed + r" \(--ray-address\)"):
        check_reachable(f"ray://{closed}", "--ray-address")
    with pytest.raises(ConfigError, match="is not host:port"):
        check_reachable("127.0.0.1:head", "--ray-address")
    check_reachable("auto", "$RAY_ADDRESS")  # Ray's to resolve
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_reachable(f"127.0.0.1:{listening.getsockname()[1]}", "--ray-address")
    monkeypatch.setenv("RAY_ADDRESS", closed)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="unset RAY_ADDRESS"), connected(None, 1, None):
        pass
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("address", ["auto", "head-node", "ray://head-node", "10.0.0.1:6379/x"])
def test_addresses_that_are_not_host_and_port_are_rays_to_resolve(address: str) -> None:
    """Nothing is probed: no port to try (these hosts do not exist; a probe would fail)."""
    started = time.monotonic()
    check_reachable(address, "--ray-address", timeout_s=30.0)
    assert time.monotonic() - started < 1.0


def test_a_given_address_is_named_as_the_flag_that_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(ConfigError) as error, connected(closed, 1, None):
        pass
    assert str(error.value).startswith(f"no Ray cluster answers at {closed} (--ray-address): ")
    assert "\n" not in str(error.value)


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
