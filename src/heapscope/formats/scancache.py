"""On-disk memory of a series' scanned dumps, so that one more dump costs one more dump.

``heapscope attach PID watch`` and ``run --every`` grow a series by a dump at a time; judging
it again should not read the thousand dumps before. One file per series (the folder and pid
of its dumps) keeps the process's stack table and each dump's counts, keyed by the dump's
real path, size, modification time and inode: a dump that changed is scanned again. Entries
are written atomically; a damaged or foreign file is ignored and replaced. Profiles that
carry their own symbols (heapscope's copies) are not kept: they are small and self-contained.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
import tempfile
from typing import Any

import numpy as np

from heapscope import __version__
from heapscope.files import open_private
from heapscope.formats.scan import DumpCounts, StackTable
from heapscope.model import Mapping

_FORMAT = 1


def identity(path: str) -> tuple[str, int, int, int] | None:
    """What says a dump file is the one scanned before: real path, size, mtime, inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)


class ScanCache:
    """The scanned dumps of one series, kept between runs in ``<cache>/series/``."""

    def __init__(self, cache_dir: str | None, pid: int | None, paths: list[str]) -> None:
        self.file: str | None = None
        self.table = StackTable()
        self.entries: dict[tuple[str, int, int, int], DumpCounts] = {}
        self.used: set[tuple[str, int, int, int]] = set()
        self.changed = False
        if cache_dir is None or not paths:
            return
        folder = os.path.realpath(os.path.dirname(os.path.abspath(paths[0])))
        ident = (folder, pid, __version__, sys.version, _FORMAT)
        key = hashlib.sha1(repr(ident).encode()).hexdigest()
        self.file = os.path.join(cache_dir, "series", key + ".marshal")
        self._load()

    def get(self, path: str) -> DumpCounts | None:
        """The counts scanned from this very file before, if any."""
        ident = identity(path)
        if ident is None:
            return None
        got = self.entries.get(ident)
        if got is not None:
            self.used.add(ident)
            got.path = path
        return got

    def put(self, path: str, counts: DumpCounts) -> None:
        """Remember a dump just scanned."""
        ident = identity(path)
        if ident is None or self.file is None or counts.locations:
            return
        self.entries[ident] = counts
        self.used.add(ident)
        self.changed = True

    def save(self) -> None:
        """Write the series back when anything was added (entries not used are dropped)."""
        if self.file is None or not self.changed:
            return
        maps: dict[tuple[Mapping, ...], int] = {}
        rows = []
        for ident in sorted(self.used):
            d = self.entries[ident]
            m = maps.setdefault(d.mappings, len(maps))
            # Views, not copies: marshal writes them as bytes, and a long series' arrays
            # are hundreds of MB that would otherwise be held twice while it is written.
            rows.append((ident, _view(d.ids, np.int64), _view(d.counts, np.float64),
                         _view(d.nbytes, np.float64), d.period, d.sampling, d.unsampled, m,
                         d.kind, d.time))
        data = (_FORMAT, self.table.stacks, list(self.table.ids.items()),
                [[_mapping(x) for x in ms] for ms in maps], rows)
        folder = os.path.dirname(self.file)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(data))
            os.replace(tmp, self.file)
        except OSError:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def _load(self) -> None:
        assert self.file is not None
        try:
            f = open_private(self.file)
            if f is None:
                raise FileNotFoundError(self.file)
            with f:
                data = marshal.loads(f.read())
            self._decode(data)
        except (OSError, EOFError, ValueError, TypeError, IndexError, KeyError):
            self.table = StackTable()
            self.entries = {}

    def _decode(self, data: Any) -> None:
        fmt, stacks, texts, maps, rows = data
        if fmt != _FORMAT:
            raise ValueError("another format")
        table = StackTable()
        table.stacks = [tuple(s) for s in stacks]
        table.by_stack = {s: i for i, s in enumerate(table.stacks)}
        table.ids = dict(texts)
        mapsets = [tuple(Mapping(*x) for x in ms) for ms in maps]
        entries = {}
        for ident, ids, counts, nbytes, period, sampling, unsampled, m, kind, time in rows:
            arr = np.frombuffer(ids, dtype=np.int64)
            if arr.size and int(arr.max()) >= len(table.stacks):
                raise ValueError("a stack id beyond the table")
            entries[tuple(ident)] = DumpCounts(
                ident[0], arr, np.frombuffer(counts, dtype=np.float64),
                np.frombuffer(nbytes, dtype=np.float64), period, sampling, unsampled,
                mapsets[m], kind, time)
        self.table, self.entries = table, entries


def _view(a: np.ndarray[Any, Any], dtype: type[np.generic]) -> memoryview:
    """The bytes of ``a`` as ``dtype``, without a copy when it already is one."""
    return np.ascontiguousarray(a, dtype=dtype).data.cast("B")


def _mapping(m: Mapping) -> tuple[Any, ...]:
    return (m.start, m.limit, m.offset, m.path, m.perms, m.build_id, m.deleted)
