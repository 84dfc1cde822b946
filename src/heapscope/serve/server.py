"""Running the viewer: a socket on a free port, a token, uvicorn, and the one URL printed.

The socket is bound here (port 0: the kernel picks a free one) and handed to uvicorn, so the
URL printed is the one that answers, with no window in which another program could take the
port. :class:`Viewer` runs the server in a thread (tests, ``run --serve``, ``attach … watch
--serve``, the shell's ``web``, see :mod:`heapscope.cli.beside`);
:func:`serve` runs it in the foreground until Ctrl-C.
"""

from __future__ import annotations

import gc
import secrets
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

import uvicorn

from heapscope.netaddr import is_loopback
from heapscope.serve.app import create_app
from heapscope.serve.catalog import Catalog
from heapscope.serve.views import Settings, Workbench

LOOPBACK = "127.0.0.1"
EXPOSES = ("function and file names from the dumps, the text of the source files they name, "
           "the paths of dumps, binaries and sessions, and the processes' command lines")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class Viewer:
    """The viewer of some inputs, served on one socket; :meth:`start` runs it in a thread."""

    def __init__(self, paths: Sequence[str], settings: Settings, *, host: str = LOOPBACK,
                 port: int = 0, trust_uids: Sequence[int] = ()) -> None:
        self.token = secrets.token_urlsafe(24)
        self.catalog = Catalog(paths, trust_uids)
        self.bench = Workbench(self.catalog, settings)
        self.app = create_app(self.bench, self.token)
        self.sock = bind(host, port)
        self.host = host
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="off", server_header=False,
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._failure = ""

    @property
    def base(self) -> str:
        """``http://host:port`` (an IPv6 address in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL to open: the server's address with its token."""
        return f"{self.base}/?token={self.token}"

    def run(self) -> None:
        """Serve in this thread until the server is told to stop (or Ctrl-C)."""
        self.server.run(sockets=[self.sock])

    def start(self, timeout: float = 30.0) -> None:
        """Serve in a background thread; returns once the server answers (RuntimeError when
        it could not start)."""
        # A program started while the viewer runs (heapscope run --serve) must not inherit
        # the listening socket: it would keep the port open after the viewer stopped.
        self.sock.set_inheritable(False)
        self._thread = threading.Thread(target=self._run_quietly, name="heapscope-serve",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                self.sock.close()
                raise RuntimeError(self._failure or "the server ended as it started")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not answer within {timeout:g} s")
            time.sleep(0.02)

    def _run_quietly(self) -> None:
        # uvicorn leaves by SystemExit when its start-up fails; in a thread that would only
        # print a traceback, so the reason is kept for start() to report.
        try:
            self.run()
        except BaseException as e:  # the thread's end: start() says it
            self._failure = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    @property
    def running(self) -> bool:
        """True while a server started with :meth:`start` serves."""
        return self._thread is not None and self._thread.is_alive() and self.server.started

    def stop(self) -> None:
        """Stop a server started with :meth:`start` and close its port (again: nothing)."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()


def serve(paths: Sequence[str], settings: Settings, *, host: str = LOOPBACK, port: int = 0,
          open_browser: bool = False, trust_uids: Sequence[int] = (),
          out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Serve the viewer of ``paths`` in the foreground; print its URL; 0 when stopped."""
    out = out or sys.stdout
    err = err or sys.stderr
    # The command line switches the cyclic collector off for short runs; a server runs long.
    gc.enable()
    viewer = Viewer(paths, settings, host=host, port=port, trust_uids=trust_uids)
    if not is_loopback(host):
        print(f"heapscope: warning: serving on {host}, not only to this machine: whoever can "
              f"reach it and has the URL below can read {EXPOSES}", file=err)
    print(viewer.url, file=out, flush=True)
    if open_browser:
        import webbrowser

        threading.Timer(0.5, webbrowser.open, args=(viewer.url,)).start()
    try:
        viewer.run()
    finally:
        viewer.sock.close()
    return 0
