"""A session folder: everything one profiled run produced, readable by every command.

Layout::

    SESSION/
      manifest.json        command, cwd, times, exit status, MALLOC_CONF, jemalloc, processes
      dumps/               jemalloc's own dumps, jeprof.<pid>.<seq>.<kind>.heap, plus the
                           perf-<pid>.map files of JIT runtimes
      symbolized/          a self-contained copy of each dump (<dump>.json.gz) with its symbols
      stderr.log           the program's stderr, as it printed it
      leak-summaries.txt   jemalloc's "<jemalloc>: Leak approximation summary" lines
      rss.csv              t_seconds,pid,rss_bytes for every process of the tree
      report.json          the leak report printed at exit

A session is never written into an existing non-empty folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from typing import Any

from heapscope.errors import UsageError
from heapscope.files import create_new, open_regular

MANIFEST = "manifest.json"
MAX_MANIFEST = 64 << 20  # a manifest is a few KB; more is not one


def default_name(cmd: list[str], now: float | None = None) -> str:
    """``heapscope-<prog>-<YYYYmmdd-HHMMSS>`` for a command."""
    prog = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(cmd[0]) or "program")[:40]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"heapscope-{prog}-{stamp}"


def create(path: str | None, cmd: list[str]) -> str:
    """Create the session folder and its ``dumps/``; fail clearly rather than overwrite.

    When heapscope runs as root the dumps folder is made world-writable (sticky), because the
    profiled program may drop privileges (``runuser``, ``su``, a server's own setuid) and its
    jemalloc must still be able to write there.
    """
    if path is None:
        base = default_name(cmd)
        path = base
        n = 1
        while os.path.exists(path):
            n += 1
            path = f"{base}-{n}"
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(f"{path}: exists and is not a folder; choose another -o")
        if os.listdir(path):
            raise UsageError(f"{path}: folder exists and is not empty; heapscope never "
                             "overwrites a session, choose another -o")
        st = os.lstat(path)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            # Someone else could plant files (links) in it while the session is written.
            raise UsageError(f"{path}: folder is not yours alone (owner uid {st.st_uid}, mode "
                             f"{stat.S_IMODE(st.st_mode):o}); choose another -o")
    try:
        os.makedirs(os.path.join(path, "dumps"), exist_ok=True)
        os.makedirs(os.path.join(path, "symbolized"), exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=os.path.join(path, "dumps"))
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{path}: cannot write the session there: "
                         f"{e.strerror or e}") from None
    if os.geteuid() == 0:
        os.chmod(os.path.join(path, "dumps"), 0o1777)
    return path


def write_json(path: str, data: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def manifest_base(cmd: list[str], env_name: str, conf: str, jemalloc: dict[str, Any],
                  start: float) -> dict[str, Any]:
    """The part of the manifest known before the program starts."""
    return {
        "format": "heapscope-session",
        "version": 1,
        "command": cmd,
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "start_time": start,
        "conf_variable": env_name,
        "malloc_conf": conf,
        "jemalloc": jemalloc,
    }


def collect_perf_maps(session: str, pids: list[int]) -> list[str]:
    """Copy ``/tmp/perf-<pid>.map`` of the session's processes next to their dumps."""
    copied = []
    for pid in pids:
        src = f"/tmp/perf-{pid}.map"
        if os.path.isfile(src):
            dst = os.path.join(session, "dumps", os.path.basename(src))
            try:
                # Read only as a regular file, write only a new file (no planted link).
                with open_regular(src) as fin, create_new(dst) as fout:
                    shutil.copyfileobj(fin, fout)
                copied.append(dst)
            except OSError:
                continue
    return copied


def read_manifest(session: str) -> dict[str, Any]:
    """The manifest of a session folder ({} when absent or unreadable)."""
    try:
        with open_regular(os.path.join(session, MANIFEST)) as f:
            data = json.loads(f.read(MAX_MANIFEST + 1)[:MAX_MANIFEST].decode("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def module_facts(paths: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``{path: {build_id, size, mtime_ns}}`` for modules as they are now: what a session
    records when its dumps are taken, so that a file rebuilt later is never used to name
    them. ``paths`` maps each module's path to the file to read it from (the same path, or
    ``/proc/PID/map_files/…`` for the very file a live process has mapped)."""
    from heapscope.symbols.elf import ElfError, ElfInfo

    out: dict[str, dict[str, Any]] = {}
    for path, source in paths.items():
        try:
            st = os.stat(source)
            build_id = ElfInfo.read(source).build_id
        except (OSError, ElfError):
            continue
        out[path] = {"build_id": build_id, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return out


def mapped_modules(pid: int) -> dict[str, str]:
    """A live process's executable file mappings: path -> ``/proc/PID/map_files/…`` (the
    mapped file itself, even when the path now names another one)."""
    out: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or "x" not in parts[1]:
                    continue
                path = parts[5].rstrip("\n")
                path = path.removesuffix(" (deleted)")
                if path.startswith("/") and path not in out:
                    out[path] = f"/proc/{pid}/map_files/{parts[0]}"
    except OSError:
        return {}
    return out


def recorded_modules(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The module facts a manifest recorded (older sessions recorded build-ids only)."""
    raw = manifest.get("modules")
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(raw, dict):
        return out
    for path, facts in raw.items():
        if isinstance(facts, str):
            out[str(path)] = {"build_id": facts}
        elif isinstance(facts, dict):
            out[str(path)] = {k: facts.get(k) for k in ("build_id", "size", "mtime_ns")}
    return out
