"""Each process's own memory in a multi-process session, and one root per process in pictures.

A forked child starts with a copy of its parent's heap, and jemalloc's profile with it: the
child's dumps list every sampled object it inherited as its own. Adding up the processes of
a pre-fork server (PostgreSQL, nginx, gunicorn) would count the parent's start-up memory once
per worker. :func:`own_memory` takes from each child, stack by stack, what its parent holds
at the same stack (forked processes share their code addresses), never going below zero; a
process that exec'd another program shares no heap with its parent and keeps everything.

:func:`with_process_root` gives every stack of a process one outermost frame naming the
process (title, pid, role), so that a flame graph or call graph of a session has one root
per process instead of mixing them.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterable
from collections.abc import Mapping as MappingT
from types import MappingProxyType
from typing import NamedTuple

from heapscope.model import Frame, Location, Profile, Sample

PROCESS_MODULE = "[process]"
_ROOT_BASE = 1 << 62  # addresses no code has: the synthetic process frames


# A NamedTuple, not a dataclass: `heapscope top` must not import dataclasses (start-up time).
class ProcessFacts(NamedTuple):
    """What a session knows of one process."""

    pid: int
    ppid: int | None = None
    exe: str = ""
    cmdline: tuple[str, ...] = ()
    role: str = ""

    @property
    def title(self) -> str:
        """The name a user knows it by: its command line as it shows now (servers retitle
        their processes: "postgres: checkpointer"), else its program's name."""
        if self.cmdline:
            # The program by its base name (a retitled process's one string stays whole).
            first = self.cmdline[0]
            head = os.path.basename(first) if " " not in first.strip() else first.strip()
            text = " ".join([head, *(shlex.quote(a) for a in self.cmdline[1:])])
            return text if len(text) <= 60 else text[:59] + "…"
        return os.path.basename(self.exe) or f"pid {self.pid}"

    @property
    def label(self) -> str:
        """``title [pid N, role]``, the root frame's name."""
        role = f", {self.role}" if self.role else ""
        return f"{self.title} [pid {self.pid}{role}]"


def _totals(profile: Profile) -> dict[tuple[int, ...], list[float]]:
    out: dict[tuple[int, ...], list[float]] = {}
    for s in profile.samples:
        acc = out.get(s.stack)
        if acc is None:
            out[s.stack] = list(s.values)
        else:
            for i, v in enumerate(s.values):
                acc[i] += v
    return out


def subtract_parent(child: Profile, parent: Profile) -> Profile:
    """``child`` less, stack by stack, what ``parent`` holds at the same stack (each value
    floored at zero; samples left with nothing dropped)."""
    held = _totals(parent)
    left = {k: list(v) for k, v in held.items()}
    samples = []
    for s in child.samples:
        take = left.get(s.stack)
        if take is None:
            samples.append(s)
            continue
        values = []
        for i, v in enumerate(s.values):
            t = min(v, take[i]) if v > 0 else 0.0
            take[i] -= t
            values.append(v - t)
        if any(v > 0 for v in values):
            samples.append(Sample(s.stack, tuple(values), s.threads))
    return child.with_(samples=tuple(samples))


def main_image(profile: Profile) -> str:
    """The program file a profile's process ran: its first executable file mapping."""
    return next((m.path for m in profile.mappings if m.executable and not m.anonymous), "")


def fill_images(facts: MappingT[int, ProcessFacts], profiles: Iterable[Profile]
                ) -> dict[int, ProcessFacts]:
    """``facts`` with each process the session saw too briefly to read its program (or
    did not list at all) given the program its dump names."""
    out = dict(facts)
    for p in profiles:
        if p.pid is None:
            continue
        f = out.get(p.pid)
        if f is None or not f.exe:
            exe = main_image(p)
            out[p.pid] = f._replace(exe=exe) if f is not None else ProcessFacts(p.pid, exe=exe)
    return out


def own_memory(profiles: list[Profile], facts: MappingT[int, ProcessFacts]) -> list[Profile]:
    """Each profile less what its process inherited from a parent among ``profiles`` (the
    parent's profile at the same stacks), when both run the same program image."""
    by_pid = {p.pid: p for p in profiles if p.pid is not None}
    out = []
    for p in profiles:
        f = facts.get(p.pid) if p.pid is not None else None
        parent = by_pid.get(f.ppid) if f is not None and f.ppid is not None else None
        if parent is not None and parent is not p and main_image(parent) == main_image(p):
            p = subtract_parent(p, parent)
        out.append(p)
    return out


def with_process_root(profile: Profile, label: str, index: int) -> Profile:
    """``profile`` with one more outermost frame on every stack: the process, by ``label``."""
    addr = _ROOT_BASE + index
    loc = Location(addr, None, PROCESS_MODULE, 0, (Frame(label),))
    locations = dict(profile.locations)
    locations[addr] = loc
    samples = tuple(Sample((*s.stack, addr), s.values, s.threads) for s in profile.samples)
    return profile.with_(samples=samples, locations=MappingProxyType(locations))


def facts_from_manifest(manifest: MappingT[str, object]) -> dict[int, ProcessFacts]:
    """The processes a session manifest lists (role from :mod:`analysis.processes`)."""
    from heapscope.analysis.processes import role

    procs = manifest.get("processes")
    root = manifest.get("pid")
    entries = [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []
    out: dict[int, ProcessFacts] = {}
    for e in entries:
        pid = e.get("pid")
        if not isinstance(pid, int):
            continue
        exe = str(e.get("exe") or "")
        cmd = e.get("cmdline")
        ppid = e.get("ppid")
        out[pid] = ProcessFacts(
            pid, ppid if isinstance(ppid, int) else None, exe,
            tuple(str(c) for c in cmd) if isinstance(cmd, list) else (),
            role(pid, exe, root if isinstance(root, int) else None, len(entries)))
    return out


def exe_aliases(facts: MappingT[int, ProcessFacts]) -> dict[str, str]:
    """The name each program was started as, by the file that runs: a process started as
    ``redis-server`` runs ``/usr/bin/redis-check-rdb`` (a symlink), and its frames should
    say ``redis-server``. Only when the name it was started by leads to that very file."""
    out: dict[str, str] = {}
    for f in facts.values():
        if not f.exe or not f.cmdline:
            continue
        argv0 = f.cmdline[0]
        if " " in argv0.strip() or not argv0:
            continue  # a retitled process: its first word is not a path
        name = os.path.basename(argv0)
        if name == os.path.basename(f.exe):
            continue
        found = argv0 if os.sep in argv0 else shutil.which(argv0)
        try:
            same = found is not None and os.path.samefile(found, f.exe)
        except OSError:
            same = False
        if same:
            out[f.exe] = name
    return out


def alias_modules(profile: Profile, aliases: MappingT[str, str]) -> Profile:
    """``profile`` with the module of each location in an aliased file renamed."""
    if not aliases:
        return profile
    changed = {a: loc._replace(module=aliases[loc.mapping.path])
               for a, loc in profile.locations.items()
               if loc.mapping is not None and loc.mapping.path in aliases}
    if not changed:
        return profile
    return profile.with_(locations=MappingProxyType({**profile.locations, **changed}))
