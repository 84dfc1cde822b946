"""Pushing each symbolized dump to a profile backend, from a bounded queue.

- Grafana Pyroscope's HTTP ingest takes a pprof body as it is: ``POST /ingest?name=APP{k=v,
  …}&from=UNIX&until=UNIX&format=pprof`` (grafana/pyroscope ``pkg/ingester/pyroscope/
  ingest_handler.go``); a heap profile's sample types become its ``memory`` series.
- Parca's ``ProfileStoreService/WriteRaw`` is also served as ``POST /profiles/writeraw``
  (its grpc-gateway mapping, JSON): one series whose labels carry the required ``__name__``,
  one sample whose ``raw_profile`` is the gzip pprof (base64 in JSON).

One sender thread per backend posts profiles in order. When the backend is down, a profile
is tried again with exponential backoff; the queue holds at most ``limit`` profiles and,
when full, drops the oldest (counted), so the agent's memory stays bounded whatever the
backend does.
"""

from __future__ import annotations

import base64
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from heapscope.safetext import json_text


@dataclass(frozen=True)
class Profile:
    """One profile to send: the pprof bytes and where and when it comes from."""

    service: str
    labels: tuple[tuple[str, str], ...]
    start: float  # unix seconds: the previous dump
    end: float  # unix seconds: this dump
    body: bytes


def _label_value(text: str) -> str:
    # Pyroscope's name syntax APP{k=v,…} has no quoting: keep to characters it parses.
    return re.sub(r"[^A-Za-z0-9_.:/-]+", "_", text)


def parca_request(base: str, p: Profile) -> urllib.request.Request:
    """A Parca ``WriteRaw`` request (HTTP/JSON form) for a profile."""
    labels = [{"name": "__name__", "value": "heapscope"},
              {"name": "service", "value": p.service},
              *({"name": _prom_name(k), "value": v} for k, v in p.labels)]
    body = {"series": [{"labels": {"labels": labels},
                        "samples": [{"rawProfile": base64.b64encode(p.body).decode()}]}],
            "normalized": False}
    return urllib.request.Request(f"{base.rstrip('/')}/profiles/writeraw",
                                  data=json_text(body).encode(), method="POST",
                                  headers={"Content-Type": "application/json"})


def _prom_name(key: str) -> str:
    # Parca wants label names valid for Prometheus: [a-zA-Z_][a-zA-Z0-9_]*.
    name = re.sub(r"[^A-Za-z0-9_]", "_", key)
    return name if name[:1].isalpha() or name[:1] == "_" else "_" + name


def pyroscope_request(base: str, p: Profile) -> urllib.request.Request:
    """A Pyroscope ``/ingest`` request for a profile."""
    return urllib.request.Request(ingest_url(base, p), data=p.body, method="POST",
                                  headers={"Content-Type": "application/octet-stream"})


BACKENDS: dict[str, Callable[[str, Profile], urllib.request.Request]] = {
    "pyroscope": pyroscope_request, "parca": parca_request}


def ingest_url(base: str, p: Profile) -> str:
    """The ``/ingest`` URL for a profile."""
    labels = ",".join(f"{k}={_label_value(v)}" for k, v in p.labels)
    name = f"{_label_value(p.service)}{{{labels}}}"
    query = urllib.parse.urlencode({"name": name, "from": int(p.start),
                                    "until": max(int(p.end), int(p.start) + 1),
                                    "format": "pprof", "spyName": "heapscope"})
    return f"{base.rstrip('/')}/ingest?{query}"


class Pusher:
    """A sender thread and its bounded queue; counters for the metrics."""

    def __init__(self, base: str, *, backend: str = "pyroscope", limit: int = 64,
                 attempts: int = 5, backoff: float = 1.0, max_backoff: float = 30.0,
                 timeout: float = 10.0) -> None:
        self.base = base
        self.backend = backend
        self._request = BACKENDS[backend]
        self.limit = limit
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.sent = self.dropped = self.failed = self.retries = 0
        self._queue: deque[Profile] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="heapscope-push", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Profiles waiting to be sent."""
        with self._cond:
            return len(self._queue)

    def offer(self, p: Profile) -> None:
        """Queue a profile; the oldest queued one is dropped when the queue is full."""
        with self._cond:
            if len(self._queue) >= self.limit:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(p)
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued for up to ``timeout`` seconds, then stop (the rest is
        counted as dropped)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        with self._cond:
            self.dropped += len(self._queue)
            self._queue.clear()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                p = self._queue[0]
            ok = self._send(p)
            with self._cond:
                if self._queue and self._queue[0] is p:
                    self._queue.popleft()
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1

    def _send(self, p: Profile) -> bool:
        """Post with retries; False when the backend refused it or never answered."""
        delay = self.backoff
        for attempt in range(self.attempts):
            if attempt:
                self.retries += 1
                with self._cond:
                    # A close() cuts the wait short; the profile is still tried once more.
                    if not self._closing:
                        self._cond.wait(delay)
                delay = min(delay * 2, self.max_backoff)
            req = self._request(self.base, p)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    r.read()
                return True
            except urllib.error.HTTPError as e:
                if e.code < 500 and e.code != 429:
                    return False  # refused: sending it again would not help
            except (OSError, ValueError):
                pass  # down or unreachable: try again after the backoff
            if self._closing and attempt >= 1:
                return False
        return False
