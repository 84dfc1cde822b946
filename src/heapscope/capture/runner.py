"""``heapscope run`` as a library call: configure, launch, collect, symbolize, report."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heapscope.analysis.prune import prune
from heapscope.analysis.suspects import LEAK, Suspect, rank, suspects
from heapscope.analysis.unsample import unsample
from heapscope.capture import session as sess
from heapscope.capture.conf import build_conf, env_var
from heapscope.capture.jemalloc import JemallocLib, find_jemalloc, inspect_target
from heapscope.capture.launch import CommandNotFound, RunResult
from heapscope.capture.launch import run as launch
from heapscope.errors import HeapscopeError
from heapscope.formats import symbolized
from heapscope.formats.load import load, parse_dump_name
from heapscope.model import INUSE_OBJECTS, INUSE_SPACE, Profile
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize
from heapscope.symbols.elf import ElfError, ElfInfo

JAVA_FLAGS = "-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit"
# Programs that start other programs: as the launched process they are a "wrapper".
WRAPPERS = frozenset("sh bash dash zsh ksh mksh busybox env runuser su sudo setpriv timeout "
                     "nice ionice stdbuf taskset chrt nohup time xargs make".split())
# Shells and small tools that scripts and version-manager shims (pyenv, rbenv, nvm) run by the
# dozen: they rarely free memory before exiting, and must not drown the program's report.
HELPERS = WRAPPERS | frozenset(
    "readlink realpath basename dirname cat sed grep egrep awk gawk mawk cut tr head tail sort "
    "uniq wc tee find ls cp mv rm mkdir rmdir ln chmod chown touch date uname id whoami "
    "hostname expr test [ true false sleep which printf echo seq mktemp stat getconf "
    "ldconfig locale tput".split())
QUIET_ROLES = ("wrapper", "helper")


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


@dataclass
class ProcessReport:
    """One process of the run and what it still held at exit."""

    pid: int
    ppid: int | None
    exe: str
    cmdline: list[str]
    role: str
    dumps: list[str]
    live_bytes: float = 0.0
    live_objects: float = 0.0
    leak_bytes: float = 0.0

    @property
    def leaks(self) -> bool:
        """True when the process holds memory that no runtime start-up explains."""
        return self.leak_bytes > 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (report.json ``processes`` entries)."""
        return {"pid": self.pid, "ppid": self.ppid, "exe": self.exe, "cmdline": self.cmdline,
                "role": self.role, "dumps": self.dumps, "live_bytes": self.live_bytes,
                "live_objects": self.live_objects, "leak_bytes": self.leak_bytes,
                "leaks": self.leaks}


@dataclass
class SessionResult:
    """Everything the run produced."""

    path: str
    command: list[str]
    result: RunResult
    processes: list[ProcessReport]
    suspects: list[Suspect]
    diagnostics: list[Diagnostic]
    notes: list[str]
    leak_summaries: list[str]

    @property
    def leak_bytes(self) -> float:
        """Bytes held at exit by sites judged leaks, over all processes."""
        return sum(s.bytes for s in self.suspects if s.verdict == LEAK)

    def report(self) -> dict[str, Any]:
        """The report.json document."""
        r = self.result
        return {
            "format": "heapscope-report",
            "version": 1,
            "command": self.command,
            "exit_status": r.exit_status,
            "signal": r.signal,
            "duration": round(r.end - r.start, 3),
            "processes": [p.as_dict() for p in self.processes],
            "suspects": [s.as_dict() for s in self.suspects],
            "notes": self.notes,
        }


def _version_at_least(version: str, major: int, minor: int) -> bool:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def choose_jemalloc(cmd: list[str], explicit: str | None) -> JemallocLib:
    """The jemalloc to use: the program's own when it links one, else a shared one."""
    target = inspect_target(cmd[0])
    if target.path is None:
        raise CommandNotFound(f"{cmd[0]}: command not found")
    if target.own_jemalloc and not explicit:
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
                progress: Callable[[str, int, int], None] | None = None) -> SessionResult:
    """Launch ``cmd`` under heap profiling and return what it left, symbolized and ranked."""
    lib = choose_jemalloc(cmd, opts.jemalloc)
    path = sess.create(opts.output, cmd)
    dumps_dir = os.path.join(path, "dumps")
    conf = build_conf(
        os.path.join(dumps_dir, "jeprof"), sample=opts.sample, interval=opts.interval,
        gdump=opts.gdump, accum=opts.accum, extra=opts.extra_conf,
        thread_names=lib.preload and _version_at_least(lib.version, 5, 3),
    )
    java = os.path.basename(os.path.realpath(cmd[0])) == "java" or (
        inspect_target(cmd[0]).is_java)
    env = build_env(lib, conf, java)
    start = time.time()
    manifest = sess.manifest_base(cmd, env_var(lib.prefix), conf,
                                  {"path": lib.path, "version": lib.version,
                                   "prefix": lib.prefix, "preloaded": lib.preload}, start)
    sess.write_json(os.path.join(path, sess.MANIFEST), manifest)
    summaries: list[str] = []

    def on_line(line: bytes) -> None:
        if line.startswith(b"<jemalloc>:"):
            summaries.append(line.decode(errors="replace"))

    result = launch(cmd, env, stderr_log=os.path.join(path, "stderr.log"),
                    on_stderr_line=on_line)
    if summaries:
        with open(os.path.join(path, "leak-summaries.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(summaries) + "\n")
    _write_rss(path, result)
    return _collect(path, cmd, opts, lib, result, manifest, summaries, progress)


def _write_rss(path: str, result: RunResult) -> None:
    with open(os.path.join(path, "rss.csv"), "w", encoding="utf-8") as f:
        f.write("t_seconds,pid,rss_bytes\n")
        for t, pid, rss in result.watcher.timeline:
            f.write(f"{t},{pid},{rss}\n")


def _final_dumps(dumps_dir: str) -> dict[int, list[str]]:
    """Dumps by pid, each pid's list in jemalloc's order (numeric sequence)."""
    by_pid: dict[int, list[tuple[int, int, str]]] = {}
    for name in os.listdir(dumps_dir):
        d = parse_dump_name(name)
        if d is None or not name.endswith(".heap"):
            continue
        order = (d.seq, 1 << 30 if d.kind == "f" else d.index)
        by_pid.setdefault(d.pid, []).append((*order, os.path.join(dumps_dir, name)))
    return {pid: [p for *_o, p in sorted(items)] for pid, items in by_pid.items()}


def _module_build_ids(profiles: list[Profile]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in profiles:
        for m in p.mappings:
            if m.executable and not m.anonymous and m.path not in out:
                try:
                    out[m.path] = ElfInfo.read(m.path).build_id
                except (ElfError, OSError):
                    out[m.path] = ""
    return out


def _collect(path: str, cmd: list[str], opts: RunOptions, lib: JemallocLib,
             result: RunResult, manifest: dict[str, Any], summaries: list[str],
             progress: Callable[[str, int, int], None] | None) -> SessionResult:
    dumps_dir = os.path.join(path, "dumps")
    by_pid = _final_dumps(dumps_dir)
    notes = _notes(result, lib, by_pid)
    sess.collect_perf_maps(path, sorted(by_pid))
    procs = result.watcher.procs
    reports: list[ProcessReport] = []
    all_suspects: list[Suspect] = []
    diagnostics: list[Diagnostic] = []
    raw_profiles: list[Profile] = []
    for k, (pid, dumps) in enumerate(sorted(by_pid.items())):
        if progress is not None:
            progress(f"symbolizing dumps of pid {pid}", k, len(by_pid))
        last: Profile | None = None
        for dump in dumps:
            try:
                raw = load(dump)
            except HeapscopeError as e:
                notes.append(str(e))
                continue
            if opts.symbolize:
                sym = symbolize(raw, opts.symbol_options)
                diagnostics.extend(sym.diagnostics)
                raw = sym.profile
                symbolized.write(raw, os.path.join(path, "symbolized",
                                                   os.path.basename(dump) + symbolized.SUFFIX))
            last = raw
        if last is None:
            continue
        raw_profiles.append(last)
        profile = prune(unsample(last))
        info = procs.get(pid)
        exe = info.exe if info and info.exe else next(
            (m.path for m in last.mappings if not m.anonymous), "")
        rep = ProcessReport(pid, info.ppid if info else None, exe,
                            info.cmdline if info else [], "", [os.path.relpath(d, path)
                                                                for d in dumps])
        rep.live_bytes = profile.total(INUSE_SPACE)
        rep.live_objects = profile.total(INUSE_OBJECTS)
        found = suspects(profile)
        rep.leak_bytes = sum(s.bytes for s in found if s.verdict == LEAK)
        all_suspects.extend(found)
        reports.append(rep)
    seen = {r.pid for r in reports}
    for info in procs.values():
        if info.pid not in seen:  # ran, but wrote no dump (exec'd, or left with _exit)
            reports.append(ProcessReport(info.pid, info.ppid, info.exe, info.cmdline, "", []))
    _assign_roles(reports, result.pid)
    quiet = {r.pid for r in reports if r.role in QUIET_ROLES}
    all_suspects.sort(key=lambda x: (x.pid in quiet, *rank(x)))
    manifest.update({
        "pid": result.pid,
        "end_time": result.end,
        "exit_status": result.exit_status,
        "signal": result.signal,
        "processes": [p.as_dict() for p in sorted(procs.values(), key=lambda p: p.pid)],
        "modules": _module_build_ids(raw_profiles),
        "process_events": result.process_events,
        "leak_summaries": summaries,
    })
    sess.write_json(os.path.join(path, sess.MANIFEST), manifest)
    order = sorted(reports, key=lambda r: (r.role in QUIET_ROLES, -r.leak_bytes, r.pid))
    out = SessionResult(path, cmd, result, order,
                        all_suspects, diagnostics, notes, summaries)
    sess.write_json(os.path.join(path, "report.json"), out.report())
    return out


def _assign_roles(reports: list[ProcessReport], root: int) -> None:
    for r in reports:
        name = os.path.basename(r.exe)
        if r.pid == root:
            r.role = "wrapper" if name in WRAPPERS and len(reports) > 1 else "main"
        else:
            r.role = "helper" if name in HELPERS else "child"


def _notes(result: RunResult, lib: JemallocLib, by_pid: dict[int, list[str]]) -> list[str]:
    notes: list[str] = []
    if result.signal is not None:
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
