"""Fork and exec events from the kernel (the netlink process connector), as they happen.

Polling /proc misses processes that live a few milliseconds (pre-fork workers, shell helpers,
one-shot backends), so their parent would stay unknown. The connector reports every fork and
exec on the machine; it needs CAP_NET_ADMIN and the host's network namespace, so when it is not
available heapscope falls back to polling alone and says so in the manifest.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time

_NETLINK_CONNECTOR = 11
_CN_IDX_PROC = 1
_CN_VAL_PROC = 1
_LISTEN = 1
_IGNORE = 2
_NLMSG_DONE = 3
_FORK = 0x00000001
_EXEC = 0x00000002
_HDR = 16 + 20  # nlmsghdr + cn_msg
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp


class ProcEvents:
    """Listens for fork/exec events in a background thread while it is open."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}  # child process -> parent process
        # pid -> (exe, argv) after its last exec, and when they were read (time.monotonic)
        self.image: dict[int, tuple[str, list[str], float]] = {}
        self.available = False
        self.error = ""
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self) -> bool:
        """Subscribe to the events; False (with ``error`` set) when the kernel refuses."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_CONNECTOR)
            sock.bind((0, _CN_IDX_PROC))
            sock.send(_control(_LISTEN))
        except (OSError, AttributeError) as e:
            self.error = getattr(e, "strerror", None) or str(e)
            return False
        self._sock = sock
        self.available = True
        self._thread = threading.Thread(target=self._run, name="heapscope-procevents",
                                        daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Unsubscribe and wait for the listener to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.send(_control(_IGNORE))
            self._sock.close()
            self._sock = None

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([sock], [], [], 0.1)
                if not ready:
                    continue
                data = sock.recv(65536)
            except OSError:
                continue  # ENOBUFS under a fork storm: keep listening
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        offset = 0
        while offset + _HDR + _EVENT.size <= len(data):
            (length,) = struct.unpack_from("=I", data, offset)
            what, _cpu, _ts = _EVENT.unpack_from(data, offset + _HDR)
            body = offset + _HDR + _EVENT.size
            if what == _FORK and body + 16 <= len(data):
                _ppid, ptgid, cpid, ctgid = struct.unpack_from("=IIII", data, body)
                if cpid == ctgid:  # a new process, not a new thread
                    with self.lock:
                        self.parent[ctgid] = ptgid
            elif what == _EXEC and body + 8 <= len(data):
                _pid, tgid = struct.unpack_from("=II", data, body)
                exe, argv = read_image(tgid)
                if exe:
                    with self.lock:
                        self.image[tgid] = (exe, argv, time.monotonic())
            if length <= 0:
                break
            offset += (length + 3) & ~3


def _control(op: int) -> bytes:
    payload = struct.pack("=I", op)
    cn = struct.pack("=IIIIHH", _CN_IDX_PROC, _CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return struct.pack("=IHHII", 16 + len(cn), _NLMSG_DONE, 0, 0, os.getpid()) + cn


def read_image(pid: int) -> tuple[str, list[str]]:
    """The executable and command line of a live process ("" and [] when unreadable)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    return exe, argv
