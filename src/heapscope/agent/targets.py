"""Which processes the agent watches: by pid, by command-line pattern, by systemd unit.

Targets are found again at every round, so a process that starts and matches is picked up
and one that exits is dropped. A process is known by its pid *and* its start time (field 22
of ``/proc/PID/stat``), so a pid the kernel reuses is a new target, never the old one's
continuation.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

from heapscope.capture.container import confinement, container_identity
from heapscope.capture.procevents import read_image


@dataclass(frozen=True)
class Target:
    """One process to watch, and the service it belongs to (the label on its metrics)."""

    pid: int
    start: int  # clock ticks after boot: with the pid, a process's identity
    service: str
    cmdline: tuple[str, ...] = ()
    confined: bool = False  # in another root or mount namespace: a container, a chroot
    # What names its container, read from its cgroup: ("container", id or the cgroup's last
    # name), ("pod_uid", uid) under Kubernetes; only what is known (labels on its metrics).
    container: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """A name unique to this process over the host's uptime (its state folder)."""
        return f"{self.service}-{self.pid}-{self.start}"


@dataclass
class Selection:
    """What the user asked to watch."""

    pids: list[int] = field(default_factory=list)
    patterns: list[re.Pattern[str]] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # dumps the services write themselves
    pidfiles: list[str] = field(default_factory=list)  # files holding a service's pid


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks after boot (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> tuple[str, ...]:
    """A process's arguments (empty for kernel threads and vanished processes)."""
    return tuple(read_image(pid)[1])


def _service_name(cmd: tuple[str, ...], pid: int) -> str:
    name = os.path.basename(cmd[0]) if cmd else str(pid)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or str(pid)


def unit_main_pid(unit: str) -> int | None:
    """A systemd service's main pid (None when it is not running or systemd cannot say)."""
    try:
        out = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit],
                             capture_output=True, text=True, timeout=5, check=False).stdout
        pid = int(out.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return pid or None


def pid_from_file(path: str) -> int | None:
    """The pid a pid file holds (None when it is missing, not a regular file, or not a
    number): read afresh every round, so a restarted service is followed."""
    from heapscope.files import open_regular

    try:
        with open_regular(path) as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def find(sel: Selection, skip: set[int] | None = None) -> dict[str, Target]:
    """The processes the selection names now, by :attr:`Target.key`."""
    skip = {os.getpid(), os.getppid(), *(skip or set())}
    found: dict[str, Target] = {}

    def add(pid: int, service: str | None) -> None:
        if pid in skip:
            return
        start = start_time(pid)
        cmd = cmdline(pid)
        if start is None or not cmd:
            return
        box = confinement(pid)
        ident = tuple(sorted(container_identity(box.cgroup).items())) if box else ()
        t = Target(pid, start, service or _service_name(cmd, pid), cmd, box is not None, ident)
        found.setdefault(t.key, t)

    for pid in sel.pids:
        add(pid, None)
    for path in sel.pidfiles:
        from_file = pid_from_file(path)
        if from_file is not None:
            add(from_file, None)
    for unit in sel.units:
        main = unit_main_pid(unit)
        if main is not None:
            add(main, unit.removesuffix(".service"))
    if sel.patterns:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            cmd = cmdline(pid)
            text = " ".join(cmd)
            if cmd and any(p.search(text) for p in sel.patterns) and not _is_tooling(cmd):
                add(pid, None)
    return found


def _is_tooling(cmd: tuple[str, ...]) -> bool:
    """gdb and heapscope's own processes (its ptracer too) match patterns that name a
    target's path."""
    prog = os.path.basename(cmd[0])
    return prog in ("gdb", "heapscope") or cmd[1:3] == ("-m", "heapscope.cli.main") or any(
        arg.endswith(os.path.join("heapscope", "capture", "ptracer.py")) for arg in cmd[1:4])
