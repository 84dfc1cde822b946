"""Hints on how to get the debug info a module lacks: which ``-dbgsym`` package holds it on
this Debian or Ubuntu system, which debuginfod server has it, or ``--debug-dir``.

The symbolizer only records which modules had no debug info (a :class:`Diagnostic` with
``path`` and ``build_id``); the CLI decides which of them deserve a hint and prints it. Asking
the package manager which package owns a file is a small protocol (:class:`Owners`) so that
tests can swap it; the real one runs ``dpkg-query -S`` once for all the files, and
:func:`cached_owners` keeps its answers in heapscope's cache folder (the query costs ~45 ms,
on every run that hints).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from heapscope.files import Stamp, open_private, stamp

# Which package owns each file: path -> binary package name (without ":arch").
Owners = Callable[[Sequence[str]], dict[str, str]]

# Per distribution: where its -dbgsym packages come from, and its debuginfod server.
_ARCHIVES = {
    "debian": ("deb http://deb.debian.org/debian-debug {codename}-debug main",
               "https://debuginfod.debian.net"),
    "ubuntu": ("deb http://ddebs.ubuntu.com {codename} main",
               "https://debuginfod.ubuntu.com"),
}
# Top-level folders that /usr-merge made links into /usr: dpkg may know a file by either name.
_MERGED = ("/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")
# dpkg rewrites this file on every install and removal: a cached owner is only good while it
# is unchanged.
DPKG_STATUS = "/var/lib/dpkg/status"
# The cached owners, in the cache folder (see :func:`cached_owners`).
OWNERS_FILE = ("hints", "owners.json")
_FORMAT = 1


class Missing(NamedTuple):
    """A module that had no debug info: its short name, file and build-id ("" if none)."""

    name: str
    path: str
    build_id: str


def _aliases(path: str) -> list[str]:
    """The names dpkg may know a file by: as given, its real path, and each with or without
    the ``/usr`` prefix (Debian 12 packages list ``/lib/…`` for files under ``/usr/lib``)."""
    names = [path, os.path.realpath(path)]
    out: list[str] = []
    for name in names:
        out.append(name)
        if name.startswith("/usr/") and name[4:].startswith(_MERGED):
            out.append(name[4:])
        elif name.startswith(_MERGED):
            out.append("/usr" + name)
    return list(dict.fromkeys(out))


def dpkg_owners(paths: Sequence[str]) -> dict[str, str]:
    """The Debian package owning each path dpkg knows (one ``dpkg-query -S`` for them all)."""
    return _dpkg_query(paths) or {}


def _dpkg_query(paths: Sequence[str]) -> dict[str, str] | None:
    """:func:`dpkg_owners`, or None when dpkg could not be asked (no answer to keep)."""
    tool = shutil.which("dpkg-query")
    if tool is None:
        return None
    if not paths:
        return {}
    asked = {alias: path for path in paths for alias in reversed(_aliases(path))}
    try:
        # Exit status 1 when some path is unknown: the lines for the others are still there.
        done = subprocess.run([tool, "-S", *asked], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode not in (0, 1):
        return None  # 1: some path unknown; anything else: dpkg itself failed
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        # "zlib1g:amd64: /lib/x86_64-linux-gnu/libz.so.1" ("diversion by …" lines aside)
        packages, sep, file = line.partition(": ")
        if not sep or file not in asked or " " in packages.strip():
            continue
        first = packages.split(",")[0].strip()
        out.setdefault(asked[file], first.split(":")[0])
    return out


def cached_owners(cache_dir: str | None,
                  ask: Callable[[Sequence[str]], dict[str, str] | None] | None = None,
                  status: str | None = None) -> Owners:
    """:func:`dpkg_owners` remembering its answers in ``cache_dir`` (None: no cache).

    A file's answer (its package, or that none owns it) is kept with the file's
    :data:`~heapscope.files.Stamp` (size, mtime, inode: a new build of the library is a new
    file) and holds while dpkg's status file is unchanged (nothing installed or removed
    since). Only the files without a good answer are asked about, all at once; an answer
    dpkg could not give (``ask`` returns None) is not kept. ``ask`` and ``status`` replace
    dpkg's query and status file (tests).
    """
    query = _dpkg_query if ask is None else ask
    status = DPKG_STATUS if status is None else status

    def owners(paths: Sequence[str]) -> dict[str, str]:
        if cache_dir is None:
            return query(paths) or {}
        where = os.path.join(cache_dir, *OWNERS_FILE)
        db = stamp(status)
        known = _load_owners(where, db)
        stamps = {path: stamp(path) for path in paths}
        out: dict[str, str] = {}
        todo: list[str] = []
        for path in paths:
            hit = known.get(path)
            if hit is not None and stamps[path] is not None and hit[0] == stamps[path]:
                if hit[1]:
                    out[path] = hit[1]
            else:
                todo.append(path)
        if not todo:
            return out
        found = query(todo)
        if found is None:
            return out
        out.update(found)
        if db is not None:
            for path in todo:
                if stamps[path] is not None:
                    known[path] = (stamps[path], found.get(path, ""))
            _store_owners(where, db, known)
        return out

    return owners


def _load_owners(where: str, db: Stamp) -> dict[str, tuple[Stamp, str]]:
    """The cached answers (path -> file stamp, package or ""), if made with dpkg's status
    file as it is now; nothing when missing, another user's, corrupt or stale."""
    if db is None:
        return {}
    import json  # here: only runs that hint read it

    try:
        fh = open_private(where)
        if fh is None:
            return {}
        with fh:
            data: Any = json.loads(fh.read().decode("utf-8"))
        if (not isinstance(data, dict) or data.get("format") != _FORMAT
                or data.get("dpkg") != list(db) or not isinstance(data.get("files"), dict)):
            return {}
        out: dict[str, tuple[Stamp, str]] = {}
        for path, row in data["files"].items():
            if (isinstance(row, list) and len(row) == 4
                    and all(type(x) is int for x in row[:3]) and type(row[3]) is str):
                out[path] = ((row[0], row[1], row[2]), row[3])
        return out
    except (OSError, ValueError):
        return {}


def _store_owners(where: str, db: Stamp, known: dict[str, tuple[Stamp, str]]) -> None:
    """Write the answers atomically, readable and writable by this user alone; failures
    (read-only or full disk) are ignored: the cache only saves a query."""
    import json
    import tempfile

    assert db is not None
    files = {path: [*file, package] for path, (file, package) in known.items()
             if file is not None}
    text = json.dumps({"format": _FORMAT, "dpkg": list(db), "files": files},
                      separators=(",", ":"))
    tmp = None
    try:
        os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(where), prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, where)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def os_release(path: str = "/etc/os-release") -> dict[str, str]:
    """The fields of os-release(5) (empty when the file is missing)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep:
                    fields[key] = value.strip().strip("\"'")
    except OSError:
        pass
    return fields


def _distro(release: dict[str, str]) -> str:
    """``debian``, ``ubuntu`` or "" (another system)."""
    ids = [release.get("ID", ""), *release.get("ID_LIKE", "").split()]
    if "ubuntu" in ids:
        return "ubuntu"
    return "debian" if "debian" in ids else ""


def debug_hints(missing: Sequence[Missing], owners: Owners = dpkg_owners,
                release: dict[str, str] | None = None) -> dict[str, str]:
    """One line per module (by path) saying how to get its debug info on this system.

    On Debian and Ubuntu the owning package's ``-dbgsym`` package and the archive it is in
    (packages are asked about all at once); the distribution's debuginfod server only for a
    module with a build-id (that is what the server is asked by); ``--debug-dir`` always.
    """
    release = os_release() if release is None else release
    distro = _distro(release)
    owned = owners([m.path for m in missing]) if distro else {}
    codename = release.get("VERSION_CODENAME", "") or "CODENAME"
    hints: dict[str, str] = {}
    for m in missing:
        ways: list[str] = []
        package = owned.get(m.path)
        if package:
            archive = _ARCHIVES[distro][0].format(codename=codename)
            ways.append(f"install {package}-dbgsym (from '{archive}')")
        if m.build_id and distro:
            ways.append(f"set DEBUGINFOD_URLS={_ARCHIVES[distro][1]}")
        elif m.build_id:
            ways.append("set DEBUGINFOD_URLS to a debuginfod server")
        ways.append("pass --debug-dir DIR with its debug file")
        hints[m.path] = f"hint: {m.name}: no debug info; to get names, " + ", or ".join(ways)
    return hints
