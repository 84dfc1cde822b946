"""Storms against live targets: signals during attaches, killed debuggers, a killed
``heapscope run``. The harness behind ``bench/attach_stress.py`` (the full storm, run by
hand) and ``test_attach_safety.py`` (a slice of it in the suite).

Every storm runs ``attachprog/storm.c``: all its threads allocate all the time and, with
handlers installed, it counts each delivery of each signal. A signal is sent only once the
previous one of the same kind was counted, so the kernel never merges two: a signal that
was sent and never counted was lost, and one counted twice was doubled.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STORM_C = HERE / "attachprog" / "storm.c"
CONF = "prof:true,lg_prof_sample:14"
HANDLED = ("INT", "TERM", "HUP", "USR1", "USR2", "CHLD", "ALRM", "PIPE", "TRAP", "CONT")
# Signals whose default action does the target no harm (sent to a target without handlers).
HARMLESS_DEFAULT = ("CHLD", "URG", "WINCH", "CONT")
ACK_TIMEOUT = 20.0  # a signal not counted by then is lost (a loaded machine is slow, not 20 s)


def build(gcc: str, out: Path) -> Path:
    """Compile the storm target."""
    subprocess.run([gcc, "-O1", "-g", "-pthread", "-o", str(out), str(STORM_C)], check=True)
    return out


def state(pid: int) -> str:
    """The process state letter ('' when gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def cpu_ticks(pid: int) -> int:
    """The CPU time all its threads have used so far, in clock ticks (-1 when gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return -1
    return int(fields[11]) + int(fields[12])  # utime, stime


def runs_on(pid: int, within: float = ACK_TIMEOUT) -> bool:
    """Whether the process still computes: its CPU time grows within ``within`` seconds.
    Asked of the whole process, as one of its threads may be the one running a stuck call."""
    start = cpu_ticks(pid)
    deadline = time.monotonic() + within
    while start >= 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        if cpu_ticks(pid) > start:
            return True
    return False


class StormTarget:
    """The storm program, running under jemalloc with profiling, driven over stdin/stdout."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.lock = threading.Lock()
        line = self.readline(30)
        if not line.startswith("ready"):
            raise RuntimeError(f"storm target did not start: {line!r}")

    def readline(self, timeout: float) -> str:
        """One line of its answers, or '' when none comes within ``timeout``."""
        import selectors

        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                return ""
            return self.proc.stdout.readline()
        finally:
            sel.close()

    def ask(self, what: str, timeout: float = ACK_TIMEOUT) -> str:
        with self.lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(what + "\n")
            self.proc.stdin.flush()
            return self.readline(timeout).strip()

    def counts(self) -> dict[str, int]:
        line = self.ask("c")
        return {k: int(v) for k, v in (kv.split("=") for kv in line.split())}

    def beat(self) -> tuple[int, int]:
        """(heartbeats, longest gap in µs since the last question)."""
        beats, gap = self.ask("b").split()
        return int(beats), int(gap)

    def quit(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("q\n")
                self.proc.stdin.flush()
            except OSError:
                pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def env_for(lib: str, conf: str = CONF) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib
    env["MALLOC_CONF"] = conf
    return env


@dataclass
class SignalLog:
    """Signals sent and counted, per kind."""

    sent: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    doubled: Counter[str] = field(default_factory=Counter)
    stops: int = 0  # SIGSTOP that stopped the target
    stops_lost: int = 0


class SignalStorm:
    """Sends the named signals to the target, one at a time, each after the previous one
    of its kind was counted, with random gaps of up to ``gap`` seconds."""

    def __init__(self, target: StormTarget, kinds: tuple[str, ...], gap: float = 0.004,
                 stop_cont: bool = False, counted: bool = True) -> None:
        self.target = target
        self.kinds = kinds
        self.gap = gap
        self.stop_cont = stop_cont
        self.counted = counted
        self.log = SignalLog()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="storm-signals", daemon=True)

    def __enter__(self) -> SignalStorm:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=ACK_TIMEOUT * 3)

    def _wait_count(self, kind: str, want: int) -> int:
        deadline = time.monotonic() + ACK_TIMEOUT
        got = 0
        while time.monotonic() < deadline:
            got = self.target.counts().get(kind, 0)
            if got >= want:
                return got
            time.sleep(0.001)
        return got

    def _stop_cont(self, sent: Counter[str]) -> None:
        pid = self.target.pid
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + ACK_TIMEOUT
        stopped = False
        while not stopped and time.monotonic() < deadline:
            # One read a turn: a process that is stopped shows 't' while a tracer holds it.
            stopped = state(pid) == "T"
            if not stopped:
                time.sleep(0.0005)
        if stopped:
            self.log.stops += 1
        else:
            self.log.stops_lost += 1
        time.sleep(random.uniform(0, self.gap))
        self._send("CONT", sent)

    def _book(self, kind: str, got: int, want: int) -> None:
        if got < want:
            self.log.lost[kind] += want - got
        elif got > want:
            self.log.doubled[kind] += got - want

    def _send(self, kind: str, sent: Counter[str]) -> bool:
        try:
            os.kill(self.target.pid, getattr(signal, "SIG" + kind))
        except ProcessLookupError:
            return False
        self.log.sent[kind] += 1
        sent[kind] += 1
        if self.counted and kind in HANDLED:
            got = self._wait_count(kind, sent[kind])
            self._book(kind, got, sent[kind])
            sent[kind] = got  # a loss is booked once
        return True

    def _run(self) -> None:
        sent = Counter(self.target.counts() if self.counted else {})
        while not self.done.is_set() and self.target.proc.poll() is None:
            if self.stop_cont and random.random() < 0.15:
                self._stop_cont(sent)
            elif not self._send(random.choice(self.kinds), sent):
                return
            time.sleep(random.uniform(0, self.gap))
        if self.counted and self.target.proc.poll() is None:
            # A last look: nothing arrived late or twice.
            time.sleep(0.2)
            final = self.target.counts()
            for kind in self.log.sent:
                if kind in HANDLED and final.get(kind, 0) > sent[kind]:
                    self.log.doubled[kind] += final[kind] - sent[kind]


@dataclass
class CycleLog:
    """What a series of attach cycles did."""

    cycles: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    stopped_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    modes: Counter[str] = field(default_factory=Counter)
    bad_dumps: list[str] = field(default_factory=list)


def attach_cycles(target: StormTarget, cycles: int, folder: Path, *, timeout: float = 60.0,
                  on_cycle: Any = None, until: Any = None) -> CycleLog:
    """``cycles`` attaches alternating dump and status (or as many as it takes, at most 10
    times that, for ``until()`` to hold); every dump must load."""
    from heapscope.capture.attach import AttachOptions, Controller
    from heapscope.errors import HeapscopeError
    from heapscope.formats.load import load

    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o1777)
    ctl = Controller(target.pid, AttachOptions(timeout=timeout, retries=20))
    log = CycleLog()
    target.beat()
    for i in range(cycles * (10 if until is not None else 1)):
        if i >= cycles and until is not None and until():
            break
        log.cycles += 1
        path = folder / f"jeprof.{target.pid}.{i}.m{i}.heap"
        try:
            if i % 2 == 0:
                r = ctl.dump(str(path))
                try:
                    if not load(str(path)).samples:
                        log.bad_dumps.append(f"{path.name}: no samples")
                except HeapscopeError as e:
                    log.bad_dumps.append(f"{path.name}: {e}")
                log.stopped_ms.append(r.stopped_s * 1000)
                log.modes[r.mode] += 1
            else:
                st = ctl.status()
                log.stopped_ms.append(st["attach"]["stopped_s"] * 1000)
                log.modes[st["attach"]["mode"]] += 1
            log.ok += 1
        except HeapscopeError as e:
            log.errors[_kind(str(e))] += 1
        if on_cycle is not None:
            on_cycle(i)
        if target.proc.poll() is not None:
            break
        log.gaps_ms.append(target.beat()[1] / 1000)
    return log


def _kind(message: str) -> str:
    """An error message without its numbers, to count errors by kind."""
    import re

    return re.sub(r"\d+(\.\d+)?", "N", message)[:160]


def tracer_children() -> list[int]:
    """The processes this process started to hold a target: heapscope's ptracer, or gdb."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                data = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        comm = data[data.find("(") + 1:data.rfind(")")]
        fields = data.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and (comm == "gdb" or b"ptracer.py" in cmdline):
            out.append(int(name))
    return out


class TracerKiller:
    """Kills each tracer (ptracer or gdb) this process starts with SIGKILL, a random time
    after it appears."""

    def __init__(self, latest: float = 0.05) -> None:
        self.latest = latest
        self.kills = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="storm-killer", daemon=True)

    def __enter__(self) -> TracerKiller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        seen: set[int] = set()
        while not self.done.is_set():
            for pid in tracer_children():
                if pid in seen:
                    continue
                seen.add(pid)
                time.sleep(random.uniform(0, self.latest))
                if state(pid) in ("", "Z", "X"):
                    continue  # it finished first: not a kill
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.0005)


def summary(log: CycleLog, signals: SignalLog | None = None, **extra: Any) -> dict[str, Any]:
    """One line of numbers for a storm."""
    def dist(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {}
        s = sorted(xs)
        return {"median": round(statistics.median(s), 1),
                "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 1),
                "worst": round(s[-1], 1)}

    out: dict[str, Any] = {"cycles": log.cycles, "ok": log.ok, "errors": dict(log.errors),
                           "bad_dumps": log.bad_dumps, "modes": dict(log.modes),
                           "stopped_ms": dist(log.stopped_ms),
                           "heartbeat_gap_ms": dist(log.gaps_ms)}
    if signals is not None:
        out.update({"signals_sent": dict(signals.sent), "lost": dict(signals.lost),
                    "doubled": dict(signals.doubled), "stops": signals.stops,
                    "stops_lost": signals.stops_lost})
    out.update(extra)
    return out


def print_summary(title: str, doc: dict[str, Any]) -> None:
    sys.stdout.write(f"{title}: {json.dumps(doc)}\n")
    sys.stdout.flush()
