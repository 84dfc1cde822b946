"""A target in another root: a container, a chroot, a service with its own mount namespace.

Such a process cannot write into heapscope's session folder (it does not see it), and the
paths in its memory map are its own (``/app/svc``), not the host's. :func:`confinement`
tells such a target apart; :class:`Drop` is the private folder heapscope makes inside the
target's root for the dumps it asks for, reads them back from and removes;
:func:`container_modules` records the target's modules under the names its dumps use.

How the folder is reached: every file-system step goes through descriptors, starting from
``/proc/PID/root`` (the target's root, in its own mount namespace), each component opened
with ``O_NOFOLLOW | O_DIRECTORY`` relative to the one before. A symlink the container
planted (``/tmp -> /etc``) then fails the open instead of leading heapscope, as root, into
a host folder; the folder's descriptor pins it, so the dump is read from the folder heapscope
made even if its name is swapped afterwards. Chosen over ``openat2(RESOLVE_IN_ROOT)`` (needs
ctypes and Linux 5.6) and over a forked child that enters the target's mount namespace
(``setns`` needs ctypes in Python 3.11 and refuses a multithreaded caller, and a fork of a
threaded Python is fragile): the ``dir_fd`` functions of :mod:`os` do it all.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass
from typing import Any

from heapscope.files import create_new, open_regular
from heapscope.model import Mapping

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# Where inside the target's root the folder is made: the first that exists as a real folder
# (not a link) and takes a new entry.
PARENTS = ("tmp", "var/tmp", "dev/shm")
PREFIX = ".heapscope-"


class ContainerError(OSError):
    """The target's root has no folder heapscope can make its private folder in."""


@dataclass(frozen=True)
class Confinement:
    """What sets a target apart from heapscope's own view of the machine."""

    pid: int
    nspid: tuple[int, ...]  # its pid in each PID namespace, the host's first
    root: str  # host path of its root: lasting (a chroot) or /proc/PID/root while it runs
    lasting_root: bool  # ``root`` stays valid after the process exits
    other_mount_ns: bool
    other_root: bool
    cgroup: str  # the v2 cgroup path ("0::…"), else the first v1 path, "" when unreadable

    @property
    def inner_pid(self) -> int:
        """Its pid as it sees itself (the last of NSpid)."""
        return self.nspid[-1] if self.nspid else self.pid

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``container`` entry."""
        ident = container_identity(self.cgroup)
        return {"pid": self.pid, "nspid": self.inner_pid, "nspids": list(self.nspid),
                "root": self.root, "root_lasts": self.lasting_root,
                "other_mount_namespace": self.other_mount_ns, "other_root": self.other_root,
                "cgroup": self.cgroup, **ident}


def _stat_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _ns(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def nspids(pid: int) -> tuple[int, ...]:
    """The NSpid line of /proc/PID/status: the pid in each namespace, outermost first."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


def read_cgroup(pid: int) -> str:
    """The process's cgroup path: the v2 entry (``0::/…``), else the first v1 path that is
    not the root."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    return cgroup_path(lines)


def cgroup_path(lines: list[str]) -> str:
    """The cgroup path among the lines of a /proc/PID/cgroup file (see read_cgroup)."""
    v1 = v2 = ""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif not v1 and parts[2] not in ("", "/"):
            v1 = parts[2]
    # On a hybrid host the v2 entry is often the root ("0::/") while v1 controllers hold
    # the container's path.
    return v2 if v2 not in ("", "/") else (v1 or v2)


_POD = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}"
                  r"[-_][0-9a-fA-F]{12})")
_RUNTIME = re.compile(r"^(?:(?:cri-containerd|crio|docker|libpod|containerd)-)?"
                      r"([0-9a-f]{64})(?:\.scope)?$")


def container_identity(cgroup: str) -> dict[str, str]:
    """``container`` (the runtime's id, first 12 characters, else the cgroup's last name) and
    ``pod_uid`` (Kubernetes) read from a cgroup path; only what it names."""
    out: dict[str, str] = {}
    if not cgroup or cgroup == "/":
        return out
    pod = _POD.search(cgroup)
    if pod:
        out["pod_uid"] = pod.group(1).replace("_", "-")
    names = [n for n in cgroup.split("/") if n]
    # The runtime's id may sit above the leaf (podman's ``libpod-<id>.scope/container``).
    ids = [m.group(1) for m in map(_RUNTIME.match, names) if m]
    if ids:
        out["container"] = ids[-1][:12]
    elif names:
        out["container"] = names[-1]
    return out


def confinement(pid: int) -> Confinement | None:
    """How ``pid`` is set apart from heapscope (None when it shares our root and mount
    namespace, or when /proc does not say)."""
    mine, theirs = _ns("/proc/self/ns/mnt"), _ns(f"/proc/{pid}/ns/mnt")
    our_root, their_root = _stat_id("/proc/self/root"), _stat_id(f"/proc/{pid}/root")
    if their_root is None:
        return None
    other_ns = mine is not None and theirs is not None and mine != theirs
    other_root = our_root is not None and our_root != their_root
    if not other_ns and not other_root:
        return None
    proc_root = f"/proc/{pid}/root"
    root, lasting = proc_root, False
    try:
        shown = os.readlink(proc_root)
    except OSError:
        shown = ""
    # For a chroot the link names the folder on the host; for a root only another mount
    # namespace holds it, the name is the container's own view (or a mount point the host
    # sees empty): the same folder only when it is the very same inode.
    if shown.startswith("/") and shown != "/" and _stat_id(shown) == their_root:
        root, lasting = shown, True
    return Confinement(pid, nspids(pid), root, lasting, other_ns, other_root,
                       read_cgroup(pid))


class Drop:
    """A private folder (mode 0700, the target's user) inside the target's root, for the
    dumps it is asked to write; :meth:`close` removes it and whatever is in it.

    Use as a context manager so that nothing is left inside the container, also on errors
    and Ctrl-C."""

    def __init__(self, pid: int, owner: tuple[int, int] | None, root_path: str = "") -> None:
        """``root_path``: the target's root (default ``/proc/PID/root``)."""
        self.pid = pid
        self.fd = self.parent_fd = -1
        self.name = PREFIX + secrets.token_hex(6)
        self.inside = ""
        root = os.open(root_path or f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY
                       | getattr(os, "O_CLOEXEC", 0))
        why = []
        try:
            for parent in PARENTS:
                try:
                    self._make(root, parent, owner)
                    return
                except OSError as e:
                    why.append(f"/{parent}: {e.strerror or e}")
                    self.close()
        except BaseException:  # Ctrl-C included: nothing is left inside the container
            self.close()
            raise
        finally:
            os.close(root)
        raise ContainerError(f"no folder inside its root takes a new entry ({'; '.join(why)})")

    def _make(self, root: int, parent: str, owner: tuple[int, int] | None) -> None:
        fd = os.dup(root)
        for part in parent.split("/"):
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            finally:
                os.close(fd)
            fd = nxt
        self.parent_fd = fd
        os.mkdir(self.name, 0o700, dir_fd=fd)
        try:
            self.fd = os.open(self.name, _DIR, dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(self.name, dir_fd=fd)
            raise
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid():  # not the folder just made: replaced in between
            raise ContainerError(f"{self.name} changed while it was made")
        if owner is not None and owner[0] != st.st_uid:
            os.fchown(self.fd, owner[0], owner[1])
        os.fchmod(self.fd, 0o700)
        self.inside = f"/{parent}/{self.name}"

    def path(self, name: str) -> str:
        """``name`` in the folder, as the target sees it."""
        return f"{self.inside}/{name}"

    def collect(self, name: str, dest: str) -> bool:
        """Copy the regular file ``name`` the target wrote into the folder to the new file
        ``dest`` (mode 0600) and remove it; False when the target wrote none."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                         | getattr(os, "O_CLOEXEC", 0), dir_fd=self.fd)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            with os.fdopen(os.dup(fd), "rb") as fin, create_new(dest, 0o600) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
        return True

    def close(self) -> None:
        """Remove the folder and what is in it; close the descriptors."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                for entry in os.listdir(self.fd):
                    with contextlib.suppress(OSError):
                        os.unlink(entry, dir_fd=self.fd)
            mine = os.fstat(self.fd)
            with contextlib.suppress(OSError):
                there = os.stat(self.name, dir_fd=self.parent_fd, follow_symlinks=False)
                if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                    os.rmdir(self.name, dir_fd=self.parent_fd)
            os.close(self.fd)
            self.fd = -1
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1

    def __enter__(self) -> Drop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _code_mappings(dump: str) -> list[Mapping]:
    """The file mappings a dump's memory map names as executable (the process's own view of
    its files); none when the dump cannot be read."""
    import io

    from heapscope.formats.maps import parse_maps_line

    out: list[Mapping] = []
    try:
        with open_regular(dump) as raw, \
                io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                if line.startswith("MAPPED_LIBRARIES:"):
                    break
            for line in f:
                m = parse_maps_line(line)
                if m is not None and "x" in m.perms and m.path.startswith("/"):
                    out.append(m)
    except (OSError, ValueError):
        return []
    return out


def dump_module_paths(dump: str) -> set[str]:
    """The files a dump's memory map names as mapped executable (the process's own view)."""
    return {m.path for m in _code_mappings(dump)}


def container_modules(pid: int, dump: str) -> dict[str, str]:
    """The executable file mappings of a live target in another root, by the paths its dump
    names them with (its own view): path -> ``/proc/PID/map_files/<range>``, the mapped file
    itself. The host's /proc/PID/maps names the same files by host paths (or not at all), so
    the dump's own memory map is the one to follow; ranges are the same."""
    out: dict[str, str] = {}
    for m in _code_mappings(dump):
        source = f"/proc/{pid}/map_files/{m.start:x}-{m.limit:x}"
        if m.path not in out and os.path.exists(source):
            out[m.path] = source
    return out
