"""Live control of a running process's jemalloc profiler: status, dumps, prof.active, windows.

Each step is one round of ``mallctl`` calls (:mod:`heapscope.capture.control`) in
the target; nothing stays attached while heapscope waits. Dumps land in a session folder
(``heapscope-attach-<pid>-<time>``) laid out like ``heapscope run``'s, so every other command
opens it: ``manifest.json`` names the process and its jemalloc, ``dumps/`` holds
``jeprof.<pid>.<n>.m<n>.heap``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heapscope.analysis.leaks import LeakReport, find_leaks
from heapscope.analysis.ownership import exe_aliases, facts_from_manifest
from heapscope.analysis.series import ProcessSeries, group_by_pid, load_series
from heapscope.capture import session as sess
from heapscope.capture.access import DumpOwner, user_name
from heapscope.capture.container import (
    Confinement,
    ContainerError,
    Drop,
    confinement,
    container_modules,
)
from heapscope.capture.control import call
from heapscope.capture.mallctl import AttachError, CallResult, Op
from heapscope.capture.procevents import read_image
from heapscope.errors import InputError, UsageError
from heapscope.formats.load import parse_dump_name
from heapscope.safetext import json_ready
from heapscope.symbols import SymbolOptions

STATS = ("allocated", "active", "resident", "mapped", "retained")
_EFAULT = 14


@dataclass(frozen=True)
class AttachOptions:
    """How to attach: how long to wait for each call, and the retries while no thread can
    run it."""

    timeout: float = 60.0
    retries: int = 2
    retry_delay: float = 0.05


@dataclass
class AttachLog:
    """What the attaches cost the target: how long a thread was held, and the retries."""

    attaches: int = 0
    retries: int = 0
    busy: int = 0  # attaches where a thread looked at was inside the allocator
    stopped_s: list[float] = field(default_factory=list)
    modes: dict[str, int] = field(default_factory=dict)

    def add(self, r: CallResult) -> None:
        self.attaches += 1
        self.retries += r.retries
        self.busy += 1 if r.busy_threads else 0
        self.stopped_s.append(r.stopped_s)
        self.modes[r.mode] = self.modes.get(r.mode, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"attaches": self.attaches, "retries": self.retries,
                "found_thread_in_allocator": self.busy,
                "max_stopped_s": max(self.stopped_s, default=0.0), "ways": self.modes}

    def line(self) -> str:
        n = self.attaches
        head = f"{n} attach{'es' if n != 1 else ''}"
        if set(self.modes) == {"helper"}:
            return f"{head} through the process's helper: no stop"
        worst = max(self.stopped_s, default=0.0) * 1000
        retried = (f"; retried {self.retries} time{'s' if self.retries != 1 else ''}"
                   if self.retries else "")
        if "call" in self.modes:
            return f"{head}: held at most {worst:.0f} ms (through gdb){retried}"
        return f"{head}: one thread held at most {worst:.1f} ms, the others ran on{retried}"


class Controller:
    """One target process and the attaches made to it."""

    def __init__(self, pid: int, opts: AttachOptions | None = None) -> None:
        self.pid = pid
        self.opts = opts or AttachOptions()
        self.log = AttachLog()
        self.symbol = ""
        self._confined: tuple[Confinement | None] | None = None

    @property
    def confined(self) -> Confinement | None:
        """How the target is set apart from heapscope (another root or mount namespace: a
        container), looked at once; None for a process that sees what heapscope sees."""
        if self._confined is None:
            self._confined = (confinement(self.pid),)
        return self._confined[0]

    def run(self, ops: list[Op], *, need_prof: bool = True) -> CallResult:
        r = call(self.pid, ops, need_prof=need_prof, timeout=self.opts.timeout,
                 retries=self.opts.retries, retry_delay=self.opts.retry_delay)
        self.log.add(r)
        self.symbol = r.symbol
        return r

    # ---- actions --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """jemalloc's version, profiling state and heap statistics."""
        ops = [Op("version", "str"), Op("config.prof", "bool"), Op("opt.prof", "bool"),
               Op("prof.active", "bool"), Op("opt.prof_active", "bool"),
               Op("prof.lg_sample", "size_t"), Op("opt.lg_prof_sample", "size_t"),
               Op("opt.prof_prefix", "str"), Op("opt.lg_prof_interval", "ssize_t"),
               Op("epoch", "uint64", 1, True)]
        ops += [Op(f"stats.{s}", "size_t") for s in STATS]
        r = self.run(ops, need_prof=False)
        v = r.values
        lg = v.get("prof.lg_sample", v.get("opt.lg_prof_sample"))
        return {
            "pid": self.pid,
            **process_info(self.pid),
            "symbol": r.symbol,
            "version": v.get("version"),
            "config_prof": bool(v.get("config.prof")),
            "opt_prof": bool(v.get("opt.prof")),
            "prof_active": v.get("prof.active") if r.rcs.get("prof.active") == 0 else None,
            "lg_sample": lg,
            "sample_bytes": (1 << lg) if isinstance(lg, int) else None,
            "prof_prefix": v.get("opt.prof_prefix"),
            "lg_prof_interval": v.get("opt.lg_prof_interval"),
            "stats": {s: v.get(f"stats.{s}") for s in STATS},
            "container": self.confined.as_dict() if self.confined is not None else None,
            "attach": {"threads": r.threads, "threads_in_allocator": r.busy_threads,
                       "caller_tid": r.caller_tid, "mode": r.mode,
                       "retries": r.retries, "stopped_s": r.stopped_s,
                       "wall_s": round(r.wall_s, 3)},
        }

    def set_active(self, active: bool) -> bool:
        """Write prof.active; return the value it had before."""
        r = self.run([Op("prof.active", "bool"), Op("prof.active", "bool", active, True)])
        if r.rcs.get("prof.active", 0) != 0:
            raise AttachError(f"pid {self.pid}: setting prof.active failed "
                              f"(errno {r.rcs['prof.active']})")
        return bool(r.values.get("prof.active"))

    def reset(self, lg_sample: int | None) -> int | None:
        """prof.reset (with a new sample period when given); return prof.lg_sample after."""
        r = self.run([Op("prof.reset", "size_t", lg_sample, True),
                      Op("prof.lg_sample", "size_t")])
        if r.rcs.get("prof.reset", 0) != 0:
            raise AttachError(f"pid {self.pid}: prof.reset failed (errno {r.rcs['prof.reset']})")
        lg = r.values.get("prof.lg_sample")
        return lg if isinstance(lg, int) else None

    def dump(self, path: str, extra: list[Op] | None = None) -> CallResult:
        """Have the target write a dump to ``path`` (absolute), then check it is there.

        A target in a container cannot see ``path``: it writes into a private folder made
        inside its own root, and the dump is copied out to ``path`` (see :class:`Drop`)."""
        path = os.path.abspath(path)
        if self.confined is None:
            r = self.run([Op("prof.dump", "str", path, True), *(extra or [])])
            rc = r.rcs.get("prof.dump", 0)
            if rc != 0 or not os.path.exists(path):
                raise AttachError(dump_problem(self.pid, path, rc))
        else:
            with open_drop(self.pid) as drop:
                inside = drop.path(os.path.basename(path))
                r = self.run([Op("prof.dump", "str", inside, True), *(extra or [])])
                rc = r.rcs.get("prof.dump", 0)
                if rc != 0 or not drop.collect(os.path.basename(path), path):
                    raise AttachError(dump_problem(self.pid, inside, rc, confined=True))
        sess.seal(path)
        record_modules(os.path.dirname(os.path.dirname(path)), self.pid, path)
        return r


def open_drop(pid: int) -> Drop:
    """The private folder inside a confined target's root its dumps are written to."""
    try:
        return Drop(pid, _ids(pid))
    except OSError as e:
        why = str(e) if isinstance(e, ContainerError) else e.strerror or str(e)
        raise AttachError(f"pid {pid} runs in another root (a container): heapscope could "
                          f"not make a folder for its dumps inside it: {why}") from None


def record_modules(session: str, pid: int, dump: str = "") -> None:
    """Add to the session's manifest the build-id, size and mtime of each file the target
    has mapped executable and the manifest does not list yet (read through
    /proc/PID/map_files: the very file that runs, even if its path was replaced).

    A target in a container names its files by its own paths (those of ``dump``'s memory
    map): each is recorded with the host path of the container's root, where the
    symbolizer then finds it (``/proc/PID/root`` when the root has no lasting host path:
    valid while the process lives; ``--sysroot`` after)."""
    m = sess.read_manifest(session)
    if not m:
        return
    box = confinement(pid)
    if box is not None and not dump:
        return  # the host's /proc names its files by host paths, not those of its dumps
    mapped = container_modules(pid, dump) if box is not None else sess.mapped_modules(pid)
    known = sess.recorded_modules(m)
    new = {p: src for p, src in mapped.items() if p not in known}
    if new:
        facts = sess.module_facts(new)
        if box is not None:
            for f in facts.values():
                f["root"] = box.root
        m["modules"] = {**m.get("modules", {}), **facts}
        sess.write_json(os.path.join(session, sess.MANIFEST), m)


def dump_problem(pid: int, path: str, rc: int, confined: bool = False) -> str:
    """Why a target did not write the dump it was asked for, and what to do."""
    uid = _uid(pid)
    who = f"uid {uid}" if uid is not None else "its own user"
    if confined:
        what = "wrote no" if rc in (0, _EFAULT) else f"failed with errno {rc} writing the"
        return (f"pid {pid} (in a container) {what} dump at {path}, in the folder heapscope "
                f"made inside its root for {who}")
    root = os.path.realpath(f"/proc/{pid}/root")
    where = " (it runs in another mount namespace/container: use a path it shares)" \
        if root not in ("/", f"/proc/{pid}/root") else ""
    what = "could not write" if rc in (0, _EFAULT) else f"failed with errno {rc} writing"
    return (f"pid {pid} {what} {path}: the target writes the dump itself, as {who}; "
            f"choose a folder it can write{where}")


def _uid(pid: int) -> int | None:
    ids = _ids(pid)
    return None if ids is None else ids[0]


def _ids(pid: int) -> tuple[int, int] | None:
    """The file-system uid and gid of a live process: who its dumps are written as."""
    uid = gid = None
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[4])
                elif line.startswith("Gid:"):
                    gid = int(line.split()[4])
    except (OSError, ValueError, IndexError):
        return None
    return None if uid is None or gid is None else (uid, gid)


def target_owner(pid: int) -> DumpOwner | None:
    """The user the target writes its dumps as (None when /proc does not say)."""
    ids = _ids(pid)
    if ids is None:
        return None
    return DumpOwner(ids[0], ids[1], user_name(ids[0]))


def process_info(pid: int) -> dict[str, Any]:
    """exe, cmdline and ppid of a live process (empty values when unreadable)."""
    exe, cmdline = read_image(pid)
    ppid = None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            ppid = int(f.read().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {"exe": exe, "cmdline": cmdline, "ppid": ppid}


# ---- sessions -------------------------------------------------------------------------------


def default_session(pid: int, now: float | None = None) -> str:
    """``heapscope-attach-<pid>-<YYYYmmdd-HHMMSS>``, not yet existing."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"heapscope-attach-{pid}-{stamp}"
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def open_session(ctl: Controller, path: str | None, facts: dict[str, Any] | None = None) -> str:
    """An attach session for the target: an existing session folder, or a new one."""
    if path is not None and os.path.isdir(path) and sess.read_manifest(path):
        return os.path.abspath(path)
    info = process_info(ctl.pid)
    owner = target_owner(ctl.pid)
    if owner is not None and owner.uid != os.geteuid() and os.geteuid() != 0:
        owner = None  # only root can hand a folder over; the target then says it cannot write
    folder = sess.create(path or default_session(ctl.pid), info["cmdline"] or [str(ctl.pid)],
                         owner)
    box = ctl.confined
    proc: dict[str, Any] = {"pid": ctl.pid, "ppid": info["ppid"], "exe": info["exe"],
                            "cmdline": info["cmdline"]}
    if box is not None:
        proc["nspid"] = box.inner_pid  # its own pid, as its logs and its dumps' maps know it
    manifest: dict[str, Any] = {
        "format": "heapscope-session",
        "version": 1,
        "mode": "attach",
        "command": info["cmdline"],
        "cwd": _cwd(ctl.pid),
        "host": os.uname().nodename,
        "start_time": time.time(),
        "pid": ctl.pid,
        "jemalloc": facts or {},
        "access": sess.access_facts(owner),
        "processes": [proc],
    }
    if box is not None:
        manifest["container"] = box.as_dict()
    sess.write_json(os.path.join(folder, sess.MANIFEST), manifest)
    return folder


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def next_dump_path(session: str, pid: int) -> str:
    """``dumps/jeprof.<pid>.<n>.m<n>.heap`` after the session's dumps of that pid."""
    dumps = os.path.join(session, "dumps")
    n = 0
    for name in os.listdir(dumps):
        d = parse_dump_name(name)
        if d is not None and d.pid == pid:
            n = max(n, d.seq + 1, d.index + 1)
    return os.path.join(dumps, f"jeprof.{pid}.{n}.m{n}.heap")


def session_dumps(session: str, pid: int) -> list[str]:
    """The session's dumps of ``pid``, oldest first (jemalloc's order)."""
    folder = os.path.join(session, "dumps")
    names = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".heap")]
    return group_by_pid(names).get(pid, [])


def jemalloc_facts(status: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``jemalloc`` entry from a status."""
    return {"version": status.get("version"), "symbol": status.get("symbol"),
            "prefix": "_rjem_" if str(status.get("symbol", "")).startswith("_rjem_") else "",
            "config_prof": status.get("config_prof"), "opt_prof": status.get("opt_prof"),
            "lg_sample": status.get("lg_sample"), "prof_prefix": status.get("prof_prefix"),
            "attached": True}


def update_manifest(session: str, **fields: Any) -> None:
    """Merge ``fields`` into the session's manifest."""
    m = sess.read_manifest(session)
    m.update(fields)
    sess.write_json(os.path.join(session, sess.MANIFEST), m)


def analyse(session: str, pid: int, dumps: list[str], options: SymbolOptions,
            progress: Callable[[str, int, int], None] | None = None,
            rounds: dict[str, Any] | None = None) -> LeakReport:
    """``heapscope leaks`` on these dumps of the target: load_series + find_leaks.
    ``rounds`` ({"rounds", "missed_rounds", "missed_why"}) says how many rounds of a series
    were asked and missed."""
    m = sess.read_manifest(session)
    options, aliases = naming_facts(m, options)
    series = load_series(pid, dumps, options, progress, aliases=aliases)
    return judge_series(session, m, series, rounds)


def naming_facts(manifest: dict[str, Any], options: SymbolOptions
                 ) -> tuple[SymbolOptions, dict[str, str]]:
    """What the session's manifest adds to naming its dumps: the modules it recorded (for
    the symbolizer) and the aliases of the executable's paths."""
    return (options.with_recorded(sess.recorded_facts(manifest)),
            exe_aliases(facts_from_manifest(manifest)))


def judge_series(session: str, manifest: dict[str, Any], series: ProcessSeries,
                 rounds: dict[str, Any] | None = None) -> LeakReport:
    """The leak report of one target's series, with what the session knows of it."""
    pid = series.pid
    info = {p["pid"]: dict(p) for p in manifest.get("processes", [])
            if isinstance(p, dict) and isinstance(p.get("pid"), int)}
    if rounds and pid is not None:
        info.setdefault(pid, {"pid": pid}).update(rounds)
        # Kept with the session: `heapscope leaks SESSION` later judges the same way.
        update_manifest(session, processes=[info[p] for p in sorted(info)])
    return find_leaks([series], info=info, root=pid)


def write_report(session: str, pid: int, report: LeakReport, kind: str,
                 log: AttachLog, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.json for an attach session (the run report's schema, plus how it was taken)."""
    doc: dict[str, Any] = {"format": "heapscope-report", "version": 1, "mode": kind,
                           "pid": pid, "command": process_info(pid)["cmdline"]}
    doc.update(report.as_dict())
    doc["notes"] = list(report.notes)
    doc["attach"] = log.as_dict()
    box = confinement(pid)
    if box is not None:
        doc["nspid"] = box.inner_pid
        doc["container"] = box.as_dict()
    if extra:
        doc.update(extra)
    sess.write_json(os.path.join(session, "report.json"), json_ready(doc))  # for other programs
    return doc


def check_dump_file(path: str) -> None:
    """Refuse a dump file the target could be tricked into writing elsewhere: jemalloc opens
    it with ``creat()``, which follows a link and truncates what is there."""
    if os.path.lexists(path):
        raise InputError(path, "exists; heapscope never overwrites a dump (choose a new "
                               "name, or a session folder with -o DIR)")
    folder = os.path.dirname(path) or "."
    try:
        st = os.stat(folder)
    except OSError as e:
        raise UsageError(f"{folder}: {e.strerror or e}") from None
    if st.st_mode & 0o022:
        raise UsageError(f"{path}: is in a folder other users can write to, where a link "
                         "planted before the target writes would be followed; choose a folder "
                         "of your own, or a session folder with -o DIR")


def is_heap_file(path: str) -> bool:
    """True when ``path`` names a dump file rather than a session folder."""
    return bool(re.search(r"\.heap$", path)) and not os.path.isdir(path)
