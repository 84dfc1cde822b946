"""On-disk cache of prepared profiles: a second look at a dump skips reading, symbolizing and
folding it.

Users run ``top``, ``graph``, ``flamegraph`` or ``diff`` on one dump many times with
different views; everything up to the fold depends only on the dump, the options, the files
its names came from and heapscope's own code. An entry is filed under the dump (the path as
given, its real path, size, mtime and inode), the symbol options, the frame policy, the user
and a stamp of heapscope's files, and lists every file the symbolizer read or looked for
(binaries, debug files, perf maps) with its size, mtime and inode, or that nothing was there
(:attr:`heapscope.symbols.Symbolized.depends`). It is used only while all of those are
unchanged: a rebuilt binary, an installed debug package or a new perf map makes the next
run compute everything again. Results that could change with nothing on disk changed (no
llvm-symbolizer, a failed run, a debuginfod server asked for a file it lacked) are never
stored.

Entries are marshal files in ``<cache>/prepared/``, written atomically and read only when
the current user owns them and nobody else may write them; the newest :data:`KEEP` are kept.
"""

from __future__ import annotations

import marshal
import os
import sys
import zlib
from functools import partial
from itertools import repeat
from operator import itemgetter
from types import MappingProxyType
from typing import Any

from heapscope import __version__
from heapscope.analysis.fold import FramePolicy, Wrappers
from heapscope.files import Stamp, keep_newest, open_private, replace_atomically, stamp
from heapscope.model import (
    Frame,
    Location,
    Mapping,
    Profile,
    Sample,
    Thread,
    ThreadValues,
    ValueType,
    ViaFrame,
)
from heapscope.native import core
from heapscope.symbols.options import Diagnostic, SymbolOptions

FORMAT = 2  # 2: Diagnostic gained path, build_id and share
FOLDER = "prepared"
# Entries kept. A command on more dumps than this does not use the cache at all: it would
# only write entries that push each other out.
KEEP = 32

Result = tuple[Profile, tuple[Diagnostic, ...], Wrappers]

_code_stamp: str | None = None


def _code() -> str:
    """Name, size and mtime of every module of this heapscope: an edited or reinstalled
    heapscope never reads what another one computed (1-2 ms for ~110 files)."""
    global _code_stamp
    if _code_stamp is None:
        found: list[tuple[str, int, int]] = []
        todo = [os.path.dirname(os.path.abspath(__file__))]
        while todo:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        if e.name != "__pycache__":
                            todo.append(e.path)
                    elif e.name.endswith((".py", ".so")):
                        st = e.stat()
                        found.append((e.path, st.st_size, st.st_mtime_ns))
        _code_stamp = repr(sorted(found))
    return _code_stamp


def identity(path: str, options: SymbolOptions, threads: bool,
             frames: FramePolicy | None) -> str | None:
    """Everything an entry for ``path`` is filed under, or None when it cannot be cached
    (standard input, not a regular file, no cache directory)."""
    if options.cache_dir is None or path == "-":
        return None
    dump = stamp(path)
    if dump is None:
        return None
    opts = (options.binaries, options.search_paths, options.sysroot, options.debug_dirs,
            options.debuginfod_urls, options.perf_map_dirs, options.system_debug_dir,
            sorted(options.recorded.items()), options.force)
    # (whether the compiled loops run: they pack stacks differently)
    return repr((FORMAT, __version__, sys.version, core is not None, os.geteuid(), path,
                 os.path.realpath(path), dump, threads, opts,
                 tuple(frames) if frames is not None else None, _code()))


def _entry_path(cache_dir: str, ident: str) -> str:
    data = ident.encode("utf-8", "surrogateescape")
    # Two 32-bit checksums name the file; the whole identity inside it decides.
    name = f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}.marshal"
    return os.path.join(cache_dir, FOLDER, name)


def load(cache_dir: str, ident: str) -> Result | None:
    """The stored result for ``ident`` if every file it depends on is unchanged, else None."""
    path = _entry_path(cache_dir, ident)
    try:
        # Written by this user and nobody else (a shared $HEAPSCOPE_CACHE_DIR): marshal
        # data is only ever read from a file this user could have written alone.
        f = open_private(path)
        if f is None:
            return None
        with f:
            data = f.read()
        stored, depends, payload = marshal.loads(data)
        if stored != ident:
            return None
        for file, was in depends:
            if stamp(file) != (tuple(was) if was is not None else None):
                return None
        return _decode(payload)
    except (OSError, EOFError, ValueError, TypeError, IndexError, KeyError):
        return None


def store(cache_dir: str, ident: str, depends: tuple[tuple[str, Stamp], ...],
          result: Result) -> None:
    """Write an entry (failures only cost the next run its speed) and keep the newest
    :data:`KEEP`."""
    payload = _encode(*result)
    if payload is None:
        return
    path = _entry_path(cache_dir, ident)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        replace_atomically(path, marshal.dumps((ident, depends, payload)))
        keep_newest(os.path.dirname(path), ".marshal", KEEP)
    except (OSError, ValueError):
        pass


def _encode(profile: Profile, diagnostics: tuple[Diagnostic, ...], wrappers: Wrappers
            ) -> Any:
    """Plain tuples and lists (marshal takes no NamedTuples); None when a location's mapping
    is not one of the profile's (never the case for a symbolized dump)."""
    index = {m: i for i, m in enumerate(profile.mappings)}
    samples = profile.samples
    # Per-thread values or "via" frames anywhere: those need converting sample by sample.
    if core is not None:
        # A million frames as indices into the few thousand distinct addresses: a third of
        # the time of marshal writing and reading them as numbers.
        table = tuple(sorted(profile.addresses()))
        packed, odd = core.pack_stacks(samples, {a: i for i, a in enumerate(table)})
        stacks: Any = (table, packed)
    else:
        stacks = list(map(itemgetter(0), samples))
        odd = [i for i, s in enumerate(samples) if s.threads or s.via]
    # Samples with per-thread values or "via" frames: those need converting one by one.
    extra = [(i, tuple(map(tuple, samples[i].threads)), tuple(map(tuple, samples[i].via)))
             for i in odd]
    # Nearby addresses share their mapping and often their frames (the same objects): each
    # converted once, and written once (marshal refers back to an object it wrote).
    by_id: dict[int, int] = {id(m): i for i, m in enumerate(profile.mappings)}
    plain: dict[int, tuple[tuple[Any, ...], ...]] = {}
    locations = []
    for loc in profile.locations.values():
        m, frames = loc.mapping, loc.frames
        k = -1 if m is None else by_id.get(id(m), -2)
        if k == -2 and m is not None:
            k = index.get(m, -2)  # an equal mapping, another object
            if k == -2:
                return None  # not one of the profile's mappings
        f = plain.get(id(frames))
        if f is None:
            f = plain[id(frames)] = tuple(map(tuple, frames))
        locations.append((loc.address, k, loc.module, loc.offset, f))
    p = profile
    return (
        stacks, list(map(itemgetter(1), samples)), extra, locations,
        list(map(tuple, p.mappings)),
        list(map(tuple, p.sample_types)), list(map(tuple, p.threads)),
        (p.period, p.sampling, p.unsampled, p.header, p.pid, p.seq, p.kind, p.source,
         p.time, p.format),
        list(map(tuple, diagnostics)),
        (sorted(wrappers.named), sorted(wrappers.user), sorted(wrappers.found.items())),
    )


def _decode(payload: Any) -> Result:
    (raw_stacks, rows, extra, raw_locations, raw_mappings, raw_types, raw_threads, meta, raw_diags,
     (named, user, found)) = payload
    # tuple.__new__ through partial: NamedTuples without their Python-level __new__ (the
    # cached result is read in a third of the time it takes to compute).
    new = tuple.__new__
    mappings = tuple(map(partial(new, Mapping), raw_mappings))
    if core is not None:
        table, packed = raw_stacks
        samples = core.unpack_samples(packed, table, rows, Sample)
    elif len(raw_stacks) == len(rows):
        samples = list(map(partial(new, Sample), zip(raw_stacks, rows, repeat(()), repeat(()))))
    else:
        raise ValueError("stacks and values differ in number")
    tv, vf = partial(new, ThreadValues), partial(new, ViaFrame)
    for i, th, via in extra:
        s = samples[i]
        samples[i] = new(Sample, (s[0], s[1], tuple(map(tv, th)), tuple(map(vf, via))))
    fr = partial(new, Frame)
    made: dict[int, tuple[Frame, ...]] = {}  # by the identity of the frames read
    locations = {}
    for a, m, mod, off, raw in raw_locations:
        frames = made.get(id(raw))
        if frames is None:
            frames = made[id(raw)] = tuple(map(fr, raw))
        locations[a] = new(Location, (a, None if m < 0 else mappings[m], mod, off, frames))
    period, sampling, unsampled, header, pid, seq, kind, source, time, fmt = meta
    profile = Profile(
        samples=tuple(samples), mappings=mappings,
        sample_types=tuple(map(partial(new, ValueType), raw_types)),
        period=period, sampling=sampling, unsampled=unsampled, header=header,
        threads=tuple(map(partial(new, Thread), raw_threads)),
        locations=MappingProxyType(locations), pid=pid, seq=seq, kind=kind, source=source,
        time=time, format=fmt)
    wrappers = Wrappers()
    wrappers.named.update(named)
    wrappers.user.update(user)
    wrappers.found.update(found)
    return profile, tuple(map(partial(new, Diagnostic), raw_diags)), wrappers
