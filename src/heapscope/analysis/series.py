"""Load the dumps of each process as a series, ready for trend analysis.

Dumps are grouped by process id and ordered the way jemalloc numbered them (sequence, then the
index of ``i``/``m``/``u`` dumps, numerically; the final dump last). The dumps of one process
share their code addresses, so they are parsed with one cache, symbolized once for the union of
their addresses, and pruned with one memo: a hundred dumps cost little more than one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from heapscope.analysis.prune import prune
from heapscope.analysis.unsample import scale_values, unsample
from heapscope.errors import HeapscopeError
from heapscope.formats.jemalloc import ParseCache
from heapscope.formats.load import dump_order, load, parse_dump_name
from heapscope.model import INUSE_OBJECTS, INUSE_SPACE, Location, Mapping, Profile, Sample
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize

ProgressFn = Callable[[str, int, int], None]


SiteKey = tuple[str, ...]


@dataclass
class ProcessSeries:
    """The dumps of one process, oldest first, reduced to live bytes and objects per site.

    A site is a pruned stack written as names, so it matches across dumps, processes and
    restarts. ``last`` is the final dump, unsampled and pruned, whose locations also name
    every stack in ``site_stacks``.
    """

    pid: int | None
    paths: list[str]
    tallies: list[dict[SiteKey, list[float]]]  # per dump: site -> [bytes, objects, samples]
    site_stacks: dict[SiteKey, tuple[int, ...]]
    last: Profile | None
    dump_times: list[float | None] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    raw: list[Profile] = field(default_factory=list)  # symbolized, as sampled (keep_raw)
    kinds: list[str] = field(default_factory=list)  # per dump: "f", "i", "m", "u" or ""

    @property
    def count(self) -> int:
        """How many dumps the series holds."""
        return len(self.tallies)

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
    """Load every dump of one process and reduce each to live bytes and objects per site.

    Stacks are parsed once (one cache for all dumps), symbolized once (the union of their
    addresses) and pruned once (each distinct stack); every dump then only adds its unsampled
    counts into per-site sums. ``keep_raw`` also returns each dump symbolized but otherwise as
    read (for writing self-contained copies), with the locations of its own addresses only.
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
        return ProcessSeries(pid, [], [], {}, None)
    diagnostics: list[Diagnostic] = []
    union = _union_profile(raws)
    if all(r.locations for r in raws):
        merged: dict[int, Location] = {}
        for r in raws:
            merged.update(r.locations)  # heapscope profiles carry their own symbols
        locations = MappingProxyType(merged)
    else:
        sym = symbolize(union, options, progress)
        diagnostics.extend(sym.diagnostics)
        locations = MappingProxyType(dict(sym.profile.locations))
    union = union.with_(locations=locations)
    pruned = prune(union)
    named = pruned.locations
    pruned_of: dict[tuple[int, ...], tuple[int, ...]] = {}
    site_of: dict[tuple[int, ...], SiteKey] = {}
    site_stacks: dict[SiteKey, tuple[int, ...]] = {}
    texts: dict[int, list[str]] = {}
    for raw_s, cut in zip(union.samples, pruned.samples, strict=True):
        words: list[str] = []
        for a in cut.stack:
            t = texts.get(a)
            if t is None:
                loc = named.get(a)
                t = texts[a] = frame_texts(loc if loc is not None else Location(a))
            words.extend(t)
        key = tuple(words)
        pruned_of[raw_s.stack] = cut.stack
        site_of[raw_s.stack] = key
        site_stacks.setdefault(key, cut.stack)
    tallies = [_tally(r, site_of) for r in raws]
    last_raw = unsample(raws[-1])
    last = last_raw.with_(
        samples=tuple(Sample(pruned_of[s.stack], s.values, s.threads) for s in last_raw.samples),
        locations=named)
    kept_raw = []
    if keep_raw:
        for r in raws:
            own = r.addresses()
            kept_raw.append(r.with_(locations=MappingProxyType(
                {a: loc for a, loc in locations.items() if a in own})))
    return ProcessSeries(pid, kept, tallies, site_stacks, last, [r.time for r in raws],
                         diagnostics, kept_raw, [r.kind for r in raws])


def _tally(raw: Profile, site_of: dict[tuple[int, ...], SiteKey]) -> dict[SiteKey, list[float]]:
    """Unsampled live bytes and objects, and sampled objects, per site of one raw dump."""
    mode, period = raw.sampling, raw.period
    memo: dict[tuple[float, ...], tuple[float, float, float]] = {}
    out: dict[SiteKey, list[float]] = {}
    for s in raw.samples:
        if not s.stack or s.values[INUSE_SPACE] <= 0:
            continue
        v = memo.get(s.values)
        if v is None:
            v = memo[s.values] = _site_values(s.values, mode, period, raw.unsampled)
        key = site_of[s.stack]
        acc = out.get(key)
        if acc is None:
            out[key] = [v[0], v[1], v[2]]
        else:
            acc[0] += v[0]
            acc[1] += v[1]
            acc[2] += v[2]
    return out


def _site_values(values: tuple[float, ...], mode: str, period: int,
                 unsampled: bool) -> tuple[float, float, float]:
    """(estimated bytes, estimated objects, sampled objects) of one stack's in-use values.

    The sampled count is what a dump really observed; trend tests need it because counting
    noise follows it, not the estimate. A profile already unsampled is turned back with the
    same formula.
    """
    if unsampled:
        objects, size = values[INUSE_OBJECTS], values[INUSE_SPACE]
        if mode == "v2" and objects > 0 and period > 0:
            p = -math.expm1(-(size / objects) / period)
            return size, objects, objects * p
        return size, objects, objects
    scaled = scale_values(values, mode, period)
    return scaled[INUSE_SPACE], scaled[INUSE_OBJECTS], values[INUSE_OBJECTS]
