"""Dumps of the processes that change user under ``heapscope run``.

A daemon that drops privileges by itself (nginx, Apache, postfix, php-fpm workers switching
to ``www-data``) can no longer write into the session's ``dumps/``, which belongs to the
user the program started as: every dump it is asked for fails, and so does its dump at
exit. heapscope sees each process's effective user in ``/proc`` and, through the helper,
points that process's jemalloc at a folder its new user owns (``prof.prefix``, writable since
jemalloc 5.3): ``dumps-UID/`` (mode 0700, that user's) inside the helper's socket folder,
which others may pass through but not list. When the run ends heapscope copies the dumps
found there into ``dumps/`` itself, each only if it is a regular file that user owns (opened
without following links), and the folder goes with the socket folder.

A process that entered another root (``chroot``, a container started by the program:
``unshare … chroot ROOT /app/svc``) cannot see ``dumps/`` either, whatever its user: it is
pointed at a private folder inside its own root (:class:`heapscope.capture.container.Drop`),
held open by descriptor, so its dumps, the one at exit included, are copied out when the run
ends, renamed from the pid it has in its namespace to the host's, and the folder removed.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import TYPE_CHECKING

from heapscope.errors import HeapscopeError

if TYPE_CHECKING:
    from heapscope.capture.container import Drop

FOLDER = "dumps-{uid}"
MAX_DUMP = 1 << 32  # a dump bigger than this is not copied (the readers' own limit)


def effective_ids(pid: int) -> tuple[int, int] | None:
    """(effective uid, effective gid) of ``pid``, or None when it has gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    ids: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Uid", "Gid"):
            fields = rest.split()
            if len(fields) >= 2 and fields[1].isdigit():
                ids[key] = int(fields[1])
    if "Uid" not in ids or "Gid" not in ids:
        return None
    return ids["Uid"], ids["Gid"]


class UserDumps:
    """Dump folders for the users a run's processes switch to (see the module's docstring).

    ``base`` is the helper's socket folder (root's or the dump owner's, mode 0711);
    ``owner_uid`` owns the session's ``dumps/``.
    """

    def __init__(self, base: str, owner_uid: int) -> None:
        self.base = base
        self.owner_uid = owner_uid
        self.folders: dict[int, str] = {}  # uid -> its folder
        self.pointed: dict[int, int] = {}  # pid -> the uid its prefix was set for
        self.users: dict[int, int] = {}  # pid -> the uid last seen, when not the owner's
        self.drops: dict[int, tuple[Drop, int]] = {}  # pid in another root -> (folder, nspid)
        self.roots: dict[int, str] = {}  # pid -> its root as a lasting host path (a chroot)
        self.lock = threading.Lock()

    def prefix_for(self, pid: int) -> str | None:
        """The ``prof.prefix`` ``pid`` needs, or None when it can write ``dumps/`` (it runs
        as the dumps' owner, or as root, in heapscope's own root)."""
        confined = self._drop_for(pid)
        if confined is not None:
            return confined
        ids = effective_ids(pid)
        if ids is None or ids[0] in (self.owner_uid, 0):
            return None
        uid, gid = ids
        with self.lock:
            self.users[pid] = uid
            folder = self.folders.get(uid)
            if folder is None:
                folder = self._make(uid, gid)
                self.folders[uid] = folder
        return os.path.join(folder, "jeprof")

    def _drop_for(self, pid: int) -> str | None:
        """The prefix inside its own root for a process in another root, else None."""
        with self.lock:
            got = self.drops.get(pid)
            if got is not None:
                return got[0].path("jeprof")
        from heapscope.capture.container import ContainerError, Drop, confinement

        # Asked again each time (two readlinks, two stats): a process may chroot after it
        # was first seen (unshare's child, before it execs the service).
        where = confinement(pid)
        if where is None:
            return None
        try:
            drop = Drop(pid, effective_ids(pid))
        except (ContainerError, OSError):
            return None  # the rounds note the failed dumps; the report names the process
        with self.lock:
            got = self.drops.get(pid)
            if got is None:
                self.drops[pid] = (drop, where.inner_pid)
                if where.lasting_root:
                    self.roots[pid] = where.root
        if got is not None:
            # Another thread (the rounds, or the adopting loop) made one for it meanwhile:
            # one folder per process, and this one goes at once.
            drop.close()
            return got[0].path("jeprof")
        return drop.path("jeprof")

    def _make(self, uid: int, gid: int) -> str:
        path = os.path.join(self.base, FOLDER.format(uid=uid))
        os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        return path

    def point(self, pids: list[int]) -> None:
        """Point every process of ``pids`` that changed user (and was not pointed yet, for
        that user) at its user's folder. Failures are left to the rounds of dumps to note."""
        from heapscope.capture.control import call_each
        from heapscope.capture.mallctl import Op

        todo: dict[int, str] = {}
        for pid in pids:
            prefix = self.prefix_for(pid)
            if prefix is None:
                continue
            # pointed: the uid its prefix was set for; -1 for its folder in another root
            want = -1 if pid in self.drops else self.users.get(pid)
            if self.pointed.get(pid) != want:
                todo[pid] = prefix
        if not todo:
            return
        try:
            got = call_each(sorted(todo), [Op("prof.prefix", "str", todo, True)],
                            timeout=10.0, retries=1)
        except HeapscopeError:
            return
        for pid, r in got.items():
            if not isinstance(r, HeapscopeError) and r.rcs.get("prof.prefix", 0) == 0:
                self.pointed[pid] = -1 if pid in self.drops else self.users[pid]

    def collect(self, dumps_dir: str) -> list[str]:
        """Copy the dumps the switched processes wrote into ``dumps_dir``; notes on what
        was left out."""
        notes: list[str] = []
        out = os.open(dumps_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for uid, folder in sorted(self.folders.items()):
                notes += _copy_folder(folder, uid, out)
            for pid, (drop, nspid) in sorted(self.drops.items()):
                try:
                    notes += _copy_drop(drop, pid, nspid, out)
                finally:
                    drop.close()  # nothing of heapscope's is left inside the container
            self.drops.clear()
        finally:
            os.close(out)
        return notes

    def close(self) -> None:
        """Remove the folders made inside other roots (when the run ends without
        :meth:`collect`)."""
        for drop, _ in self.drops.values():
            drop.close()
        self.drops.clear()


def _copy_folder(folder: str, uid: int, out: int) -> list[str]:
    notes: list[str] = []
    try:
        src = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        return [f"{folder}: {e.strerror}"]
    try:
        for name in sorted(os.listdir(src)):
            if not name.startswith("jeprof.") or not name.endswith(".heap") or "/" in name:
                continue
            problem = _copy_one(name, src, uid, out)
            if problem:
                notes.append(f"{os.path.join(folder, name)}: {problem}")
    finally:
        os.close(src)
    return notes


def _copy_drop(drop: Drop, pid: int, nspid: int, out: int) -> list[str]:
    """Copy the dumps a process in another root wrote into its folder there, named with
    the host's pid instead of the one it has in its namespace."""
    notes: list[str] = []
    uid = os.fstat(drop.fd).st_uid
    theirs = f"jeprof.{nspid}."
    for name in sorted(os.listdir(drop.fd)):
        if not name.startswith(theirs) or not name.endswith(".heap") or "/" in name:
            continue
        host_name = f"jeprof.{pid}.{name[len(theirs):]}"
        problem = _copy_one(name, drop.fd, uid, out, host_name)
        if problem:
            notes.append(f"pid {pid}: {drop.path(name)} inside its root: {problem}")
    return notes


def _copy_one(name: str, src: int, uid: int, out: int, as_name: str = "") -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    except OSError as e:
        return f"not copied ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not copied (not a regular file)"
        if st.st_uid != uid:
            return f"not copied (owned by uid {st.st_uid}, not by {uid} who wrote there)"
        if st.st_size > MAX_DUMP:
            return f"not copied ({st.st_size} bytes)"
        try:
            dst = os.open(as_name or name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                          | os.O_NOFOLLOW, 0o600, dir_fd=out)
        except FileExistsError:
            return "not copied (dumps/ has a dump of that name)"
        try:
            while chunk := os.read(fd, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view):]
        finally:
            os.close(dst)
    finally:
        os.close(fd)
    return None
