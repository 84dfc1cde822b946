"""Hints on how to get the debug info a module lacks: which ``-dbgsym`` package holds it on
this Debian or Ubuntu system, which debuginfod server has it, or ``--debug-dir``.

The symbolizer only records which modules had no debug info (a :class:`Diagnostic` with
``path`` and ``build_id``); the CLI decides which of them deserve a hint and prints it. Asking
the package manager which package owns a file is a small protocol (:class:`Owners`) so that
tests can swap it; the real one runs ``dpkg-query -S`` once for all the files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import NamedTuple

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
    tool = shutil.which("dpkg-query")
    if tool is None or not paths:
        return {}
    asked = {alias: path for path in paths for alias in reversed(_aliases(path))}
    try:
        # Exit status 1 when some path is unknown: the lines for the others are still there.
        done = subprocess.run([tool, "-S", *asked], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        # "zlib1g:amd64: /lib/x86_64-linux-gnu/libz.so.1" ("diversion by …" lines aside)
        packages, sep, file = line.partition(": ")
        if not sep or file not in asked or " " in packages.strip():
            continue
        first = packages.split(",")[0].strip()
        out.setdefault(asked[file], first.split(":")[0])
    return out


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
