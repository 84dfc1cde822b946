"""The agent's rounds: find the targets, dump each through the attach path, judge its window.

Each target has a state folder ``STATE/<service>-<pid>-<start>/``: an attach session (its
``dumps/`` belongs to the target's user, see :mod:`heapscope.capture.session`). A round
takes one dump of every target, keeps the last ``window`` dumps of each (older ones are
deleted: the agent wrote them), and judges the window with the same leak verdicts as
``heapscope leaks``. Because the folder is named after the process's identity, an agent that
restarts picks up each window where it was.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from heapscope.agent.push import Profile as PushedProfile
from heapscope.agent.push import Pusher
from heapscope.agent.targets import Selection, Target, cmdline, find, start_time
from heapscope.analysis.leaks import LeakReport, find_leaks
from heapscope.analysis.window import Window
from heapscope.capture import attach as at
from heapscope.capture import session as sess
from heapscope.capture.container import Drop
from heapscope.capture.control import call_each
from heapscope.capture.mallctl import NOPROF_HINT, Op
from heapscope.capture.procs import proc_stat
from heapscope.errors import HeapscopeError
from heapscope.symbols import SymbolOptions
from heapscope.terminal import clean
from heapscope.units import plural

DIR = "dir:"  # key prefix of processes read from a dumps folder


class NotProfiled(HeapscopeError):
    """The target's jemalloc has profiling off (or none): it can never be watched."""


@dataclass
class Watched:
    """What the agent knows of one target: its window's verdicts and its counters."""

    target: Target
    session: str
    report: LeakReport | None = None
    rss_bytes: int = 0
    dumps: int = 0  # dumps taken by this agent
    errors: int = 0  # dumps that failed
    dropped: int = 0  # dumps deleted as the window moved or to keep to the disk budget
    skipped: int = 0  # dumps not taken: too little free disk
    last_error: str = ""
    last_time: float = 0.0  # unix time of the last dump
    # The window kept reduced between rounds, and the naming facts it was made with (a new
    # module recorded in the manifest makes a new one).
    window: Window | None = None
    window_facts: tuple[SymbolOptions, dict[str, str]] | None = None
    held: frozenset[tuple[str, ...]] = frozenset()  # stacks of the sites held as leaks

    def judged(self, report: LeakReport) -> None:
        """Take a new judgement of the window: its report, and the leaks it holds."""
        self.report = report
        self.held = hold(self.held, ((f.stack, f.verdict) for f in report.findings
                                     if not f.rollup and not f.suppressed_by))


K = TypeVar("K")


def hold(held: frozenset[K], verdicts: Iterable[tuple[K, str]]) -> frozenset[K]:
    """The sites held as leaks after a new judgement of the window, from each site's
    verdict in it: those it calls ``leak``, and those held before that it calls ``growing``.

    Each round judges the window again, and a leak near the evidence threshold (a slow one
    beside churn at the same site) reads ``growing`` in some windows: a gauge that fell to 0
    then would restart every "for 30 minutes" alert. A held site is let go when a window
    reads it bounded, churn or steady (or it is gone), so a cache that read ``leak`` in one
    window does not stay held once it reads flat again. In simulation (`python
    bench/agent_hold.py`), leaks beside 10x churn reach a 30-round alert in 96% of runs
    rather than 59%, and caches, churn and steady tables never do, as without the hold.
    """
    return frozenset(k for k, v in verdicts if v == "leak" or (v == "growing" and k in held))


@dataclass
class AgentOptions:
    """How the agent watches."""

    state: str
    window: int = 30  # dumps judged per target
    timeout: float = 30.0  # bound on one attach
    symbols: SymbolOptions = field(default_factory=SymbolOptions)
    max_disk: int = 1 << 30  # bytes of dumps kept in the state folder, all targets together
    min_free: int = 256 << 20  # no dump is taken while the state's file system has less free
    active: float = 0.0  # duty cycle: sample only this many seconds before each dump (0: always)


def rss_bytes(pid: int) -> int:
    """A process's resident set size (0 when it is gone)."""
    st = proc_stat(pid)
    return st[1] if st is not None else 0


def pprof_of(path: str, symbols: SymbolOptions) -> bytes:
    """One dump as a symbolized pprof profile (raw stacks, as ``heapscope export``)."""
    from heapscope.analysis.fold import FramePolicy
    from heapscope.prepare import prepare
    from heapscope.render.pprof import PprofOptions, file_build_ids, render_pprof

    # reuse=False: the agent reads each new dump once; storing it would only cost time.
    profile = prepare(path, symbols, frames=FramePolicy(mode="raw"), reuse=False).profile
    return render_pprof([profile], PprofOptions(build_id=file_build_ids(),
                                                default_sample_type="inuse_space"))


def _same_facts(a: tuple[SymbolOptions, dict[str, str]],
                b: tuple[SymbolOptions, dict[str, str]]) -> bool:
    """True when two rounds would name a dump alike (the same recorded modules and aliases)."""
    return a[1] == b[1] and a[0].recorded == b[0].recorded


def make_state(path: str) -> None:
    """Create the state folder: root's (or the caller's), mode 0711, so each target's user
    can pass through to its own dumps folder but no one can list the targets."""
    if os.path.isdir(path):
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, 0o711)
    finally:
        os.close(fd)


class Agent:
    """Rounds over the selected targets; :attr:`watched` holds what the last round found."""

    def __init__(self, sel: Selection, opts: AgentOptions,
                 say: Callable[[str], None] | None = None,
                 on_pause: Callable[[float], None] | None = None,
                 pushers: list[Pusher] | None = None) -> None:
        self.sel = sel
        self.opts = opts
        self.watched: dict[str, Watched] = {}
        self.refused: dict[str, str] = {}  # target key -> why it cannot be watched (said once)
        self.failing: set[str] = set()  # targets whose last dump failed (said once)
        # Lines name services, paths and errors: shown with control characters escaped.
        self.say = say or (lambda line: print(f"heapscope agent: {clean(line)}",
                                              file=sys.stderr))
        self.on_pause = on_pause
        self.pushers = pushers or []
        make_state(opts.state)

    def round(self) -> None:
        """One dump of every target, then the verdicts of each window."""
        current = find(self.sel)
        if self.opts.active > 0:
            self._set_active([t.pid for k, t in current.items() if k not in self.refused], True)
            time.sleep(self.opts.active)
        for key in [k for k in self.watched if k not in current and not k.startswith(DIR)]:
            t = self.watched.pop(key).target
            why = "it exited" if start_time(t.pid) != t.start else "no longer selected"
            self.say(f"{t.service} pid {t.pid} is no longer watched ({why})")
        batch: dict[str, Target] = {}
        for key, target in sorted(current.items()):
            if key in self.refused:
                continue
            try:
                if key not in self.watched:
                    self._start(key, target)
                batch[key] = target
            except NotProfiled as e:
                self.refused[key] = str(e)  # for good: profiling cannot be switched on later
                self.say(f"not watching {target.service} pid {target.pid}: {e}")
            except HeapscopeError as e:
                self._failed(key, target, e)
        if batch and not self._low_on_disk():
            self._dump_all(batch)
        elif batch:
            for key, target in batch.items():
                w = self.watched[key]
                w.skipped += 1
                if w.skipped == 1 or w.skipped % 100 == 0:
                    self.say(f"skipped a dump of {target.service} pid {target.pid}: less "
                             f"than {self.opts.min_free >> 20} MiB free in {self.opts.state}")
        for folder in self.sel.folders:
            self._read_folder(folder)

    def _read_folder(self, folder: str) -> None:
        """Judge the dumps services write themselves into ``folder`` (``prof_interval``,
        ``prof_gdump``, ``prof.dump``): no attach, and nothing there is ever deleted."""
        from heapscope.analysis.series import group_by_pid
        from heapscope.formats.trust import Ignored
        from heapscope.prepare import expand_inputs

        ignored: list[Ignored] = []
        try:
            paths = expand_inputs([folder], ignored=ignored)
        except HeapscopeError:
            return  # nothing written there yet
        for item in ignored:
            if item.path not in self.refused:
                self.refused[item.path] = item.reason
                self.say(f"left out {item.path}: {item.reason}")
        for pid, dumps in group_by_pid(paths).items():
            if pid is None:
                continue
            key = f"{DIR}{folder}:{pid}"
            w = self.watched.get(key)
            if w is None:
                cmd = cmdline(pid)
                service = os.path.basename(cmd[0]) if cmd else f"pid{pid}"
                w = Watched(Target(pid, start_time(pid) or 0, service, cmd), folder)
                self.watched[key] = w
                self.say(f"reading the dumps of {service} pid {pid} in {folder}")
            new = [d for d in dumps if os.path.getmtime(d) > w.last_time]
            if not new and w.report is not None:
                continue
            window = dumps[-self.opts.window:]
            try:
                series = self._slide(w, window, (self.opts.symbols, {})).series()
            except HeapscopeError as e:
                w.errors += 1
                w.last_error = str(e)
                continue
            w.dumps += len(new)
            w.judged(find_leaks([series], root=pid))
            w.rss_bytes = rss_bytes(pid)
            for d in new[-self.opts.window:]:
                taken = os.path.getmtime(d)
                self._push(w, d, taken)
                w.last_time = taken
            w.last_time = max(os.path.getmtime(d) for d in dumps)

    def _set_active(self, pids: list[int], on: bool) -> None:
        """prof.active on or off in each of ``pids``, in one round of calls (failures are
        left to the dump that follows, which says them)."""
        if not pids:
            return
        with contextlib.suppress(HeapscopeError):
            call_each(pids, [Op("prof.active", "bool", on, True)], timeout=self.opts.timeout)

    def finish(self) -> None:
        """At a clean stop: with a duty cycle, leave sampling on, as the targets started."""
        if self.opts.active > 0:
            self._set_active([w.target.pid for k, w in self.watched.items()
                              if not k.startswith(DIR)], True)

    def _low_on_disk(self) -> bool:
        try:
            st = os.statvfs(self.opts.state)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < self.opts.min_free

    def _keep_budget(self) -> None:
        """Delete the oldest dumps of the state folder (any target, gone ones first by age)
        until they fit ``max_disk``; each target keeps its two newest."""
        dumps: list[tuple[float, int, str, str]] = []
        for name in os.listdir(self.opts.state):
            folder = os.path.join(self.opts.state, name, "dumps")
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.stat().st_mtime)
            except OSError:
                continue
            for e in entries[:-2]:
                st = e.stat()
                dumps.append((st.st_mtime, st.st_size, e.path, name))
            total_newest = sum(e.stat().st_size for e in entries[-2:])
            dumps.append((float("inf"), total_newest, "", name))  # kept whatever the budget
        total = sum(size for _, size, _, _ in dumps)
        by_key = dict(self.watched)
        for _, size, path, name in sorted(dumps):
            if total <= self.opts.max_disk or not path:
                break
            try:
                os.unlink(path)
            except OSError:
                continue
            total -= size
            if name in by_key:
                by_key[name].dropped += 1

    def _failed(self, key: str, target: Target, e: HeapscopeError) -> None:
        w = self.watched.get(key)
        if w is not None:
            w.errors += 1
            w.last_error = str(e)
        if key not in self.failing:  # said once; tried again every round
            self.say(f"cannot dump {target.service} pid {target.pid} (trying again each "
                     f"round): {e}")
        self.failing.add(key)

    def _start(self, key: str, target: Target) -> Watched:
        """A new target: check it profiles, open (or resume) its state folder."""
        session = os.path.join(self.opts.state, key)
        ctl = at.Controller(target.pid, at.AttachOptions(timeout=self.opts.timeout))
        facts = None
        if not os.path.isdir(session):
            st = ctl.status()
            if not st["opt_prof"]:
                raise NotProfiled(f"it was started without heap profiling; {NOPROF_HINT}")
            facts = at.jemalloc_facts(st)
        w = Watched(target, at.open_session(ctl, session, facts))
        self.watched[key] = w
        resumed = len(at.session_dumps(w.session, target.pid))
        self.say(f"watching {target.service} pid {target.pid}"
                 + (f" (resuming a window of {plural(resumed, 'dump')})" if resumed else ""))
        return w

    def _dump_all(self, batch: dict[str, Target]) -> None:
        """One dump of each target in one round of calls (one tracer's start-up, paid once a
        round), then each window judged."""
        # A target in a container writes into a private folder inside its own root, read
        # back and removed when the round ends (also on errors and Ctrl-C).
        with contextlib.ExitStack() as stack:
            hosts: dict[int, str] = {}  # where each dump is kept
            paths: dict[int, str] = {}  # where each target writes it, as it sees it
            drops: dict[int, Drop] = {}
            for key, t in list(batch.items()):
                hosts[t.pid] = paths[t.pid] = at.next_dump_path(self.watched[key].session,
                                                                t.pid)
                if t.confined:
                    try:
                        drops[t.pid] = stack.enter_context(at.open_drop(t.pid))
                    except HeapscopeError as e:
                        del batch[key], paths[t.pid]
                        self._failed(key, t, e)
                        continue
                    paths[t.pid] = drops[t.pid].path(os.path.basename(hosts[t.pid]))
            if paths:
                self._dump_batch(batch, paths, hosts, drops)

    def _dump_batch(self, batch: dict[str, Target], paths: dict[int, str],
                    hosts: dict[int, str], drops: dict[int, Drop]) -> None:
        """The round of calls of :meth:`_dump_all`, and each dump booked."""
        # With a duty cycle, sampling stops in the same stop as the dump.
        ops = [Op("prof.dump", "str", paths, True)]
        if self.opts.active > 0:
            ops.append(Op("prof.active", "bool", False, True))
        try:
            results = call_each(sorted(paths), ops, timeout=self.opts.timeout, retries=2)
        except HeapscopeError as e:
            for key, target in batch.items():
                self._failed(key, target, e)
            return
        for key, target in batch.items():
            r = results.get(target.pid)
            path = paths[target.pid]
            drop = drops.get(target.pid)
            host = hosts[target.pid]
            if not isinstance(r, HeapscopeError):
                rc = r.rcs.get("prof.dump", 0) if r is not None else -1
                if rc == 0 and (drop.collect(os.path.basename(path), host) if drop
                                else os.path.exists(path)):
                    self.failing.discard(key)
                    self._judge(self.watched[key], host, r.stopped_s if r else 0.0)
                    continue
                r = HeapscopeError(at.dump_problem(target.pid, path, rc,
                                                   confined=drop is not None))
            self._failed(key, target, r)
        # Once a round, not once a dump: it lists every target's dumps.
        self._keep_budget()

    def _judge(self, w: Watched, path: str, pause: float) -> None:
        """Book a new dump: seal it, move the window, judge it, push it."""
        sess.seal(path)
        at.record_modules(w.session, w.target.pid, path)
        taken = time.time()
        w.dumps += 1
        if self.on_pause is not None:
            self.on_pause(pause)
        dumps = at.session_dumps(w.session, w.target.pid)
        for old in dumps[:-self.opts.window]:
            try:
                os.unlink(old)
                w.dropped += 1
            except OSError:
                pass
        dumps = [d for d in dumps[-self.opts.window:] if os.path.exists(d)]
        try:
            m = sess.read_manifest(w.session)
            series = self._slide(w, dumps, at.naming_facts(m, self.opts.symbols)).series()
            w.judged(at.judge_series(w.session, m, series))
        except HeapscopeError as e:
            w.errors += 1
            w.last_error = str(e)
            return
        w.rss_bytes = rss_bytes(w.target.pid)
        w.last_error = ""
        self._push(w, path, taken)
        w.last_time = taken

    def _slide(self, w: Watched, dumps: list[str],
               facts: tuple[SymbolOptions, dict[str, str]]) -> Window:
        """``w``'s window made to hold ``dumps`` (oldest first): the dumps gone are
        forgotten, the new ones read; only what is new is named. A window is made afresh on
        the first round (a restarted agent: from the dumps kept on disk), when the session's
        naming facts changed, or when ``dumps`` is not the window's tail plus new ones."""
        win = w.window
        if win is None or w.window_facts is None or \
                not _same_facts(w.window_facts, facts):
            win = None
        if win is not None:
            dumps = [p for p in dumps if not win.gave_up(p)]  # tried once, unchanged since
            keep = set(dumps)
            for p in win.paths:
                if p not in keep:
                    win.drop(p)
            if dumps[:len(win.paths)] != win.paths:
                win = None
        if win is None:
            win = Window(w.target.pid, self.opts.window, facts[0], aliases=facts[1])
            w.window, w.window_facts = win, facts
        for p in dumps[len(win.paths):]:
            try:
                win.add(p)
            except HeapscopeError as e:  # as `leaks` does: a damaged dump is left out
                w.last_error = str(e)
        if not win.paths:
            raise HeapscopeError("no dump of the window could be read" +
                                 (f": {w.last_error}" if w.last_error else ""))
        return win

    def _push(self, w: Watched, path: str, taken: float) -> None:
        """Hand one dump to each profile backend."""
        if not self.pushers:
            return
        t = w.target
        pushed = PushedProfile(t.service, (("pid", str(t.pid)), ("host", socket.gethostname()),
                                           *t.container),
                               w.last_time or taken - 1, taken,
                               pprof_of(path, self.opts.symbols.with_recorded(
                                   sess.recorded_facts(sess.read_manifest(w.session)))))
        for pusher in self.pushers:
            pusher.offer(pushed)
