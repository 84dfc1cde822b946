"""A session folder: everything one profiled run produced, readable by every command.

Layout::

    SESSION/
      manifest.json        command, cwd, times, exit status, MALLOC_CONF, jemalloc, processes
      dumps/               jemalloc's own dumps, jeprof.<pid>.<seq>.<kind>.heap, plus the
                           perf-<pid>.map files of JIT runtimes
      symbolized/          a self-contained copy of each dump (<dump>.json.gz) with its symbols
      jemalloc.log         what jemalloc printed, a line each as "<pid>\t<message>" (kept by
                           the helper heapscope preloads; the program's own output is its own)
      leak-summaries.txt   jemalloc's "<jemalloc>: Leak approximation summary" lines
      rss.csv              t_seconds,pid,rss_bytes for every process of the tree, written as
                           it is sampled
      report.json          the leak report printed at exit

A session is never written into an existing non-empty folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import time
from typing import Any

from heapscope.capture import access
from heapscope.capture.access import DumpOwner
from heapscope.errors import InputError
from heapscope.files import create_new, open_regular
from heapscope.symbols.options import ModuleFacts

MANIFEST = "manifest.json"
MAX_MANIFEST = 64 << 20  # a manifest is a few KB; more is not one


def default_name(cmd: list[str], now: float | None = None) -> str:
    """``heapscope-<prog>-<YYYYmmdd-HHMMSS>`` for a command."""
    prog = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(cmd[0]) or "program")[:40]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"heapscope-{prog}-{stamp}"


def create(path: str | None, cmd: list[str], owner: DumpOwner | None = None) -> str:
    """Create the session folder and its ``dumps/``; fail clearly rather than overwrite.

    The session is the caller's alone (mode 0700). When the program's dumps are written by
    another user (``owner``: a server that drops privileges), ``dumps/`` belongs to that user
    (mode 0700) and the session folder lets only that user's group pass through it (0710, no
    listing). Modes and owners are set on open descriptors, never on paths that could be
    swapped for a link between two calls.
    """
    me = access.caller()
    owner = owner or me
    if path is None:
        base = default_name(cmd)
        path, n = base, 1
        while True:
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:  # taken (perhaps just now): the next free name
                n += 1
                path = f"{base}-{n}"
            except OSError as e:
                raise InputError(os.path.abspath(path), "cannot write the session there: "
                                 f"{e.strerror or e}") from None
    else:
        try:
            # Missing parents are made as mkdir -p would; the session itself must be new.
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            _check_reusable(os.path.abspath(path), me.uid)
        except OSError as e:
            raise InputError(os.path.abspath(path), "cannot write the session there: "
                             f"{e.strerror or e}") from None
    path = os.path.abspath(path)
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError as e:
        raise InputError(path, f"cannot open the session folder: {e.strerror or e}") from None
    try:
        st = os.fstat(top)
        if st.st_uid != me.uid or os.listdir(top):
            # Swapped or filled between the check and the open.
            raise InputError(path, "folder changed while the session was created; "
                             "choose another -o")
        shared = owner.uid != me.uid
        if shared:
            os.fchown(top, -1, owner.gid)
        os.fchmod(top, 0o710 if shared else 0o700)
        for name in ("dumps", "symbolized"):
            os.mkdir(name, 0o700, dir_fd=top)
        sub = os.open("dumps", _DIR_FLAGS, dir_fd=top)
        try:
            if shared:
                os.fchown(sub, owner.uid, owner.gid)
            os.fchmod(sub, 0o700)
        finally:
            os.close(sub)
    except OSError as e:
        raise InputError(path, f"cannot write the session there: "
                         f"{e.strerror or e}") from None
    finally:
        os.close(top)
    return path


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _check_reusable(path: str, uid: int) -> None:
    """An existing ``-o`` folder is used only when it is an empty folder of the caller's
    that no one else can write into (or plant links in) while the session is written."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise InputError(path, "is a symbolic link; choose another -o")
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(path, "exists and is not a folder; choose another -o")
    if st.st_uid != uid or st.st_mode & 0o022:
        raise InputError(path, f"folder is not yours alone (owner uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):o}); choose another -o")
    if os.listdir(path):
        # An existing output is refused with exit 3, as by every command; a session is
        # never replaced, not even with --force (it holds a run that cannot be repeated).
        raise InputError(path, "folder exists and is not empty; heapscope never overwrites "
                               "a session, choose another -o")


def access_facts(owner: DumpOwner | None) -> dict[str, Any]:
    """The manifest's ``access`` entry: who may write the dumps and who may read them."""
    me = access.caller()
    owner = owner or me
    readers = sorted({"root", me.name, owner.name})
    return {"session_mode": "0710" if owner.uid != me.uid else "0700",
            "session_owner": me.as_dict(), "dumps_owner": owner.as_dict(),
            "dumps_mode": "0600", "readable_by": readers}


def seal_dumps(session: str) -> None:
    """Make each dump readable by its owner only (0600): jemalloc creates them 0644 under
    the program's umask."""
    folder = os.path.join(session, "dumps")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        seal(os.path.join(folder, name))


def seal(path: str) -> None:
    """chmod 0600 a regular file, through a descriptor opened without following links."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, 0o600)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        "host": _hostname(),
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
                with open_regular(src) as fin, create_new(dst, 0o600) as fout:
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


def unfinished(manifest: dict[str, Any]) -> str | None:
    """A note when the ``heapscope run`` that wrote this session has not ended it: still
    running, or killed before the program ended (None for a finished run or an attach)."""
    owner = manifest.get("heapscope_pid")
    if "end_time" in manifest or not isinstance(owner, int) or isinstance(owner, bool):
        return None
    try:
        with open(f"/proc/{owner}/cmdline", "rb") as f:
            alive = b"heapscope" in f.read() and _started_before(owner, manifest)
    except OSError:
        alive = False
    if alive:
        return (f"the run is still going (heapscope pid {owner}): this is what its dumps "
                "show so far")
    return (f"the run did not finish: heapscope (pid {owner}) ended before the program did "
            "(killed?); verdicts rest on the dumps written until then, and processes that "
            "ended later still wrote their final dump")


def _started_before(pid: int, manifest: dict[str, Any]) -> bool:
    """True when process ``pid`` started no later than the session (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    started = boot + ticks / os.sysconf("SC_CLK_TCK")
    start = manifest.get("start_time")
    return not isinstance(start, (int, float)) or started <= start + 2


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
            out[str(path)] = {k: facts.get(k) for k in ("build_id", "size", "mtime_ns",
                                                         "root")}
    return out


def recorded_facts(manifest: dict[str, Any]) -> dict[str, ModuleFacts]:
    """:func:`recorded_modules` as the symbolizer takes them."""
    out: dict[str, ModuleFacts] = {}
    for module, f in recorded_modules(manifest).items():
        size, mtime = f.get("size"), f.get("mtime_ns")
        out[module] = ModuleFacts(str(f.get("build_id") or ""),
                                  size if isinstance(size, int) else None,
                                  mtime if isinstance(mtime, int) else None,
                                  str(f.get("root") or ""))
    return out


def _hostname() -> str:
    """This machine's name (socket imported here: reading a session does not need it)."""
    import socket

    return socket.gethostname()
