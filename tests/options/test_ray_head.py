"""Telling a Ray head from anything else on a port, in seconds, before ``ray.init`` hangs on it.
A real Ray head is accepted in tests/runtime/test_local.py (it needs a cluster: slow)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.options import ray_head
from ray_layout.options.ray_head import ray_head_problem

SETTINGS_FRAME = bytes([0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100])  # what a gRPC server says


def test_the_whole_probe_answers_within_the_10_s_a_user_waits():
    assert ray_head.CONNECT_TIMEOUT_S + ray_head.ANSWER_TIMEOUT_S < 10


@contextmanager
def listener(answer: Callable[[socket.socket], None] | None) -> Iterator[str]:
    """``host:port`` of a TCP server that runs ``answer`` on each connection (None: it never
    accepts, the kernel alone completes the connection)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        stop = threading.Event()

        def serve() -> None:
            server.settimeout(0.05)
            while not stop.is_set():
                try:
                    link, _ = server.accept()
                except TimeoutError:
                    continue
                with link:
                    answer(link)

        thread = threading.Thread(target=serve, daemon=True)
        if answer is not None:
            thread.start()
        try:
            yield f"127.0.0.1:{server.getsockname()[1]}"
        finally:
            stop.set()
            if answer is not None:
                thread.join()


def http2_server(link: socket.socket) -> None:
    link.recv(1024)
    link.sendall(SETTINGS_FRAME)
    time.sleep(0.05)


def test_an_http2_server_that_greets_back_may_be_a_ray_head():
    with listener(http2_server) as address:
        assert ray_head_problem(address) is None


def test_a_web_server_is_named_as_one_within_seconds():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        problem = ray_head_problem(f"127.0.0.1:{server.server_address[1]}")
        assert time.monotonic() - started < 5
    finally:
        server.shutdown()
        server.server_close()
    assert problem is not None and problem.startswith("not a Ray head: a web server answers there")
    assert "<!DOCTYPE HTML>" in problem  # Python's server answers an HTTP/2 greeting with a page


def test_a_listener_that_says_nothing_is_refused_at_the_answers_deadline(monkeypatch):
    monkeypatch.setattr(ray_head, "ANSWER_TIMEOUT_S", 0.3)
    with listener(None) as address:
        started = time.monotonic()
        problem = ray_head_problem(address)
        assert 0.3 <= time.monotonic() - started < 3
    assert problem == "not a Ray head: it took the connection, then said nothing in 0.3 s"


def test_a_server_that_hangs_up_babbles_or_answers_http1_is_no_ray_head():
    with listener(lambda link: link.recv(1024) and None) as address:
        assert ray_head_problem(address) == (
            "not a Ray head: it closed the connection at the HTTP/2 greeting a head answers"
        )
    with listener(lambda link: link.recv(1024) and link.sendall(b"SSH-2.0-OpenSSH\r\n")) as address:
        assert ray_head_problem(address) == (
            "not a Ray head: it answered b'SSH-2.0-O' to an HTTP/2 greeting"
        )
    status = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    with listener(lambda link: link.recv(1024) and link.sendall(status)) as address:
        assert ray_head_problem(address) == (
            "not a Ray head: a web server answers there ('HTTP/1.1 400 Bad Request')"
        )


def test_an_address_nothing_listens_at_is_said_so():
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    assert ray_head_problem(closed) == "no Ray cluster answers there (Connection refused)"


@pytest.mark.parametrize("port", ["head", "0", "65536", "１２", "123456"])
def test_a_port_that_is_no_port_is_said_so(port):
    assert ray_head_problem(f"127.0.0.1:{port}") == "is not HOST:PORT"


@pytest.mark.parametrize("address", ["auto", "local", "head-node", "ray://head-node", "h:1/x"])
def test_addresses_without_a_port_are_rays_to_resolve(address):
    """Nothing is tried: these hosts do not exist, a probe would fail."""
    assert ray_head_problem(address) is None


def test_ray_client_and_tls_addresses_only_get_the_connection_tried(monkeypatch):
    """Ray Client often sits behind a proxy, and a TLS head answers no clear-text greeting."""
    monkeypatch.setattr(ray_head, "ANSWER_TIMEOUT_S", 30.0)
    with listener(None) as address:
        assert ray_head_problem(f"ray://{address}") is None
        monkeypatch.setenv("RAY_USE_TLS", "1")
        assert ray_head_problem(address) is None


@given(st.binary(max_size=40))
def test_any_answer_but_a_settings_frame_is_one_line_naming_what_came(answer):
    """Whatever a server sends back, the probe says what it was in one line, or accepts it
    only when it opens with an HTTP/2 SETTINGS frame on stream 0."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(answer)
        theirs.shutdown(socket.SHUT_WR)
        problem = ray_head._greeting_problem(ours)
    settings = len(answer) >= 9 and answer[3] == 4 and answer[5:9] == bytes(4)
    assert (problem is None) == settings
    assert problem is None or (problem.startswith("not a Ray head: ") and problem.isprintable())
