"""Load the dumps of each process as a series, ready for trend analysis.

Dumps are grouped by process id and ordered the way jemalloc numbered them (sequence, then the
index of ``i``/``m``/``u`` dumps, numerically; the final dump last). The dumps of one process
share their code addresses, so they are parsed with one cache, symbolized once for the union of
their addresses, and pruned with one memo: a hundred dumps cost little more than one.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from heapscope.analysis.prune import prune
from heapscope.analysis.unsample import unsample
from heapscope.errors import HeapscopeError
from heapscope.formats.jemalloc import ParseCache
from heapscope.formats.load import load, parse_dump_name
from heapscope.model import Mapping, Profile, Sample
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize

ProgressFn = Callable[[str, int, int], None]


@dataclass
class ProcessSeries:
    """The dumps of one process, oldest first, unsampled, symbolized and pruned."""

    pid: int | None
    paths: list[str]
    profiles: list[Profile]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    raw: list[Profile] = field(default_factory=list)  # symbolized, as sampled (keep_raw)

    @property
    def times(self) -> list[float] | None:
        """Seconds since the first dump, when the dumps' times are known and increasing."""
        ts = [p.time for p in self.profiles]
        if any(t is None for t in ts):
            return None
        vals = [float(t) for t in ts if t is not None]
        # mtimes tick every few milliseconds, so quick dumps may share one: allow equal times.
        if any(b < a for a, b in itertools.pairwise(vals)) or vals[-1] <= vals[0]:
            return None
        return [t - vals[0] for t in vals]


def dump_order(path: str) -> tuple[int, int, int, str]:
    """Sort key: pid, sequence, kind index (final dumps last), name."""
    d = parse_dump_name(path.removesuffix(".json.gz") if path.endswith(".json.gz") else path)
    if d is None:
        return (-1, 0, 0, path)
    return (d.pid, d.seq, (1 << 30) if d.kind == "f" else d.index, path)


def group_by_pid(paths: list[str]) -> dict[int | None, list[str]]:
    """Dump paths by process id (from jemalloc's file names), each list in dump order."""
    groups: dict[int | None, list[str]] = {}
    for p in sorted(paths, key=dump_order):
        d = parse_dump_name(p)
        groups.setdefault(d.pid if d else None, []).append(p)
    return groups


def _union_profile(raws: list[Profile]) -> Profile:
    stacks = {s.stack for r in raws for s in r.samples}
    maps: dict[tuple[int, int, str], Mapping] = {}
    for r in raws:
        for m in r.mappings:
            maps.setdefault((m.start, m.limit, m.path), m)
    zero = (0.0, 0.0, 0.0, 0.0)
    last = raws[-1]
    return last.with_(samples=tuple(Sample(st, zero) for st in stacks),
                      mappings=tuple(sorted(maps.values(), key=lambda m: m.start)))


def load_series(pid: int | None, paths: list[str], options: SymbolOptions,
                progress: ProgressFn | None = None, *, keep_raw: bool = False) -> ProcessSeries:
    """Load, unsample, symbolize (once) and prune every dump of one process.

    ``keep_raw`` also returns each dump symbolized but otherwise as read (for writing
    self-contained copies), each with the locations of its own addresses only.
    """
    cache = ParseCache()
    raws: list[Profile] = []
    kept: list[str] = []
    for k, path in enumerate(paths):
        if progress is not None:
            progress(f"reading dumps of pid {pid}", k, len(paths))
        try:
            raws.append(load(path, cache=cache))
            kept.append(path)
        except HeapscopeError:
            # A dump still being written (the newest of a live process) is skipped; a series
            # can do without it. A damaged dump among older ones is skipped the same way.
            if len(paths) == 1:
                raise
    if not raws:
        return ProcessSeries(pid, [], [])
    diagnostics: list[Diagnostic] = []
    if all(r.locations for r in raws):
        locations = None  # heapscope profiles carry their own symbols
    else:
        sym = symbolize(_union_profile(raws), options, progress)
        diagnostics.extend(sym.diagnostics)
        locations = MappingProxyType(dict(sym.profile.locations))
    memo: dict[tuple[int, ...], tuple[int, ...]] = {}
    profiles = []
    kept_raw = []
    for r in raws:
        if locations is not None:
            r = r.with_(locations=locations)
        if keep_raw:
            own = r.addresses()
            kept_raw.append(r.with_(locations=MappingProxyType(
                {a: loc for a, loc in r.locations.items() if a in own})))
        profiles.append(prune(unsample(r), memo if locations is not None else None))
    return ProcessSeries(pid, kept, profiles, diagnostics, kept_raw)


def pid_of(path: str) -> int | None:
    """The pid in a dump's file name, if any."""
    d = parse_dump_name(os.path.basename(path))
    return d.pid if d else None
