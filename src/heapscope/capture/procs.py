"""Watch a process tree through /proc: who is in it, what each runs, and its RSS over time."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from heapscope.capture.procevents import ProcEvents, read_image


@dataclass
class ProcInfo:
    """What was seen of one process of the tree."""

    pid: int
    ppid: int
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    first_seen: float = 0.0
    last_seen: float = 0.0
    max_rss: int = 0
    read_at: float = 0.0  # time.monotonic() when exe and cmdline were last read by a poll

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form for the session manifest."""
        return {"pid": self.pid, "ppid": self.ppid, "exe": self.exe, "cmdline": self.cmdline,
                "first_seen": self.first_seen, "last_seen": self.last_seen,
                "max_rss": self.max_rss}


_PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, rss bytes) of a live process, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself.
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[1]), int(rest[21]) * _PAGE
    except (IndexError, ValueError):
        return None


class TreeWatcher:
    """Samples the process tree under one root pid every ``interval`` seconds.

    Records each process once (exe, command line, parent) and appends ``(t, pid, rss)`` to
    ``timeline``. Children that live shorter than one interval may be missed; their dumps still
    name them.
    """

    def __init__(self, root: int, interval: float = 0.25, start: float | None = None,
                 events: ProcEvents | None = None, sink: TextIO | None = None) -> None:
        self.root = root
        self.sink = sink  # rss.csv, written as samples come (a killed run still has it)
        self.events = events
        self.interval = interval
        self.start = time.time() if start is None else start
        self.procs: dict[int, ProcInfo] = {}
        self.timeline: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heapscope-watch", daemon=True)
        self.lock = threading.Lock()

    def begin(self) -> None:
        """Start sampling in a background thread."""
        self.sample()
        self._thread.start()

    def end(self) -> None:
        """Stop sampling; add what the kernel's fork/exec events saw that polling missed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._merge_events()

    def _merge_events(self) -> None:
        if self.events is None:
            return
        with self.events.lock:
            parent = dict(self.events.parent)
            image = dict(self.events.image)
        members = set(self.procs) | {self.root}
        changed = True
        while changed:  # forks can be reported in any order: close over the tree
            changed = False
            for child, ppid in parent.items():
                if child not in members and ppid in members:
                    members.add(child)
                    changed = True
        with self.lock:
            for pid in members:
                info = self.procs.get(pid)
                if info is None:
                    info = self.procs[pid] = ProcInfo(pid, parent.get(pid, 0))
                if pid in parent and pid != self.root:
                    info.ppid = parent[pid]
                # An exec read after the last poll's read is the newer image: a child of a
                # shell polled between its fork and its exec, then gone before the next poll,
                # would otherwise keep the shell's name (and be taken for a helper).
                if pid in image and (not info.cmdline or image[pid][2] > info.read_at):
                    info.exe, info.cmdline = image[pid][0], list(image[pid][1])

    def alive(self) -> list[int]:
        """Pids of the tree seen alive at the last sample, the root excepted."""
        with self.lock:
            return self.alive_locked()

    def alive_locked(self) -> list[int]:
        """:meth:`alive`, for a caller that holds ``lock``."""
        now = self._last
        return [p.pid for p in self.procs.values() if p.pid != self.root and p.last_seen == now]

    _last = 0.0

    def sample(self) -> None:
        """Take one sample of the whole tree."""
        t = round(time.time() - self.start, 3)
        stats: dict[int, tuple[int, int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = proc_stat(int(name))
                if st is not None:
                    stats[int(name)] = st
        # Known processes stay members even when re-parented (daemons, orphans).
        members = {pid for pid in (self.root, *self.procs) if pid in stats}
        # Descendants: repeat until closed, since children may be listed before parents.
        changed = True
        while changed:
            changed = False
            for pid, (ppid, _rss) in stats.items():
                if pid not in members and ppid in members:
                    members.add(pid)
                    changed = True
        with self.lock:
            for pid in members:
                ppid, rss = stats[pid]
                info = self.procs.get(pid)
                if info is None:
                    exe, cmd = read_image(pid)
                    info = self.procs[pid] = ProcInfo(pid, ppid, exe, cmd, t)
                    info.read_at = time.monotonic()
                else:
                    # exec() may have replaced the image, and servers retitle forked children
                    # (postgres: "postgres: user db [local] idle"): keep the latest.
                    exe, cmd = read_image(pid)
                    if exe:
                        info.exe = exe
                        info.read_at = time.monotonic()
                    if cmd:
                        info.cmdline = cmd
                info.last_seen = t
                info.max_rss = max(info.max_rss, rss)
                self.timeline.append((t, pid, rss))
            self._last = t
            if self.sink is not None:
                try:
                    self.sink.write("".join(f"{t},{pid},{stats[pid][1]}\n"
                                            for pid in sorted(members)))
                    self.sink.flush()
                except (OSError, ValueError):
                    self.sink = None  # a full disk or a closed file ends the log, not the run

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
