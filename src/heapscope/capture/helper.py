"""The control socket of the helper ``heapscope run`` preloads (``_preload.c``): mallctl calls
in a process without stopping it.

The helper's thread in each process listens on ``$HEAPSCOPE_CTL/<pid>.sock``; heapscope finds
the folder in the process's environment (``/proc/PID/environ``) or, for a process that wrote
its title over it, as the folder its helper library is mapped from; connects, checks that the
peer really is that process (``SO_PEERCRED``), sends the calls and reads their results. A
process without the helper (not started by ``heapscope run``, a static program, a helper that
could not start) raises :class:`NoHelper`, and the caller reaches it another way.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import stat
import struct
import tempfile
import time
from typing import Any, NamedTuple

from heapscope.capture.access import DumpOwner
from heapscope.capture.mallctl import AttachError, CallResult
from heapscope.files import create_new, open_regular

ENV_DIR = "HEAPSCOPE_CTL"
ENV_LOG = "HEAPSCOPE_JEMALLOC_LOG"
LIBRARY_NAME = "libheapscope-preload.so"
_TYPES = {"bool": "b", "unsigned": "u", "size_t": "z", "ssize_t": "s", "uint64": "q",
          "str": "t", "none": "n"}


class NoHelper(Exception):
    """The process has no helper to talk to (use gdb)."""


def library() -> str | None:
    """The built helper (``heapscope/_preload*.so``), or None when it was not built."""
    if os.environ.get("HEAPSCOPE_NO_HELPER"):
        return None
    try:
        spec = importlib.util.find_spec("heapscope._preload")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin else None


def control_dir(pid: int) -> str | None:
    """The helper's socket folder named in the process's environment, else the folder its
    helper library was loaded from, if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = ENV_DIR.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return os.fsdecode(item[len(key):])
    # Daemons that set their process title (nginx, postgres, sshd) write it over the memory
    # /proc/PID/environ shows; the helper library stays mapped from its folder.
    return _library_dir(pid)


def _library_dir(pid: int) -> str | None:
    tail = b"/" + LIBRARY_NAME.encode()
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                path = line.rstrip(b"\n").split(None, 5)[5:]
                if path and path[0].endswith(tail):
                    return os.fsdecode(path[0][:-len(tail)])
    except OSError:
        return None
    return None


def socket_of(pid: int) -> str | None:
    """The control socket of ``pid``, when its helper made one."""
    folder = control_dir(pid)
    if not folder:
        return None
    path = os.path.join(folder, f"{pid}.sock")
    try:
        return path if stat.S_ISSOCK(os.lstat(path).st_mode) else None
    except OSError:
        return None


def request(ops: list[dict[str, Any]]) -> bytes:
    """The request lines for ``ops`` (dicts with name, type, value, write)."""
    lines = []
    for op in ops:
        kind = _TYPES[op["type"]]
        name = str(op["name"])
        if not op.get("write"):
            lines.append(f"r {kind} {name}")
            continue
        value = op.get("value")
        if kind == "n" or value is None:
            lines.append(f"w n {name}")
        elif kind == "t":
            lines.append(f"w t {name} {os.fsencode(str(value)).hex()}")
        elif kind == "b":
            lines.append(f"w b {name} {1 if value else 0}")
        else:
            lines.append(f"w {kind} {name} {int(value)}")
    return ("\n".join(lines) + "\n\n").encode()


def parse_answer(ops: list[dict[str, Any]], data: bytes) -> tuple[dict[str, Any],
                                                                   list[dict[str, Any]]]:
    """(header, one ``{name, rc, value, write}`` per op) from the helper's answer."""
    lines = data.decode("utf-8", "replace").split("\n")
    head = lines[0].split()
    if len(head) != 5 or head[:2] != ["heapscope-ctl", "1"] or len(lines) < len(ops) + 2:
        raise ValueError("not an answer of heapscope's helper")
    header = {"pid": int(head[2]), "tid": int(head[3]), "symbol": "" if head[4] == "-"
              else head[4]}
    out = []
    for op, line in zip(ops, lines[1:], strict=False):
        rc_text, _, raw = line.partition(" ")
        rc = int(rc_text)
        value: Any = None
        if rc == 0 and raw != "-" and not op.get("write"):
            kind = op["type"]
            if kind == "str":
                value = bytes.fromhex(raw).decode("utf-8", "replace")
            elif kind == "bool":
                value = raw == "1"
            elif kind != "none":
                value = int(raw)
        out.append({"name": op["name"], "rc": rc, "value": value,
                    "write": bool(op.get("write"))})
    return header, out


def call(pid: int, ops: list[dict[str, Any]], timeout: float) -> CallResult:
    """Run ``ops`` in ``pid`` through its helper; NoHelper when it has none."""
    path = socket_of(pid)
    if path is None:
        raise NoHelper(f"pid {pid} has no helper")
    t0 = time.monotonic()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(min(timeout, 5.0))
        try:
            s.connect(path)
        except OSError as e:
            raise NoHelper(f"pid {pid}: {path}: {e.strerror or e}") from None
        peer_pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     struct.calcsize("3i")))[0]
        if peer_pid != pid:
            raise NoHelper(f"{path} is served by pid {peer_pid}, not {pid}")
        s.settimeout(timeout)
        data = b""
        try:
            s.sendall(request(ops))
            while not data.endswith(b"end\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise AttachError(
                f"the call in pid {pid} has not returned after {timeout:g} s (a lock it needs "
                "is held, e.g. by another thread writing a dump); its helper thread finishes "
                "it by itself and the process keeps running (raise --timeout for huge "
                "heaps)") from None
        except OSError as e:
            if not data:
                raise NoHelper(f"pid {pid}: {path}: {e.strerror or e}") from None
    finally:
        s.close()
    if not data.endswith(b"end\n"):
        raise AttachError(f"process {pid} exited during the call" if not os.path.exists(
            f"/proc/{pid}") else f"pid {pid}: its helper's answer was cut short")
    try:
        header, results = parse_answer(ops, data)
    except ValueError as e:
        raise AttachError(f"pid {pid}: {path}: {e}") from None
    if not header["symbol"]:
        # No exported mallctl (a static jemalloc, or none): gdb looks in the symbol tables.
        raise NoHelper(f"pid {pid}: its helper found no mallctl")
    values = {r["name"]: r["value"] for r in results if not r["write"]}
    rcs = {r["name"]: r["rc"] for r in results}
    return CallResult(values, rcs, header["symbol"], 0, 0, 0, 0.0, time.monotonic() - t0,
                      {"results": results}, "helper", header["tid"])


# ---- preloading it (heapscope run) -----------------------------------------------------


class Preload(NamedTuple):
    """The helper as ``heapscope run`` preloads it into one program."""

    folder: str  # the sockets, and the copy of the helper the program loads
    library: str
    log: str  # jemalloc's messages, a line each: "<pid>\t<message>"

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the helper preloaded after whatever is preloaded already."""
        out = dict(env)
        out["LD_PRELOAD"] = f"{env['LD_PRELOAD']} {self.library}" if env.get("LD_PRELOAD") \
            else self.library
        out[ENV_DIR] = self.folder
        out[ENV_LOG] = self.log
        return out

    def remove(self) -> None:
        """Remove the socket folder (the program's processes have ended)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _safe(path: str) -> bool:
    # LD_PRELOAD splits at spaces and colons; a socket path has at most 107 bytes.
    return not any(c in path for c in " :\t\n") and len(os.fsencode(path)) < 70


STALE_AFTER = 600.0  # seconds: a folder younger than this may be another run's, starting


def _mapped_folders() -> set[str]:
    """The helper folders some live process has a file of mapped (its helper library)."""
    out: set[str] = set()
    marker = b"/heapscope-ctl-"
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/maps", "rb") as f:
                data = f.read()
        except OSError:
            continue
        at = data.find(marker)
        while at >= 0:
            start = data.rfind(b" ", 0, at) + 1
            end = data.find(b"/", at + len(marker))
            if end > at:
                out.add(os.fsdecode(data[start:end]))
            at = data.find(marker, at + len(marker))
    return out


def remove_stale(base: str, now: float | None = None) -> list[str]:
    """Remove the helper folders in ``base`` that runs killed before they could clean up
    left behind (a killed run leaves its folder to the program, which may still use it):
    only folders of this user, older than :data:`STALE_AFTER`, that no live process has
    mapped the helper from, and that hold nothing but the helper and its sockets (a folder
    with dumps a switched-user process wrote is kept: nothing of a run's is thrown away).
    Returns the folders removed."""
    now = time.time() if now is None else now
    try:
        names = [n for n in os.listdir(base) if n.startswith("heapscope-ctl-")]
    except OSError:
        return []
    if not names:
        return []
    live = _mapped_folders()
    removed = []
    for name in names:
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or \
                    now - st.st_mtime < STALE_AFTER or path in live:
                continue
            if all(_disposable(path, entry) for entry in os.listdir(path)):
                shutil.rmtree(path)
                removed.append(path)
        except OSError:
            continue  # gone meanwhile, or not ours to read: left alone
    return removed


def _disposable(folder: str, entry: str) -> bool:
    """Whether an entry of a stale helper folder holds nothing of the run's: the helper's
    copy, a socket, or an empty folder for a switched user's dumps."""
    st = os.lstat(os.path.join(folder, entry))
    if entry == LIBRARY_NAME and stat.S_ISREG(st.st_mode):
        return True
    if stat.S_ISSOCK(st.st_mode):
        return True
    return stat.S_ISDIR(st.st_mode) and not os.listdir(os.path.join(folder, entry))


def prepare(session: str, owner: DumpOwner) -> Preload | None:
    """A socket folder for the program's helpers (mode 0711, the dump owner's, so a program
    that runs as that user makes its sockets there), a copy of the helper in it that every
    user can load, and ``jemalloc.log`` in the session. None without a built helper."""
    lib = library()
    if lib is None:
        return None
    base = tempfile.gettempdir()
    if not _safe(base):
        base = "/tmp"
    remove_stale(base)
    folder = tempfile.mkdtemp(prefix="heapscope-ctl-", dir=base)
    try:
        if not _safe(folder):
            raise OSError("unsafe path")
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if owner.uid != os.geteuid():
                os.fchown(fd, owner.uid, owner.gid)
            os.fchmod(fd, 0o711)
        finally:
            os.close(fd)
        copy = os.path.join(folder, LIBRARY_NAME)
        with open(lib, "rb") as src, create_new(copy, 0o644) as dst:
            shutil.copyfileobj(src, dst)
        log = os.path.join(session, "jemalloc.log")
        with create_new(log, 0o600) as f:
            if owner.uid != os.geteuid():
                os.fchown(f.fileno(), owner.uid, owner.gid)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return Preload(folder, copy, log)


def read_log(path: str) -> list[tuple[int, str]]:
    """(pid, message line) of each line the helpers appended to ``jemalloc.log``."""
    out: list[tuple[int, str]] = []
    try:
        # Only a regular file: a FIFO at its name would block the end of the run.
        with open_regular(path) as f:
            data = f.read(16 << 20)
    except OSError:
        return out
    for raw in data.decode("utf-8", "replace").splitlines():
        pid, sep, text = raw.partition("\t")
        if sep and pid.isdigit():
            out.append((int(pid), text))
    return out
