"""The agent's Pyroscope sender against a real local HTTP server: order, retries, a backend
that is down (bounded queue, drops counted) and comes back."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator

import pytest

from heapscope.agent.push import Profile, Pusher, ingest_url


class Ingest:
    """A local /ingest endpoint; ``status`` is what it answers."""

    def __init__(self, port: int = 0, status: int = 200) -> None:
        self.status = status
        self.bodies: list[bytes] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if me.status == 200:
                    me.bodies.append(body)
                self.send_response(me.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ingest() -> Iterator[Ingest]:
    s = Ingest()
    yield s
    s.close()


def _profile(i: int) -> Profile:
    return Profile("api", (("pid", "42"), ("host", "h1")), 100.0 + i, 101.0 + i,
                   f"profile {i}".encode())


def _wait(cond: object, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():  # type: ignore[operator]
        time.sleep(0.02)


def test_url_carries_service_labels_and_times() -> None:
    url = urllib.parse.urlsplit(ingest_url("http://p:4040/", _profile(0)))
    q = dict(urllib.parse.parse_qsl(url.query))
    assert url.path == "/ingest"
    assert q == {"name": "api{pid=42,host=h1}", "from": "100", "until": "101",
                 "format": "pprof", "spyName": "heapscope"}


def test_sends_in_order(ingest: Ingest) -> None:
    p = Pusher(f"http://127.0.0.1:{ingest.port}", backoff=0.01)
    for i in range(5):
        p.offer(_profile(i))
    p.close()
    assert ingest.bodies == [f"profile {i}".encode() for i in range(5)]
    assert (p.sent, p.failed, p.dropped) == (5, 0, 0)


def test_refused_profiles_are_not_retried(ingest: Ingest) -> None:
    ingest.status = 400
    p = Pusher(f"http://127.0.0.1:{ingest.port}", backoff=0.01)
    p.offer(_profile(0))
    p.close()
    assert (p.sent, p.failed, p.retries) == (0, 1, 0)


def test_backend_down_then_back() -> None:
    with socket.socket() as s:  # a port nothing listens on, yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = Pusher(f"http://127.0.0.1:{port}", limit=3, attempts=1000, backoff=0.05,
               max_backoff=0.1, timeout=1)
    for i in range(10):
        p.offer(_profile(i))
    # At most the queue's limit is kept (plus the one being tried): the rest are dropped.
    assert p.dropped >= 6 and p.queued <= 3
    _wait(lambda: p.retries >= 2)  # it has found the backend down, and keeps trying
    assert p.sent == 0 and p.retries >= 2
    server = Ingest(port)
    try:
        _wait(lambda: p.queued == 0 and p.sent >= 3)
        assert p.sent >= 3
        # The newest profiles survived; the oldest were the ones dropped.
        assert server.bodies[-1] == b"profile 9"
        assert len(server.bodies) + p.dropped == 10
    finally:
        p.close()
        server.close()
