"""Whether an address is a Ray head, told in seconds, before ``ray.init`` is called on it.

``ray.init`` retries for a minute and more where nothing listens, and on anything else (a web
server on the port) it hangs past 30 s inside Ray's C++, deaf to SIGTERM, printing Ray's
multi-line warnings. A Ray head's GCS is a gRPC server, so it speaks HTTP/2, and an HTTP/2
server answers a client's connection preface with a SETTINGS frame before anything else
(RFC 9113, section 3.4). The probe connects, sends the preface and an empty SETTINGS frame, and
reads one frame header: a SETTINGS frame may be a head (``ray.init`` tells the rest); an HTTP/1
status line or page, a closed connection, other bytes or silence each say what is there instead.

A ``ray://`` address (Ray Client, often behind a proxy) and a cluster with ``RAY_USE_TLS`` only
get the connection tried; ``auto``, ``local`` and addresses without a port are Ray's to resolve.
"""

from __future__ import annotations

import os
import socket
import time

from ray_layout.errors import quoted

CONNECT_TIMEOUT_S = 3.0
ANSWER_TIMEOUT_S = 3.0  # a GCS answers in under a millisecond
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, stream 0
_FRAME_HEADER = 9
_SETTINGS = 4
_NOT_A_HEAD = "not a Ray head"


def ray_head_problem(address: str) -> str | None:
    """What keeps ``address`` from being a Ray head ``ray.init`` can join, as a clause ("no Ray
    cluster answers there (Connection refused)"), or None; found within ``CONNECT_TIMEOUT_S``
    plus ``ANSWER_TIMEOUT_S`` (and the time the host's name takes to resolve)."""
    plain = address.removeprefix("ray://")
    if address in ("auto", "local") or ":" not in plain or "/" in plain:
        return None
    host, _, port = plain.rpartition(":")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65_536):
        return "is not HOST:PORT"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S) as link:
            if address.startswith("ray://") or _uses_tls():
                return None
            return _greeting_problem(link)
    except OSError as exc:
        return f"no Ray cluster answers there ({exc.strerror or type(exc).__name__})"


def _uses_tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


def _greeting_problem(link: socket.socket) -> str | None:
    """What the server at the other end of ``link`` answers to an HTTP/2 client's greeting."""
    try:
        link.sendall(_PREFACE + _EMPTY_SETTINGS)
        answer = _first_bytes(link, _FRAME_HEADER, time.monotonic() + ANSWER_TIMEOUT_S)
    except TimeoutError:
        return f"{_NOT_A_HEAD}: it took the connection, then said nothing in {ANSWER_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"{_NOT_A_HEAD}: it dropped the connection ({exc.strerror or type(exc).__name__})"
    if len(answer) >= _FRAME_HEADER and answer[3] == _SETTINGS and answer[5:9] == bytes(4):
        return None
    if answer.startswith(b"HTTP/") or answer.lstrip().startswith(b"<"):  # a status line, a page
        first = answer.decode("ascii", "replace").strip().split("\n", 1)[0].strip()
        return f"{_NOT_A_HEAD}: a web server answers there ({quoted(first)})"
    if not answer:
        return f"{_NOT_A_HEAD}: it closed the connection at the HTTP/2 greeting a head answers"
    return f"{_NOT_A_HEAD}: it answered {quoted(answer[:_FRAME_HEADER])} to an HTTP/2 greeting"


def _first_bytes(link: socket.socket, count: int, deadline: float) -> bytes:
    """At least ``count`` bytes (more of an HTTP/1 status line), fewer where the peer closes or
    stops by ``deadline``; ``TimeoutError`` where nothing comes by then."""
    answer = b""
    while len(answer) < count:
        link.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = link.recv(64)
        except TimeoutError:
            if answer:
                break
            raise
        if not chunk:
            break
        answer += chunk
    return answer
