"""``heapscope run`` as a library call: configure, launch, collect, symbolize, report."""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heapscope.analysis.fold import FramePolicy
from heapscope.analysis.leaks import LeakReport, ProcessFinding, find_leaks
from heapscope.analysis.ownership import ProcessFacts, exe_aliases
from heapscope.analysis.processes import QUIET_ROLES, role
from heapscope.analysis.series import (
    ProcessSeries,
    group_by_pid,
    load_series,
    unreadable_series,
)
from heapscope.capture import access, helper
from heapscope.capture import session as sess
from heapscope.capture.conf import build_conf, env_var
from heapscope.capture.jemalloc import JemallocLib, Target, find_jemalloc, inspect_target
from heapscope.capture.launch import CommandNotFound, RunResult
from heapscope.capture.launch import run as launch
from heapscope.capture.userdumps import UserDumps
from heapscope.errors import HeapscopeError, InputError, UsageError
from heapscope.files import create_new_text
from heapscope.formats import symbolized
from heapscope.formats.load import parse_dump_name
from heapscope.model import Profile
from heapscope.safetext import json_ready
from heapscope.symbols import Diagnostic, SymbolOptions
from heapscope.units import plural

JAVA_FLAGS = "-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit"


@dataclass(frozen=True)
class RunOptions:
    """What the user asked of ``heapscope run``."""

    output: str | None = None
    sample: int | None = None
    interval: int | None = None
    gdump: bool = False
    accum: bool = False
    extra_conf: str = ""
    jemalloc: str | None = None
    symbolize: bool = True
    symbol_options: SymbolOptions = field(default_factory=SymbolOptions)
    every: float | None = None  # seconds between dumps taken from outside (heapscope attach)
    frames: FramePolicy = field(default_factory=FramePolicy)  # how sites are named
    user: str | None = None  # the user the program runs as (owns dumps/)
    helper: bool = True  # preload the control helper (no ptrace stop for --every)


@dataclass
class SessionResult:
    """Everything the run produced: the session, how the program ended, the leak report."""

    path: str
    command: list[str]
    result: RunResult
    leaks: LeakReport
    diagnostics: list[Diagnostic]
    notes: list[str]
    leak_summaries: list[str]

    @property
    def leak_bytes(self) -> float:
        """What unsuppressed leaks hold over all processes."""
        return self.leaks.leak_bytes

    def report(self) -> dict[str, Any]:
        """The report.json document."""
        r = self.result
        doc: dict[str, Any] = {
            "format": "heapscope-report",
            "version": 1,
            "command": self.command,
            "exit_status": r.exit_status,
            "signal": r.signal,
            "duration": round(r.end - r.start, 3),
        }
        doc.update(self.leaks.as_dict())
        doc["notes"] = self.notes + self.leaks.notes
        return doc


def _version_at_least(version: str, major: int, minor: int) -> bool:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def choose_jemalloc(target: Target, explicit: str | None) -> JemallocLib:
    """The jemalloc to use: the program's own when it links one, else a shared one."""
    if target.path is not None and target.own_jemalloc and not explicit:
        return JemallocLib(path=target.path, version="", prof=target.prof_symbols,
                           prefix=target.prefix, preload=False)
    return find_jemalloc(explicit)


def build_env(lib: JemallocLib, conf: str, java: bool) -> dict[str, str]:
    """The program's environment: ours added to the user's, never replacing it."""
    env = dict(os.environ)
    name = env_var(lib.prefix)
    if env.get(name):
        conf = f"{env[name]},{conf}"  # jemalloc reads left to right: our settings win
    env[name] = conf
    if lib.preload:
        env["LD_PRELOAD"] = f"{lib.path} {env['LD_PRELOAD']}" if env.get("LD_PRELOAD") \
            else lib.path
    if java:
        env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} {JAVA_FLAGS}".strip()
    return env


def run_session(cmd: list[str], opts: RunOptions,
                progress: Callable[[str, int, int], None] | None = None,
                on_session: Callable[[str], None] | None = None,
                on_round: Callable[[int, list[int], dict[int, tuple[str | None, str]],
                                    dict[int, float]], None] | None = None) -> SessionResult:
    """Launch ``cmd`` under heap profiling and return what it left, symbolized and ranked.

    ``on_session(path)`` is called once the session folder and its manifest exist, just
    before the program starts (``run --serve`` starts its viewer there); it must not raise.
    ``on_round(n, pids, answers, pauses)`` follows each round of ``--every`` (progress
    lines): ``pauses`` gives, per process that was stopped, for how long (in seconds).
    """
    target = inspect_target(cmd[0])
    if target.path is None:
        raise CommandNotFound(f"{cmd[0]}: command not found")
    lib = choose_jemalloc(target, opts.jemalloc)
    if opts.output is not None and "," in os.path.abspath(opts.output):
        # The dumps folder goes into MALLOC_CONF's prof_prefix, and jemalloc splits at commas.
        raise UsageError(f"{opts.output}: a session folder cannot contain a comma (MALLOC_CONF "
                         "separates options with commas)")
    owner = access.dump_owner(cmd, opts.user)
    path = sess.create(opts.output, cmd, owner)
    dumps_dir = os.path.join(path, "dumps")
    conf = build_conf(
        os.path.join(dumps_dir, "jeprof"), sample=opts.sample, interval=opts.interval,
        gdump=opts.gdump, accum=opts.accum, extra=opts.extra_conf,
        thread_names=lib.preload and _version_at_least(lib.version, 5, 3),
    )
    env = build_env(lib, conf, target.is_java)
    preload = helper.prepare(path, owner) if opts.helper else None
    moved = None
    if preload is not None:
        env = preload.environment(env)
        moved = UserDumps(preload.folder, owner.uid)
    start = time.time()
    manifest = sess.manifest_base(cmd, env_var(lib.prefix), conf,
                                  {"path": lib.path, "version": lib.version,
                                   "prefix": lib.prefix, "preloaded": lib.preload}, start)
    manifest["access"] = sess.access_facts(owner)
    # Until end_time is written, the run has not finished (a killed heapscope leaves it so).
    manifest["heapscope_pid"] = os.getpid()
    manifest["helper"] = preload is not None
    sess.write_json(os.path.join(path, sess.MANIFEST), manifest)
    if on_session is not None:
        on_session(path)
    moved_notes: list[str] = []
    try:
        with create_new_text(os.path.join(path, "rss.csv"), 0o600) as rss:
            rss.write("t_seconds,pid,rss_bytes\n")
            rss.flush()
            pauses: dict[int, float] = {}

            def round_done(n: int, pids: list[int],
                           got: dict[int, tuple[str | None, str]]) -> None:
                if on_round is not None:
                    on_round(n, pids, got, dict(pauses))
                pauses.clear()

            result = launch(cmd, env, rss_log=rss, every=opts.every,
                            periodic=functools.partial(_dumps_from_outside, moved=moved,
                                                       pauses=pauses),
                            adopt=moved.point if moved is not None else None,
                            on_round=round_done if on_round is not None else None)
    finally:
        if moved is not None:
            # the dumps of processes that changed user, before their folder goes
            moved_notes = moved.collect(dumps_dir)
        if preload is not None:
            preload.remove()
    sess.seal_dumps(path)
    summaries = [text for _pid, text in helper.read_log(preload.log)
                 if text.startswith("<jemalloc>:")] if preload is not None else []
    if summaries:
        with create_new_text(os.path.join(path, "leak-summaries.txt"), 0o600) as f:
            f.write("\n".join(summaries) + "\n")
    notes = _unwritable_dumps(summaries, owner) + moved_notes
    users = dict(moved.users) if moved is not None else {}
    roots = dict(moved.roots) if moved is not None else {}
    return _collect(path, cmd, opts, lib, result, manifest, summaries, progress, notes, users,
                    roots)


def _dumps_from_outside(pids: list[int], moved: UserDumps | None = None,
                        pauses: dict[int, float] | None = None
                        ) -> dict[int, tuple[str | None, str]]:
    """One dump of each of ``pids`` (``run --every``): through the helper's socket where a
    process has one, else the call stub, else gdb; per process, a problem to note (or None)
    and the way the dump was taken.

    ``prof.dump`` without a name lets jemalloc name it after ``prof_prefix`` (the session's
    dumps folder) with its own sequence number, so the final dump still sorts last. A
    process that changed user is first pointed at a folder its user can write (``moved``).
    """
    from heapscope.capture.control import call_each
    from heapscope.capture.mallctl import Op

    out: dict[int, tuple[str | None, str]] = {}
    dump = Op("prof.dump", "none", None, True)
    prefixes = {pid: p for pid in pids
                if moved is not None and (p := moved.prefix_for(pid)) is not None}
    got: dict[int, Any] = {}
    try:
        # Two retries while no thread can run the call, as for attach.
        stay = [pid for pid in pids if pid not in prefixes]
        if stay:
            got.update(call_each(stay, [dump], timeout=30.0, retries=2))
        if prefixes:
            got.update(call_each(sorted(prefixes), [Op("prof.prefix", "str", prefixes, True),
                                                    dump], timeout=30.0, retries=2))
    except HeapscopeError as e:
        return {pid: (str(e), "") for pid in pids}
    for pid, r in got.items():
        if isinstance(r, HeapscopeError):
            out[pid] = (str(r), "")
        else:
            rc = r.rcs.get("prof.dump", 0)
            if pauses is not None and r.mode != "helper":
                pauses[pid] = r.stopped_s  # for the round's progress line
            # jemalloc answers EFAULT (14) when it could not create the file
            why = (": jemalloc could not write the file (a process that changed user cannot "
                   "write dumps/)" if rc == 14 else "")
            out[pid] = (None if rc == 0 else f"pid {pid}: prof.dump failed (errno {rc}{why})",
                        r.mode)
    return out


def _why_no_dumps(pid: int, result: RunResult, users: dict[int, int]) -> str:
    """What is known of why a process that ran left no dump."""
    rounds = result.rounds.get(pid, {})
    if rounds.get("missed_why"):
        return str(rounds["missed_why"]).removeprefix(f"pid {pid}: ")
    if pid in users:
        return (f"it ran as uid {users[pid]}, who cannot write dumps/; the helper (on unless "
                "--no-helper) gives such a process a folder of its own")
    if not rounds.get("rounds"):
        return "it ended before a round of dumps and wrote none at exit (exec, _exit, a signal)"
    return "it wrote no dump"


def _final_dumps(dumps_dir: str) -> dict[int, list[str]]:
    """The session's dumps by pid, each pid's list in jemalloc's order."""
    names = [os.path.join(dumps_dir, n) for n in os.listdir(dumps_dir) if n.endswith(".heap")]
    return {pid: paths for pid, paths in group_by_pid(names).items() if pid is not None}


def _rooted_modules(by_pid: dict[int, list[str]], roots: dict[int, str]
                    ) -> dict[str, dict[str, Any]]:
    """Module facts, with their root, of the files the processes in another root mapped
    (named in their dumps by the paths they saw), read inside that root. A path that a
    process in heapscope's own root mapped too is left to the host's file: the session
    records one file per path."""
    from heapscope.capture.container import dump_module_paths
    from heapscope.symbols.rooted import resolve_in_root

    if not roots:
        return {}
    seen: dict[int, set[str]] = {pid: dump_module_paths(dumps[-1])
                                 for pid, dumps in by_pid.items() if dumps}
    host = {p for pid, paths in seen.items() if pid not in roots for p in paths}
    out: dict[str, dict[str, Any]] = {}
    for pid, root in sorted(roots.items()):
        found = {p: f for p in sorted(seen.get(pid, set()) - host)
                 if (f := resolve_in_root(root, p)) is not None}
        for p, facts in sess.module_facts(found).items():
            out.setdefault(p, {**facts, "root": root})
    return out


def _module_paths(profiles: list[Profile]) -> dict[str, str]:
    # A mapping the dump marks "(deleted)" was replaced while the program ran: the file now
    # at its path is not the one that ran, so nothing is recorded for it.
    deleted = {m.path for p in profiles for m in p.mappings if m.deleted}
    return {m.path: m.path for p in profiles for m in p.mappings
            if m.executable and not m.anonymous and m.path not in deleted}


def _collect(path: str, cmd: list[str], opts: RunOptions, lib: JemallocLib,
             result: RunResult, manifest: dict[str, Any], summaries: list[str],
             progress: Callable[[str, int, int], None] | None,
             notes: list[str], moved_users: dict[int, int],
             roots: dict[int, str] | None = None) -> SessionResult:
    dumps_dir = os.path.join(path, "dumps")
    by_pid = _final_dumps(dumps_dir)
    # Processes that ran in another root (a chroot): their files are found inside it.
    rooted = _rooted_modules(by_pid, roots or {})
    if rooted:
        manifest["modules"] = {**rooted, **manifest.get("modules", {})}
    notes = notes + _notes(result, lib, by_pid) + result.problems
    sess.collect_perf_maps(path, sorted(by_pid))
    procs = result.watcher.procs
    aliases = exe_aliases({pid: ProcessFacts(pid, p.ppid, p.exe, tuple(p.cmdline))
                           for pid, p in procs.items()})
    diagnostics: list[Diagnostic] = []
    all_series: list[ProcessSeries] = []
    symbols = opts.symbol_options if opts.symbolize else SymbolOptions(cache_dir=None)
    if rooted:
        symbols = symbols.with_recorded(sess.recorded_facts({"modules": rooted}))
    for pid, dumps in sorted(by_pid.items()):
        try:
            # Each dump read is counted (progress says "reading dumps of pid P, k/n").
            series = load_series(pid, dumps, symbols, progress, keep_raw=opts.symbolize,
                                 aliases=aliases, frames=opts.frames)
        except HeapscopeError as e:
            # Its dumps exist but cannot be read: the process is "unreadable", never
            # "clean" and never dropped (the run fails, naming the reason).
            all_series.append(unreadable_series(pid, [str(e)]))
            continue
        diagnostics.extend(series.diagnostics)
        for dump, raw in zip(series.paths, series.raw, strict=False):
            try:
                symbolized.write(raw, os.path.join(path, "symbolized",
                                                   os.path.basename(dump) + symbolized.SUFFIX))
            except InputError as e:
                # A damaged dump (an address past 64 bits) keeps its raw copy only.
                notes.append(f"no symbolized copy of {os.path.basename(dump)}: {e.problem}")
        series.raw = []
        all_series.append(series)
    for pid, tried in sorted(_unwritten_pids(summaries).items()):
        if pid not in by_pid:
            # It ran and allocated, but its dump was never written: never "clean".
            all_series.append(unreadable_series(pid, [f"jemalloc could not write {tried}"]))
    info = {pid: {"ppid": p.ppid, "exe": p.exe, "cmdline": p.cmdline,
                  **result.rounds.get(pid, {})}
            for pid, p in procs.items()}
    report = find_leaks(all_series, info=info, root=result.pid)
    # Again: the report has marked the notes of wrappers' and helpers' modules as no lead.
    diagnostics = [d for s in all_series for d in s.diagnostics]
    seen = {p.pid for p in report.processes}
    for p in procs.values():
        if p.pid not in seen:  # ran, but wrote no dump (exec'd, or left with _exit)
            finding = ProcessFinding(p.pid, p.exe, p.cmdline, p.ppid,
                                     role(p.pid, p.exe, result.pid, len(procs)), 0)
            finding.why_no_dumps = _why_no_dumps(p.pid, result, moved_users)
            report.processes.append(finding)
    report.processes.sort(key=lambda p: (p.role in QUIET_ROLES, -p.leak_bytes, p.pid or 0))
    manifest.update({
        "pid": result.pid,
        "end_time": result.end,
        "exit_status": result.exit_status,
        "signal": result.signal,
        "processes": [{**p.as_dict(), **result.rounds.get(p.pid, {})}
                      for p in sorted(procs.values(), key=lambda p: p.pid)],
        "modules": {**sess.module_facts(_module_paths(
            [s.profile for s in all_series if s.profile is not None])),
            **manifest.get("modules", {})},
        "process_events": result.process_events,
        "leak_summaries": summaries,
    })
    sess.write_json(os.path.join(path, sess.MANIFEST), manifest)
    out = SessionResult(path, cmd, result, report, diagnostics, notes, summaries)
    # report.json is for other programs (the manifest, read back by heapscope, keeps its
    # undecodable bytes exact): every string valid Unicode.
    sess.write_json(os.path.join(path, "report.json"), json_ready(out.report()))
    return out


_FAILED_OPEN = re.compile(r'failed to open "(?P<path>[^"]*)"')


def _unwritable_dumps(summaries: list[str], owner: access.DumpOwner) -> list[str]:
    """A note when jemalloc said it could not create dump files: the program (or a child)
    ran as a user that cannot write the session's dumps folder."""
    failed = [ln for ln in summaries if _FAILED_OPEN.search(ln)]
    if not failed:
        return []
    return [f"jemalloc could not write {plural(len(failed), 'dump')} ({failed[0].strip()}): "
            f"a process ran as a user other than {owner.name}, who owns dumps/; if the program "
            "switches user, name it with --user USER"]


def _unwritten_pids(summaries: list[str]) -> dict[int, str]:
    """Processes whose dump jemalloc could not create: pid -> the file it tried."""
    out: dict[int, str] = {}
    for line in summaries:
        m = _FAILED_OPEN.search(line)
        name = parse_dump_name(m.group("path")) if m else None
        if m and name is not None and name.pid is not None:
            out.setdefault(name.pid, m.group("path"))
    return out


def _wrapper_only(result: RunResult, by_pid: dict[int, list[str]]) -> bool:
    """True when only a wrapper (runuser, sudo, env …) died by the signal it passed on, and
    the program under it exited normally (it wrote its final dump)."""
    from heapscope.analysis.processes import WRAPPERS

    root = result.watcher.procs.get(result.pid)
    if root is None or os.path.basename(root.exe) not in WRAPPERS:
        return False
    return any(".f." in os.path.basename(d) for pid, dumps in by_pid.items()
               if pid != result.pid for d in dumps)


def _notes(result: RunResult, lib: JemallocLib, by_pid: dict[int, list[str]]) -> list[str]:
    notes: list[str] = []
    if result.signal is not None and not _wrapper_only(result, by_pid):
        import signal as _signal

        try:
            name = _signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        notes.append(f"the program was killed by {name}; jemalloc writes its final dump only on "
                     "a normal exit, so the last state may be missing (use --interval to dump "
                     "as it runs)")
    if not by_pid:
        if not lib.preload and not lib.prof:
            notes.append("no dumps: the jemalloc linked into the program seems to lack "
                         "profiling (build it with --enable-prof / tikv-jemallocator's "
                         "'profiling' feature)")
        else:
            notes.append("no dumps were written: the program may have exited with _exit(), "
                         "been killed, ignored LD_PRELOAD (setuid), or used another allocator")
    return notes
