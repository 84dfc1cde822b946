"""On-disk cache of parsed dumps, so a second look at the same dump skips the text parse.

Users run ``top`` on one dump many times with different options; parsing a 20 MB dump costs
several times more than reloading its samples. Entries are keyed by the dump's real path,
size, mtime and inode plus the heapscope and Python versions (marshal's format is
version-specific), live in ``<cache>/dumps/`` and are written atomically. Only the newest
``KEEP`` entries are kept. A damaged entry is ignored and rewritten.
"""

from __future__ import annotations

import marshal
import os
import sys
from typing import Any

from heapscope import __version__
from heapscope.files import keep_newest, open_private, stamp
from heapscope.formats.load import load
from heapscope.model import Mapping, Profile, Sample, Thread, ThreadValues
from heapscope.native import core

KEEP = 16
_FORMAT = 1


def _key(path: str, threads: bool) -> str | None:
    st = stamp(path)  # size, mtime, inode
    if st is None:
        return None
    ident = (os.path.realpath(path), *st, threads, __version__, sys.version, _FORMAT)
    import hashlib  # only when the cache is used: start-up time

    return hashlib.sha1(repr(ident).encode()).hexdigest()


def _encode(p: Profile) -> Any:
    return (
        [(s.stack, s.values, [tuple(t) for t in s.threads]) for s in p.samples],
        [(m.start, m.limit, m.offset, m.path, m.perms, m.build_id, m.deleted)
         for m in p.mappings],
        [(t.id, t.name, t.values) for t in p.threads],
        (p.period, p.sampling, p.header, p.pid, p.seq, p.kind, p.source, p.time, p.format),
    )


def _decode(data: Any) -> Profile:
    samples, mappings, threads, meta = data
    period, sampling, header, pid, seq, kind, source, time, fmt = meta
    return Profile(
        samples=tuple(
            Sample(stack, values, tuple(ThreadValues(*t) for t in th) if th else ())
            for stack, values, th in samples
        ),
        mappings=tuple(Mapping(*m) for m in mappings),
        threads=tuple(Thread(*t) for t in threads),
        period=period, sampling=sampling, header=header, pid=pid, seq=seq, kind=kind,
        source=source, time=time, format=fmt,
    )


def load_cached(path: str, *, threads: bool = False, cache_dir: str | None = None) -> Profile:
    """Like :func:`heapscope.formats.load.load`, through the parsed-dump cache when enabled."""
    if core is not None and not threads:
        # The compiled parser reads a dump faster than this cache could be read back (0.17 s
        # against 0.35 s for 20 MB); writing the cache would only cost the first look.
        return load(path, threads=threads)
    key = _key(path, threads) if cache_dir else None
    if cache_dir is None or key is None:
        return load(path, threads=threads)
    folder = os.path.join(cache_dir, "dumps")
    entry = os.path.join(folder, key + ".marshal")
    try:
        f = open_private(entry)
        if f is not None:
            with f:
                return _decode(marshal.loads(f.read()))
    except (OSError, EOFError, ValueError, TypeError):
        pass
    profile = load(path, threads=threads)
    if not profile.locations:  # heapscope profiles carry symbols; only raw dumps are cached
        _store(folder, entry, profile)
    return profile


def _store(folder: str, entry: str, profile: Profile) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps(_encode(profile)))
        os.replace(tmp, entry)
        keep_newest(folder, ".marshal", KEEP)
    except OSError:
        pass  # a cache that cannot be written is only a slower second run

