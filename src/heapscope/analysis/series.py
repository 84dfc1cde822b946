"""Load the dumps of each process as a series, ready for trend analysis.

Dumps are grouped by process id and ordered the way jemalloc numbered them (sequence, then the
index of ``i``/``m``/``u`` dumps, numerically; the final dump last). The dumps of one process
share their stacks, so each is read for its counts only (:mod:`heapscope.formats.scan`), the
union of their stacks is symbolized and pruned once, and every dump then adds its unsampled
counts into one column of three matrices (sites × dumps): estimated live bytes, estimated
objects, and the sampled objects behind them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from collections.abc import Mapping as MappingT
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from heapscope.analysis.fold import FramePolicy, Wrappers, fold
from heapscope.analysis.ownership import alias_modules
from heapscope.analysis.prune import prune
from heapscope.errors import HeapscopeError
from heapscope.formats.load import dump_order, parse_dump_name
from heapscope.formats.scan import DumpCounts, Scanner, unsampled
from heapscope.formats.scancache import ScanCache
from heapscope.memory import give_back, returnable
from heapscope.model import Location, Mapping, Profile, Sample, ViaFrame
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize

ProgressFn = Callable[[str, int, int], None]
SiteKey = tuple[str, ...]
Matrix = npt.NDArray[np.float64]


@dataclass
class ProcessSeries:
    """The dumps of one process, oldest first, reduced to live bytes and objects per site.

    A site is a pruned and folded stack written as names, so it matches across dumps,
    processes and restarts; ``site_via`` gives the frames folded into each site (those of
    its heaviest stack in the last dump). ``values``, ``objects`` and ``samples`` have one
    row per site (``sites``) and one column per dump. ``profile`` holds every distinct stack
    of the series, pruned and folded, with the locations that name them and the memory maps
    of all dumps.
    """

    pid: int | None
    paths: list[str]
    sites: list[SiteKey]
    values: Matrix  # estimated live bytes
    objects: Matrix  # estimated live objects
    samples: Matrix  # sampled objects, as the dumps hold them
    site_stacks: dict[SiteKey, tuple[int, ...]]
    profile: Profile | None
    dump_times: list[float | None] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    raw: list[Profile] = field(default_factory=list)  # symbolized, as sampled (keep_raw)
    kinds: list[str] = field(default_factory=list)  # per dump: "f", "i", "m", "u" or ""
    site_via: dict[SiteKey, tuple[ViaFrame, ...]] = field(default_factory=dict)
    wrappers: Wrappers = field(default_factory=Wrappers)
    skipped: list[str] = field(default_factory=list)  # "path: problem" of dumps left out

    @property
    def count(self) -> int:
        """How many dumps the series holds."""
        return len(self.paths)

    @property
    def totals(self) -> list[float]:
        """Estimated live bytes of each dump."""
        return [float(v) for v in self.values.sum(axis=0)] if self.sites else \
            [0.0] * self.count

    @property
    def times(self) -> list[float] | None:
        """Seconds since the first dump, when the dumps' times are known and increasing."""
        ts = self.dump_times
        if not ts or any(t is None for t in ts):
            return None
        vals = [float(t) for t in ts if t is not None]
        # mtimes tick every few milliseconds, so quick dumps may share one: allow equal times.
        if any(b < a for a, b in itertools.pairwise(vals)) or vals[-1] <= vals[0]:
            return None
        return [t - vals[0] for t in vals]


def unreadable_series(pid: int | None, reasons: list[str]) -> ProcessSeries:
    """The series of a process none of whose dumps could be read, and why."""
    empty = np.zeros((0, 0))
    return ProcessSeries(pid, [], [], empty, empty, empty, {}, None, skipped=reasons)


def frame_texts(loc: Location) -> list[str]:
    """A location as ``function file:line`` strings, innermost (inlined) first."""
    if not loc.frames:
        return [loc.fallback_name]
    return [f"{f.function} {f.file}:{f.line}" if f.file else f.function for f in loc.frames]


def group_by_pid(paths: list[str]) -> dict[int | None, list[str]]:
    """Dump paths by process id (from jemalloc's file names), each list in dump order."""
    groups: dict[int | None, list[str]] = {}
    for p in sorted(paths, key=dump_order):
        d = parse_dump_name(p)
        groups.setdefault(d.pid if d else None, []).append(p)
    return groups


def _union_profile(pid: int | None, stacks: list[tuple[int, ...]],
                   dumps: list[DumpCounts]) -> Profile:
    maps: dict[tuple[int, int, str], Mapping] = {}
    for d in dumps:
        for m in d.mappings:
            maps.setdefault((m.start, m.limit, m.path), m)
    zero = (0.0, 0.0, 0.0, 0.0)
    last = dumps[-1]
    return Profile(samples=tuple(Sample(st, zero) for st in stacks),
                   mappings=tuple(sorted(maps.values(), key=lambda m: m.start)),
                   period=last.period, sampling=last.sampling, pid=pid, kind=last.kind,
                   time=last.time, source=last.path)


def load_series(pid: int | None, paths: list[str], options: SymbolOptions,
                progress: ProgressFn | None = None, *, keep_raw: bool = False,
                aliases: MappingT[str, str] | None = None,
                frames: FramePolicy | None = None) -> ProcessSeries:
    """Load every dump of one process and reduce each to live bytes and objects per site.

    Each dump is read for its counts only; the union of their stacks is symbolized, pruned
    and folded (``frames``) once. ``keep_raw`` also returns each dump fully parsed and
    symbolized, with the locations of its own addresses only (for self-contained copies).
    """
    memory = None if keep_raw else ScanCache(options.cache_dir, pid, paths)
    scanner = Scanner(memory)
    dumps: list[DumpCounts] = []
    parsed: list[Profile] = []
    skipped: list[str] = []
    done = _reading(progress, pid, len(paths))
    if keep_raw:
        for k, path in enumerate(paths, 1):
            try:
                d, profile = scanner.read(path, keep=True)
            except HeapscopeError as e:
                if len(paths) == 1:
                    raise
                skipped.append(str(e))
                continue
            finally:
                if done is not None:
                    done(k)
            dumps.append(d)
            if profile is not None:
                parsed.append(profile)
    else:
        for got in scanner.read_all(paths, jobs=_jobs(), done=done):
            if isinstance(got, HeapscopeError):
                # A dump still being written (the newest of a live process) is skipped; a
                # series can do without it. A damaged one among older ones is skipped too.
                if len(paths) == 1:
                    raise got
                skipped.append(str(got))
                continue
            dumps.append(got)
    if memory is not None:
        memory.save()  # and lets go of the dumps: series_of gives back each one's arrays
    if not dumps:
        return unreadable_series(pid, skipped)

    def symbols(union: Profile) -> tuple[MappingT[int, Location], list[Diagnostic]]:
        sym = symbolize(union, options, progress)
        return sym.profile.locations, list(sym.diagnostics)

    naming = name_stacks(pid, scanner.table.stacks, dumps, symbols, aliases, frames)
    kept_raw = []
    if keep_raw:
        locations = naming.locations
        for r in parsed:
            own = r.addresses()
            kept_raw.append(r.with_(locations=MappingProxyType(
                {a: loc for a, loc in locations.items() if a in own})))
    return series_of(pid, dumps, naming, kept_raw, skipped, release=True)


#: How a series' addresses get their names: (the union profile of its stacks, with no
#: locations) -> (a location for every address of those stacks, what the symbolizer said).
Namer = Callable[[Profile], tuple[MappingT[int, Location], list[Diagnostic]]]


@dataclass
class Naming:
    """What the distinct stacks of a series (those its dumps use) are called: the sites,
    and the union profile pruned and folded, as :func:`series_of` needs them."""

    used: npt.NDArray[np.int64]  # the stack ids named, ascending
    sites: list[SiteKey]
    site_of: npt.NDArray[np.int64]  # per stack id of the table: its site, -1 if none
    used_site: npt.NDArray[np.int64]  # per used stack: its site
    site_stacks: dict[SiteKey, tuple[int, ...]]
    pruned: Profile  # the used stacks, in ``used`` order, pruned and folded
    locations: MappingT[int, Location]  # every address of the used stacks, as symbolized
    wrappers: Wrappers
    diagnostics: list[Diagnostic]


def used_stacks(dumps: list[DumpCounts], table_size: int) -> npt.NDArray[np.int64]:
    """The ids of the stacks these dumps use, ascending."""
    # Marked in place (a remembered table may hold stacks of dumps since gone): sorting the
    # ids of every dump together costs a long series seconds.
    seen = np.zeros(table_size, dtype=bool)
    for d in dumps:
        seen[d.ids] = True
    return np.flatnonzero(seen).astype(np.int64)


def name_stacks(pid: int | None, table: list[tuple[int, ...]], dumps: list[DumpCounts],
                namer: Namer, aliases: MappingT[str, str] | None = None,
                frames: FramePolicy | None = None,
                used: npt.NDArray[np.int64] | None = None,
                keys: dict[tuple[int, ...], SiteKey] | None = None) -> Naming:
    """Name the stacks of ``table`` the dumps use: symbolized by ``namer`` (unless the dumps
    carry their own names), modules aliased, pruned, folded into sites. ``keys``: see
    :func:`_sites`."""
    if used is None:
        used = used_stacks(dumps, len(table))
    stacks = [table[int(i)] for i in used]
    union = _union_profile(pid, stacks, dumps)
    diagnostics: list[Diagnostic] = []
    if all(d.locations for d in dumps):
        merged: dict[int, Location] = {}
        for d in dumps:
            merged.update(d.locations)  # heapscope profiles carry their own symbols
        locations: MappingT[int, Location] = MappingProxyType(merged)
    else:
        named, said = namer(union)
        diagnostics.extend(said)
        # A read-only mapping is taken as it is (the namers make theirs for this call).
        locations = named if isinstance(named, MappingProxyType) else \
            MappingProxyType(dict(named))
    union = alias_modules(union.with_(locations=locations), aliases or {})
    folded = fold(prune(union), frames)
    pruned = folded.profile
    sites, used_site, site_stacks = _sites(stacks, pruned, keys)
    site_of = np.full(len(table), -1, dtype=np.int64)
    site_of[used] = used_site
    return Naming(used, sites, site_of, used_site, site_stacks, pruned, locations,
                  folded.wrappers, diagnostics)


def series_of(pid: int | None, dumps: list[DumpCounts], naming: Naming,
              raw: list[Profile] | None = None, skipped: list[str] | None = None, *,
              release: bool = False) -> ProcessSeries:
    """The series of these dumps, their stacks named by ``naming``. ``release``: the
    caller is done with the dumps' counts, which are dropped (each dump's ``ids``,
    ``counts`` and ``nbytes`` left empty) as soon as they are added to the matrices."""
    sites = naming.sites
    site_via = _site_via(sites, naming.used, naming.used_site, naming.pruned, dumps[-1],
                         len(naming.site_of))
    values, objects, samples = _matrices(dumps, naming.site_of, len(sites), release)
    return ProcessSeries(pid, [d.path for d in dumps], sites, values, objects, samples,
                         naming.site_stacks, naming.pruned.with_(samples=()),
                         [d.time for d in dumps], list(naming.diagnostics), raw or [],
                         [d.kind for d in dumps], site_via, naming.wrappers,
                         list(skipped or []))


def _reading(progress: ProgressFn | None, pid: int | None, n: int
             ) -> Callable[[int], None] | None:
    """Where the reading of a process's ``n`` dumps is reported: ``reading dumps of pid P``,
    k of n after each dump (``heapscope.progress`` counts these across processes), starting
    with 0 of n so the step is named before a first, perhaps slow, dump is read."""
    if progress is None:
        return None
    what = f"reading dumps of pid {pid}"
    progress(what, 0, n)

    def done(k: int) -> None:
        progress(what, k, n)

    return done


def _site_via(sites: list[SiteKey], used: npt.NDArray[np.int64],
              used_site: npt.NDArray[np.int64], folded: Profile, last: DumpCounts,
              table_size: int) -> dict[SiteKey, tuple[ViaFrame, ...]]:
    """For each site, the via chain of its stack holding the most in the last dump."""
    weight = np.zeros(table_size)
    if last.ids.size:
        b, _, _ = unsampled(last)
        np.add.at(weight, last.ids, b)
    best: dict[int, tuple[float, tuple[ViaFrame, ...]]] = {}
    for i, (raw, j) in enumerate(zip(used, used_site, strict=True)):
        if j < 0:
            continue
        via = folded.samples[i].via
        w = float(weight[raw])
        got = best.get(int(j))
        if got is None or w > got[0]:
            best[int(j)] = (w, via)
    return {sites[j]: via for j, (_, via) in best.items() if via}


def _jobs() -> int:
    """Worker processes for scanning: the cores this process may run on, at most two."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def _sites(stacks: list[tuple[int, ...]], pruned: Profile,
           keys: dict[tuple[int, ...], SiteKey] | None = None
           ) -> tuple[list[SiteKey], npt.NDArray[np.int64], dict[SiteKey, tuple[int, ...]]]:
    """Each stack's site (by name), as an index; -1 for empty stacks. ``keys`` remembers
    the name of each pruned stack (a window keeps it from round to round: the addresses'
    names do not change)."""
    locs = pruned.locations
    texts: dict[int, list[str]] = {}
    if keys is None:
        keys = {}
    index: dict[SiteKey, int] = {}
    site_stacks: dict[SiteKey, tuple[int, ...]] = {}
    site_of = np.full(len(stacks), -1, dtype=np.int64)
    for i, (raw, cut) in enumerate(zip(stacks, pruned.samples, strict=True)):
        if not raw:
            continue
        key = keys.get(cut.stack)
        if key is None:
            words: list[str] = []
            for a in cut.stack:
                t = texts.get(a)
                if t is None:
                    loc = locs.get(a)
                    t = texts[a] = frame_texts(loc if loc is not None else Location(a))
                words.extend(t)
            key = keys[cut.stack] = tuple(words)
        j = index.get(key)
        if j is None:
            j = index[key] = len(index)
            site_stacks[key] = cut.stack
        site_of[i] = j
    return list(index), site_of, site_stacks


#: Dumps whose arrays are dropped between two calls to give the memory back to the system.
GIVE_BACK_EVERY = 32


def _matrices(dumps: list[DumpCounts], site_of: npt.NDArray[np.int64], sites: int,
              release: bool = False) -> tuple[Matrix, Matrix, Matrix]:
    """Estimated bytes, estimated objects and sampled objects per site (rows) and dump;
    with ``release``, each dump's arrays are dropped once added (see series_of)."""
    # Each dump is first a row (dumps x sites, in pages of their own), not a column of the
    # matrices: a row is contiguous where a column touches every page of a matrix at once,
    # so the rows' pages are taken as the dumps' arrays are given back, and a long series'
    # arrays and matrices are never all held together. Each kind then becomes its matrix
    # (sites x dumps, row-major: the judge's sums depend on the order of their terms), and
    # its rows go before the next kind's matrix is made.
    n = len(dumps)
    rows_of = [returnable((n, sites), np.dtype(np.float64)) for _ in range(3)]
    for j, d in enumerate(dumps):
        if d.ids.size:
            rows = site_of[d.ids]
            keep = (rows >= 0) & (d.nbytes > 0)
            r = rows[keep]
            for kind, w in zip(rows_of, unsampled(d), strict=True):
                kind[j] = np.bincount(r, weights=w[keep], minlength=sites)
            # (an empty dump's rows stay as they began: zeros)
        if release:
            d.ids, d.counts, d.nbytes = _NO_IDS, _NO_FLOATS, _NO_FLOATS
            if (j + 1) % GIVE_BACK_EVERY == 0:
                give_back()  # dumps scanned by threads are in those threads' heaps
    if release:
        give_back()
    out = []
    for k in range(3):
        out.append(np.ascontiguousarray(rows_of[k].T))
        rows_of[k] = _NO_ROWS
    return out[0], out[1], out[2]


_NO_IDS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
_NO_FLOATS: npt.NDArray[np.float64] = np.zeros(0, dtype=np.float64)
_NO_ROWS: npt.NDArray[np.float64] = np.zeros((0, 0), dtype=np.float64)
