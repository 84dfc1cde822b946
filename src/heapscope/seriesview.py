"""What the progress line of a dump series says while it runs (``run --every``,
``attach watch``): the dumps on disk per process, the pause, and the stacks growing so far.

The counts come from the session folder itself (the files jemalloc wrote), so a line never
claims a dump that is not there. The growth is a cheap estimate, not the leak analysis: the
first and newest dump of each process are read for their counts only (no symbols, no trend
test), in a background thread, at most every ``GrowthEstimate.every`` seconds and never two
at once, so the rounds of dumps are not slowed down by it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from heapscope.formats.load import parse_dump_name
from heapscope.progress import Clock, RoundReporter, RoundStatus
from heapscope.units import human_bytes


def dumps_on_disk(folder: str) -> dict[int, list[str]]:
    """The jemalloc dumps under ``folder`` (any depth: a session keeps the dumps of
    processes that changed user apart until the end) per process, in dump order."""
    from heapscope.formats.load import dump_order

    found: dict[int, list[str]] = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            d = parse_dump_name(name)
            if d is not None and name.endswith(".heap"):
                found.setdefault(d.pid, []).append(os.path.join(root, name))
    return {pid: sorted(paths, key=dump_order) for pid, paths in sorted(found.items())}


@dataclass
class Growth:
    """Stacks whose live bytes rose between the first and newest dump of a process."""

    pid: int
    stacks: int
    rate: float  # bytes per minute, those stacks together


def growth_text(found: list[Growth]) -> str:
    """``3 stacks +1.2 MiB/min (pid 41)``: the fastest-growing process first; empty when
    nothing grows."""
    grows = sorted((g for g in found if g.stacks and g.rate > 0), key=lambda g: -g.rate)
    if not grows:
        return ""
    top = grows[0]
    text = (f"{top.stacks} stack{'s' if top.stacks != 1 else ''} "
            f"+{human_bytes(top.rate)}/min (pid {top.pid})")
    if len(grows) > 1:
        text += f", {len(grows) - 1} more process{'es' if len(grows) > 2 else ''}"
    return text


def measure_growth(pid: int, paths: list[str]) -> Growth | None:
    """The growth between the first and newest readable dump of ``paths`` (counts only).

    The newest dump may still be being written: the one before it is used then."""
    import numpy as np

    from heapscope.errors import HeapscopeError
    from heapscope.formats.scan import Scanner, unsampled

    if len(paths) < 2:
        return None
    scanner = Scanner()
    try:
        first = scanner.read(paths[0])[0]
    except HeapscopeError:
        return None
    last = None
    for path in reversed(paths[1:][-2:]):
        try:
            last = scanner.read(path)[0]
            break
        except HeapscopeError:
            continue
    if last is None:
        return None
    n = len(scanner.table.stacks)
    before, after = np.zeros(n), np.zeros(n)
    seen_before, seen_after = np.zeros(n), np.zeros(n)
    np.add.at(before, first.ids, unsampled(first)[0])
    np.add.at(after, last.ids, unsampled(last)[0])
    np.add.at(seen_before, first.ids, first.counts)
    np.add.at(seen_after, last.ids, last.counts)
    # Growing: more objects sampled and more bytes estimated than at the start.
    up = (after > before) & (seen_after > seen_before)
    t0 = first.time if first.time is not None else os.path.getmtime(first.path)
    t1 = last.time if last.time is not None else os.path.getmtime(last.path)
    minutes = max(t1 - t0, 1e-3) / 60
    return Growth(pid, int(up.sum()), float((after - before)[up].sum()) / minutes)


class GrowthEstimate:
    """The stacks growing so far, estimated now and then in a background thread.

    ``poke()`` after each round starts an estimate when none runs and the last began at
    least ``every`` seconds ago, and at least ten times its own duration ago (so reading
    big dumps never takes more than about a tenth of heapscope's time); ``text`` is the
    latest result.
    """

    def __init__(self, folder: str, every: float = 10.0, clock: Clock = time.monotonic,
                 background: bool = True) -> None:
        self.folder = folder
        self.every = every
        self.clock = clock
        self.background = background
        self.text = ""
        self._running = False
        self._next = clock()
        self._lock = threading.Lock()

    def poke(self) -> None:
        """Start an estimate if one is due."""
        with self._lock:
            if self._running or self.clock() < self._next:
                return
            self._running = True
        if self.background:
            threading.Thread(target=self._estimate, daemon=True,
                             name="heapscope-growth").start()
        else:
            self._estimate()

    def _estimate(self) -> None:
        began = self.clock()
        measured = False
        try:
            found = [g for pid, paths in dumps_on_disk(self.folder).items()
                     if (g := measure_growth(pid, paths)) is not None]
            measured = bool(found)
            text = growth_text(found) if measured else self.text
        except Exception:  # an estimate for a progress line: never fatal
            text = self.text
        took = self.clock() - began
        with self._lock:
            self.text = text
            # Until some process has two dumps there is nothing to compare: try next round.
            self._next = began + max(self.every, 10 * took) if measured else began + 10 * took
            self._running = False


class SeriesRounds:
    """Turns the end of each round of dumps into a round line (:class:`RoundReporter`)."""

    def __init__(self, folder: str, reporter: RoundReporter, of: int | None = None,
                 growth: GrowthEstimate | None = None) -> None:
        self.folder = folder
        self.reporter = reporter
        self.of = of
        self.growth = growth
        self.max_pause: float | None = None

    def round(self, n: int, pids: list[int], missed: int,
              pauses: dict[int, float]) -> None:
        """Report round ``n``: ``pids`` were asked, ``missed`` brought no dump, ``pauses``
        says how long each stopped process was held (none when the helper took them)."""
        pause = max(pauses.values()) if pauses else None
        if pause is not None:
            self.max_pause = max(pause, self.max_pause or 0.0)
        dumps = {pid: len(paths) for pid, paths in dumps_on_disk(self.folder).items()}
        for pid in pids:  # asked, its dumps kept apart until the end (or none yet)
            dumps.setdefault(pid, 0)
        if self.growth is not None:
            self.growth.poke()
        self.reporter.round(RoundStatus(
            n, self.of, dumps, pause if pause is not None or self.max_pause is None else 0.0,
            self.max_pause, missed, self.growth.text if self.growth is not None else ""))

    def close(self) -> None:
        """The last line, if it was held back."""
        self.reporter.close()
