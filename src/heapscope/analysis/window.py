"""The newest dumps of one live process, kept reduced from one round to the next.

``heapscope leaks`` reads a series once. The agent and ``attach … watch`` judge the same
process every round, over a window that gains one dump and loses the oldest. A
:class:`Window` keeps what one round can hand to the next, so a round costs about one
dump's work, however long the window:

- each dump's counts per stack, read once (the compiled reader when built) into one table of
  stacks that lives as long as the window;
- every address's name: a round symbolizes only addresses it has never seen;
- the sites (the window's distinct stacks pruned and folded): made again only when the set of
  stacks the window's dumps use changed, since folding weighs all of them together.

The matrices are rebuilt from the kept counts every round (one vectorized pass over the
window's rows, a small part of the round). :meth:`Window.series` is the series
:func:`heapscope.analysis.series.load_series` gives for the same dumps (a test checks it);
only the symbolizer's diagnostics differ: the window keeps each one said since it began.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping as MappingT
from types import MappingProxyType

import numpy as np

from heapscope.analysis.fold import FramePolicy
from heapscope.analysis.series import (
    Naming,
    ProcessSeries,
    SiteKey,
    name_stacks,
    series_of,
    used_stacks,
)
from heapscope.errors import InputError
from heapscope.formats.scan import DumpCounts, Scanner
from heapscope.formats.scancache import identity
from heapscope.model import Location, Profile, Sample
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize

# The table of stacks is rebuilt (see Window._compact) once it holds more than COMPACT times
# the stacks the window uses, plus COMPACT_MIN: rare enough that its cost (reading the
# window's dumps again) is spread over many rounds.
COMPACT = 4
COMPACT_MIN = 4096


class Window:
    """The last ``size`` dumps of process ``pid``, with what naming them has taught."""

    def __init__(self, pid: int | None, size: int, options: SymbolOptions, *,
                 aliases: MappingT[str, str] | None = None,
                 frames: FramePolicy | None = None) -> None:
        self.pid = pid
        self.size = max(1, size)
        self.options = options
        self.aliases = dict(aliases or {})
        self.frames = frames
        self.scanner = Scanner()  # in memory only: the window outlives no process
        self.dumps: deque[DumpCounts] = deque()
        self.locations: dict[int, Location] = {}
        self.keys: dict[tuple[int, ...], SiteKey] = {}  # each pruned stack's site name
        self.said: dict[Diagnostic, None] = {}  # every diagnostic so far, in order, once
        self.naming: Naming | None = None
        self.renamed = 0  # rounds that had to name the sites again (for benches and tests)
        # Dumps that could not be read: why, and the file's identity then (see
        # heapscope.formats.scancache.identity).
        self.refused: dict[str, tuple[str, tuple[str, int, int, int] | None]] = {}
        self.compacted = 0  # times the table was rebuilt without stacks gone from the window


    def add(self, path: str) -> None:
        """Read one more dump (the newest) and let the oldest go past ``size``. A dump that
        cannot be read raises :class:`heapscope.errors.InputError`, is kept in
        :attr:`refused`, and changes nothing else."""
        try:
            counts, _ = self.scanner.read(path)
        except InputError as e:
            self.refused[path] = (str(e), identity(path))
            raise
        self.refused.pop(path, None)
        self.dumps.append(counts)
        while len(self.dumps) > self.size:
            self.dumps.popleft()

    def gave_up(self, path: str) -> bool:
        """True when ``path`` could not be read and has not changed since (a dump that was
        still being written is read again once it has grown)."""
        got = self.refused.get(path)
        return got is not None and got[1] == identity(path)

    def drop(self, path: str) -> None:
        """Forget the dump read from ``path`` (deleted by a disk budget, say)."""
        self.dumps = deque(d for d in self.dumps if d.path != path)

    @property
    def paths(self) -> list[str]:
        """The window's dumps, oldest first."""
        return [d.path for d in self.dumps]

    def series(self) -> ProcessSeries:
        """The window as a series, ready for :func:`heapscope.analysis.leaks.find_leaks`.
        Raises ValueError on an empty window."""
        if not self.dumps:
            raise ValueError("an empty window has no series")
        dumps = list(self.dumps)
        table = self.scanner.table.stacks
        used = used_stacks(dumps, len(table))
        if len(table) > COMPACT * len(used) + COMPACT_MIN:
            dumps = self._compact()
            table = self.scanner.table.stacks
            used = used_stacks(dumps, len(table))
        naming = self.naming
        if naming is None or not np.array_equal(used, naming.used):
            naming = self.naming = name_stacks(self.pid, table, dumps, self._name,
                                               self.aliases, self.frames, used, self.keys)
            self.renamed += 1
        return series_of(self.pid, dumps, naming)

    def _compact(self) -> list[DumpCounts]:
        """Forget the stacks no dump of the window uses any more: the window's dumps read
        again into a new table (an agent watches a process for weeks, and the stacks its
        dumps hold come and go), and the names kept only for the addresses still in use."""
        self.scanner = Scanner()
        self.naming = None
        kept: deque[DumpCounts] = deque()
        for d in self.dumps:
            try:
                kept.append(self.scanner.read(d.path)[0])
            except InputError as e:  # gone or changed since: the window goes on without it
                self.refused[d.path] = (str(e), identity(d.path))
        self.dumps = kept
        live = set().union(*self.scanner.table.stacks)
        self.locations = {a: loc for a, loc in self.locations.items() if a in live}
        self.keys = {}
        self.compacted += 1
        return list(kept)

    def _name(self, union: Profile) -> tuple[MappingT[int, Location], list[Diagnostic]]:
        """Locations of every address of ``union``'s stacks; only the new are symbolized."""
        known = self.locations
        addresses = union.addresses()
        new = addresses.difference(known)
        if new:
            fresh = [s for s in union.samples if not new.isdisjoint(s.stack)]
            zero = (0.0, 0.0, 0.0, 0.0)
            # Each address is named on its own, so naming the stacks that hold new addresses
            # gives them the names the whole union would.
            part = union.with_(samples=tuple(Sample(s.stack, zero) for s in fresh),
                               locations=MappingProxyType({}))
            sym = symbolize(part, self.options)
            known.update(sym.profile.locations)
            for d in sym.diagnostics:
                self.said.setdefault(d, None)
        return MappingProxyType({a: known[a] for a in addresses if a in known}), list(self.said)

