"""Callgrind format, for KCachegrind/QCachegrind and ``callgrind_annotate``.

One event, the chosen sample type. Every frame (inlined ones included) is a function: its
self cost is what stacks ending in it allocated, at the line of the allocating call; each
caller gets a ``calls=`` record per callee and call line whose cost is the inclusive cost of
what was allocated below that call. Stack values are rounded to integers first, so self and
inclusive costs add up exactly and ``summary:`` is their sum. Unsymbolized frames are
``module+0xoffset`` in file ``???`` at line 0. Names are compressed (``fn=(id) name`` once,
then ``fn=(id)``) as the format allows; control characters in them are written as visible
escapes (a line break would end the name).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, TextIO

from heapscope import __version__
from heapscope.model import Location, Profile
from heapscope.terminal import clean

UNKNOWN_FILE = "???"


class Func(NamedTuple):
    """A callgrind function: object, source file, name."""

    ob: str
    file: str
    name: str


class _Frame(NamedTuple):
    func: Func
    line: int


@dataclass
class _Record:
    self_cost: dict[int, int] = field(default_factory=dict)  # line -> cost
    # (callee, call line) -> [calls, inclusive cost, callee's first line]
    calls: dict[tuple[Func, int], list[int]] = field(default_factory=dict)


def _frames(loc: Location) -> tuple[_Frame, ...]:
    """A location's frames, innermost first."""
    ob = loc.mapping.path if loc.mapping is not None and loc.mapping.path else loc.module
    if not loc.frames:
        return (_Frame(Func(ob, UNKNOWN_FILE, loc.fallback_name), 0),)
    return tuple(
        _Frame(Func(ob, f.file or UNKNOWN_FILE, f.function or loc.fallback_name), f.line)
        for f in loc.frames
    )


def _stacks(profiles: Iterable[Profile], index: int) -> dict[tuple[_Frame, ...], int]:
    """Root-first frame chains and their summed values, rounded."""
    sums: dict[tuple[_Frame, ...], float] = {}
    for p in profiles:
        per_addr = {a: _frames(p.location(a)) for a in p.addresses()}
        for s in p.samples:
            v = s.values[index]
            if v == 0:
                continue
            chain: list[_Frame] = []
            for a in s.stack:
                chain.extend(per_addr[a])
            key = tuple(reversed(chain))
            sums[key] = sums.get(key, 0.0) + v
    return {k: n for k, v in sums.items() if (n := round(v)) != 0 and k}


def build(profiles: Iterable[Profile], index: int) -> tuple[dict[Func, _Record], int]:
    """Per-function self and call costs, and the total."""
    records: dict[Func, _Record] = {}
    total = 0
    for chain, value in _stacks(profiles, index).items():
        total += value
        for caller, callee in itertools.pairwise(chain):
            rec = records.setdefault(caller.func, _Record())
            key = (callee.func, caller.line)
            c = rec.calls.get(key)
            if c is None:
                rec.calls[key] = [1, value, callee.line]
            else:
                c[0] += 1
                c[1] += value
                c[2] = min(c[2], callee.line)
        leaf = chain[-1]
        rec = records.setdefault(leaf.func, _Record())
        rec.self_cost[leaf.line] = rec.self_cost.get(leaf.line, 0) + value
    return records, total


class _Names:
    """Name compression: ``(id) name`` the first time, ``(id)`` afterwards."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, name: str) -> str:
        i = self.ids.get(name)
        if i is not None:
            return f"({i})"
        i = self.ids[name] = len(self.ids) + 1
        # A name is the rest of its line: a line break (or other control character) from a
        # dump or a symbol would end it and start a line the format reads as a record.
        return f"({i}) {clean(name)}"


def render_callgrind(out: TextIO, profiles: Iterable[Profile], index: int,
                     event: str, *, cmd: str = "") -> None:
    """Write a callgrind profile of one sample value."""
    profiles = list(profiles)
    records, total = build(profiles, index)
    obs, files, fns = _Names(), _Names(), _Names()
    out.write("# callgrind format\nversion: 1\n")
    out.write(f"creator: heapscope {__version__}\n")
    pids = sorted({p.pid for p in profiles if p.pid is not None})
    if len(pids) == 1:
        out.write(f"pid: {pids[0]}\n")
    if cmd:
        out.write(f"cmd: {clean(cmd)}\n")
    out.write(f"positions: line\nevents: {event}\nsummary: {total}\n")
    for func in sorted(records):
        rec = records[func]
        out.write(f"\nob={obs(func.ob)}\nfl={files(func.file)}\nfn={fns(func.name)}\n")
        for line in sorted(rec.self_cost):
            out.write(f"{line} {rec.self_cost[line]}\n")
        for (callee, line), (calls, cost, target) in sorted(rec.calls.items()):
            out.write(f"cob={obs(callee.ob)}\n")
            out.write(f"cfl={files(callee.file)}\ncfn={fns(callee.name)}\n")
            out.write(f"calls={calls} {target}\n{line} {cost}\n")
    out.write(f"\ntotals: {total}\n")
