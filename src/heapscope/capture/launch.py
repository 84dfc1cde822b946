"""Run a program as if heapscope were not there, while recording what profiling needs.

stdin, stdout and stderr are the program's own: nothing of heapscope stands between the
program and its output, so a heapscope that is killed (or OOM-killed) can neither block nor
break the program's writes. Termination signals sent to heapscope are passed on so the
program exits cleanly and still writes its final dump; Ctrl-C from a terminal already reaches
the program (same process group), so it is not sent twice. When the program ends, processes
it left behind get a short grace period to exit and write their own dumps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

from heapscope.capture.procevents import ProcEvents
from heapscope.capture.procs import TreeWatcher
from heapscope.errors import HeapscopeError
from heapscope.units import plural

_FORWARD = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_TTY_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


class CommandNotFound(HeapscopeError):
    """The program to launch does not exist or cannot be executed (exit 127 like a shell)."""

    exit_code = 127


@dataclass
class RunResult:
    """How the launched program ended."""

    pid: int
    returncode: int  # as subprocess reports it: negative for a signal
    start: float
    end: float
    watcher: TreeWatcher
    process_events: bool | str = False  # True, or why the kernel's fork events were missing
    problems: list[str] = field(default_factory=list)  # from periodic dumps (--every)
    # Per process, the rounds of --every it was alive for and those that brought no dump:
    # {pid: {"rounds": n, "missed_rounds": m, "missed_why": reason}}.
    rounds: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def signal(self) -> int | None:
        """The signal that killed the program, if any."""
        return -self.returncode if self.returncode < 0 else None

    @property
    def exit_status(self) -> int:
        """The status a shell would report: the code, or 128 + signal."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


#: Told after each round of periodic dumps: its number, the processes asked, their answers.
RoundHook = Callable[[int, list[int], dict[int, tuple[str | None, str]]], None]


def run(
    cmd: list[str],
    env: dict[str, str],
    *,
    rss_log: TextIO | None = None,
    watch_interval: float = 0.25,
    grace: float = 3.0,
    every: float | None = None,
    periodic: Callable[[list[int]], dict[int, tuple[str | None, str]]] | None = None,
    adopt: Callable[[list[int]], None] | None = None,
    on_round: RoundHook | None = None,
) -> RunResult:
    """Run ``cmd`` with ``env``; return once it (and what it left behind) has exited.

    With ``every`` and ``periodic``, ``periodic(pids)`` runs every ``every`` seconds while
    the program lives (dumps taken from outside); it returns, per process, a problem to note
    (or None) and how the dump was taken. ``adopt(pids)`` runs about twice a second on the
    live processes (to point the ones that changed user at a dump folder they can write).
    ``on_round(n, pids, got)`` follows each round of ``periodic`` (progress lines).
    """
    events = ProcEvents()
    events.start()  # before the program starts, so that no early fork goes unseen
    start = time.time()
    try:
        proc = subprocess.Popen(cmd, env=env, close_fds=True)
    except OSError as e:
        events.stop()
        raise _spawn_failed(cmd, e) from None
    watcher = TreeWatcher(proc.pid, watch_interval, start, events if events.available else None,
                          rss_log)
    watcher.begin()
    done = threading.Event()
    problems: list[str] = []
    per_pid: dict[int, dict[str, Any]] = {}
    ticker = None
    if every and periodic is not None:
        ticker = threading.Thread(target=_tick, args=(proc, every, periodic, done, problems,
                                                      lambda: _dumpable(watcher), per_pid,
                                                      on_round),
                                  name="heapscope-every", daemon=True)
        ticker.start()
    adopter = None
    if adopt is not None:
        adopter = threading.Thread(target=_adopt_loop,
                                   args=(adopt, done, lambda: _dumpable(watcher)),
                                   name="heapscope-adopt", daemon=True)
        adopter.start()

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    interactive = sys.stdin is not None and sys.stdin.isatty()
    previous: dict[int, object] = {}
    sig: int
    for sig in _FORWARD:
        previous[sig] = signal.signal(sig, forward)
    for sig in _TTY_SIGNALS:
        # From a terminal the program gets these itself; otherwise they came from kill(1).
        previous[sig] = signal.signal(sig, signal.SIG_IGN if interactive else forward)
    try:
        returncode = proc.wait()
        done.set()
        if ticker is not None:
            ticker.join(timeout=60)
        if adopter is not None:
            adopter.join(timeout=30)
        _wait_for_leftovers(watcher, grace)
    finally:
        done.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        watcher.end()
        events.stop()
    result = RunResult(proc.pid, returncode, start, time.time(), watcher)
    result.process_events = events.available or f"unavailable ({events.error})"
    result.problems = problems
    result.rounds = per_pid
    return result


def _adopt_loop(adopt: Callable[[list[int]], None], done: threading.Event,
                targets: Callable[[], list[int]], interval: float = 0.5) -> None:
    """``adopt`` on the live processes every ``interval`` seconds until the program ends;
    an error there is never the run's end."""
    while not done.wait(interval):
        with contextlib.suppress(Exception):
            adopt(targets())


def _dumpable(watcher: TreeWatcher) -> list[int]:
    """The program and every process of its tree alive now, but the shells and small tools
    that scripts run (they would only add attaches)."""
    from heapscope.analysis.processes import HELPERS

    out = [watcher.root]
    with watcher.lock:
        infos = {pid: watcher.procs.get(pid) for pid in watcher.alive_locked()}
    for pid, info in sorted(infos.items()):
        if info is not None and os.path.basename(info.exe) not in HELPERS:
            out.append(pid)
    return out


def _tick(proc: subprocess.Popen[bytes], every: float,
          periodic: Callable[[list[int]], dict[int, tuple[str | None, str]]],
          done: threading.Event,
          problems: list[str], targets: Callable[[], list[int]],
          per_pid: dict[int, dict[str, Any]], on_round: RoundHook | None = None) -> None:
    """Every ``every`` seconds, call ``periodic`` on the processes ``targets`` lists (the
    program and the processes it started), split in two halves that run side by side, until
    the program ends.

    Rounds keep their rhythm (one starts every ``every`` seconds from the first); a round
    that takes longer delays the next, which then starts after a pause of a tenth of the
    interval, so the dumps never take all the machine's time. A process that fails three
    times in a row is left alone from then on (one that cannot be attached will not start
    working); failures of a process that has just exited are not problems. ``per_pid``
    counts, per process, the rounds it lived through and those that brought no dump (its
    verdict then rests on fewer dumps than asked, and says so).
    """
    from concurrent.futures import ThreadPoolExecutor

    failures: dict[int, int] = {}
    given_up: set[int] = set()
    rounds: list[tuple[float, int]] = []  # (seconds a round took, processes in it)
    due = time.monotonic() + every
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="heapscope-dump") as pool:
        while not done.wait(max(0.0, due - time.monotonic())):
            if proc.poll() is not None:
                break
            began = time.monotonic()
            alive = targets()
            for pid in alive:
                r = per_pid.setdefault(pid, {"rounds": 0, "missed_rounds": 0,
                                             "missed_why": ""})
                r["rounds"] += 1
                if pid in given_up:
                    r["missed_rounds"] += 1
            pids = [pid for pid in alive if pid not in given_up]
            halves = [half for half in (pids[0::2], pids[1::2]) if half]
            got: dict[int, tuple[str | None, str]] = {}
            for part in pool.map(periodic, halves):
                got.update(part)
            ended = time.monotonic()
            rounds.append((ended - began, len(pids)))
            due = max(due + every, ended + every / 10)
            for pid in pids:
                problem, how = got.get(pid, (None, ""))
                if problem is None:
                    failures[pid] = 0
                    per_pid[pid]["via"] = how  # helper, stub or call
                    continue
                if not _alive(pid):
                    given_up.add(pid)
                    per_pid[pid]["rounds"] -= 1  # it ended: not a round it lived through
                    continue
                per_pid[pid]["missed_rounds"] += 1
                per_pid[pid]["missed_why"] = problem
                problems.append(problem)
                failures[pid] = failures.get(pid, 0) + 1
                if failures[pid] >= 3:
                    given_up.add(pid)
                    problems.append(f"periodic dumps of pid {pid} stopped after three "
                                    "failures in a row")
            if on_round is not None:
                # progress must never end the dumps (nor the program's run)
                with contextlib.suppress(Exception):
                    on_round(len(rounds), pids, got)
    slow = _slow_rounds(rounds, every)
    if slow:
        problems.append(slow)


def _slow_rounds(rounds: list[tuple[float, int]], every: float) -> str | None:
    """A note when rounds of dumps took longer than the interval asked for (the series
    then has fewer dumps than the user expects)."""
    if len(rounds) < 2:
        return None
    took = sorted(t for t, _n in rounds)[len(rounds) // 2]
    if took <= every:
        return None
    most = max(n for _t, n in rounds)
    return (f"--every {every:g}: a round of dumps of up to {plural(most, 'process')} took "
            f"{took:.1f} s (median), so dumps came about every {took + every / 10:.1f} s")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _spawn_failed(cmd: list[str], e: OSError) -> CommandNotFound:
    if isinstance(e, FileNotFoundError):
        return CommandNotFound(f"{cmd[0]}: command not found")
    if isinstance(e, PermissionError):
        return CommandNotFound(f"{cmd[0]}: permission denied (not executable)")
    return CommandNotFound(f"{cmd[0]}: cannot execute: {e.strerror or e}")


def _wait_for_leftovers(watcher: TreeWatcher, grace: float) -> None:
    """Give processes the program left running a moment to exit and write their dumps."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        watcher.sample()
        if not watcher.alive():
            return
        time.sleep(0.05)
