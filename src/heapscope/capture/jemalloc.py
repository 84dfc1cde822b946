"""Find a jemalloc that can profile, by asking the library itself, and inspect targets.

A shared ``libjemalloc.so*`` is probed in a short child process that preloads it and reads
``version`` and ``config.prof`` through ``mallctl`` (the name of a file says nothing about how it
was built). A target executable may instead carry its own jemalloc, linked statically or with
tikv-jemallocator's ``_rjem_`` prefix; then it is configured through ``_RJEM_MALLOC_CONF`` or
``MALLOC_CONF`` and nothing is preloaded.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from heapscope.errors import ToolError
from heapscope.symbols.elf import ElfError
from heapscope.symbols.symtab import defined_functions

INSTALL_HINT = (
    "install a jemalloc built with profiling: Debian/Ubuntu: apt-get install libjemalloc2; "
    "Fedora/RHEL: dnf install jemalloc; Alpine: apk add jemalloc (Alpine's package has no "
    "profiling: build jemalloc with ./configure --enable-prof); or pass --jemalloc PATH"
)

_CANDIDATE_GLOBS = (
    "/usr/lib/*/libjemalloc.so*",
    "/usr/lib64/libjemalloc.so*",
    "/usr/lib/libjemalloc.so*",
    "/usr/local/lib/libjemalloc.so*",
    "/usr/local/lib64/libjemalloc.so*",
    "/opt/*/lib/libjemalloc.so*",
)

_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(None)
try:
    mallctl = lib[sys.argv[1] + "mallctl"]
except (AttributeError, KeyError):
    print(json.dumps({"jemalloc": False})); sys.exit(0)
def read(name, ctype):
    val = ctype(); size = ctypes.c_size_t(ctypes.sizeof(val))
    rc = mallctl(name.encode(), ctypes.byref(val), ctypes.byref(size), None, 0)
    return rc, val
rc, ver = read("version", ctypes.c_char_p)
rc2, prof = read("config.prof", ctypes.c_bool)
print(json.dumps({"jemalloc": True, "version": (ver.value or b"").decode() if rc == 0 else "",
                  "prof": bool(prof.value) if rc2 == 0 else False}))
"""


@dataclass(frozen=True)
class JemallocLib:
    """A jemalloc to profile with: where it is, its version, whether it can profile."""

    path: str  # the shared library to preload, or the executable that links jemalloc
    version: str
    prof: bool
    prefix: str = ""  # "_rjem_" for tikv-jemallocator builds
    preload: bool = True  # False when the target carries its own jemalloc


def probe(path: str) -> JemallocLib | None:
    """Ask a shared library whether it is jemalloc and was built with profiling."""
    if not os.path.isfile(path):
        return None
    env = dict(os.environ, LD_PRELOAD=path)
    env.pop("MALLOC_CONF", None)
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, ""], env=env, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        facts = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not facts.get("jemalloc"):
        return None
    return JemallocLib(path=path, version=facts.get("version", ""), prof=bool(facts["prof"]))


def candidates() -> list[str]:
    """Shared jemalloc libraries on this machine, most conventional first."""
    found: list[str] = []
    for pattern in _CANDIDATE_GLOBS:
        found.extend(p for p in sorted(glob.glob(pattern)) if ".so" in os.path.basename(p))
    # Prefer the runtime soname (libjemalloc.so.2) over the development symlink.
    found.sort(key=lambda p: (not p.endswith(".so.2"), p.endswith(".so")))
    env = os.environ.get("HEAPSCOPE_JEMALLOC")
    if env:
        found.insert(0, env)
    out: list[str] = []
    seen: set[str] = set()
    for path in found:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return out


def find_jemalloc(explicit: str | None = None) -> JemallocLib:
    """The jemalloc to preload: ``explicit`` if given, else the first with profiling."""
    if explicit:
        lib = probe(explicit)
        if lib is None:
            raise ToolError(f"{explicit}: not a jemalloc shared library; {INSTALL_HINT}")
        if not lib.prof:
            raise ToolError(f"{explicit}: jemalloc {lib.version} was built without profiling "
                            f"(config.prof is false); {INSTALL_HINT}")
        return lib
    seen_without: list[JemallocLib] = []
    for path in candidates():
        lib = probe(path)
        if lib is None:
            continue
        if lib.prof:
            return lib
        seen_without.append(lib)
    if seen_without:
        names = ", ".join(f"{lib.path} ({lib.version})" for lib in seen_without)
        raise ToolError(f"no jemalloc with profiling: {names} lack config.prof; {INSTALL_HINT}")
    raise ToolError(f"no jemalloc found; {INSTALL_HINT}")


@dataclass(frozen=True)
class Target:
    """What the launched executable says about its allocator."""

    path: str | None  # resolved executable, None when not found
    elf: bool
    own_jemalloc: bool  # jemalloc linked into the executable (static, or prefixed)
    prefix: str  # "_rjem_" for tikv-jemallocator, else ""
    prof_symbols: bool  # symbols of jemalloc's profiler are present
    is_java: bool


def resolve_command(name: str) -> str | None:
    """The executable that ``name`` runs, as the shell would find it; None if none."""
    if "/" in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name)


def inspect_target(name: str) -> Target:
    """Look inside the executable for a jemalloc of its own and for a JVM."""
    path = resolve_command(name)
    if path is None:
        return Target(None, False, False, "", False, False)
    is_java = os.path.basename(os.path.realpath(path)) == "java"
    try:
        names = defined_functions(path)
    except ElfError:  # a script, or not an executable we can read
        return Target(path, False, False, "", False, is_java)
    prefix = "_rjem_" if "_rjem_mallctl" in names else ""
    own = prefix != "" or "mallctl" in names
    prof = any("prof_backtrace" in n for n in names)
    return Target(path, True, own, prefix, prof, is_java)
