"""On-disk memory of a series' scanned dumps, so that one more dump costs one more dump.

``heapscope attach PID watch`` and ``run --every`` grow a series by a dump at a time; judging
it again should not read the thousand dumps before. One file per series (the folder and pid
of its dumps) keeps the process's stack table and each dump's counts, keyed by the dump's
real path, size, modification time and inode: a dump that changed is scanned again. Entries
are written atomically; a damaged or foreign file is ignored and replaced. Profiles that
carry their own symbols (heapscope's copies) are not kept: they are small and self-contained.

A file is a small marshal head (the stack table, the memory maps, each dump's facts and
lengths) and then the dumps' arrays as raw bytes, every dump's stack ids first, then their
counts, then their bytes. A long series' arrays are hundreds of MB: written one by one and
read back into one buffer of each kind, they are never held twice (as one marshal blob
would be), and the buffers go back to the system as soon as the series no longer needs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import struct
import sys
import tempfile
from typing import Any, BinaryIO

import numpy as np

from heapscope import __version__
from heapscope.files import open_private
from heapscope.formats.scan import DumpCounts, StackTable
from heapscope.model import Mapping

_FORMAT = 2
_LENGTH = struct.Struct("<Q")  # the head's length, before it
# A dump's stack ids, counts and bytes.
_KINDS = (np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64))


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
        idents = sorted(self.used)
        dumps = [self.entries[ident] for ident in idents]
        rows = []
        for ident, d in zip(idents, dumps, strict=True):
            m = maps.setdefault(d.mappings, len(maps))
            rows.append((ident, (d.ids.size, d.counts.size, d.nbytes.size), d.period,
                         d.sampling, d.unsampled, m, d.kind, d.time))
        head = marshal.dumps((_FORMAT, self.table.stacks, list(self.table.ids.items()),
                              [[_mapping(x) for x in ms] for ms in maps], rows))
        folder = os.path.dirname(self.file)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_LENGTH.pack(len(head)))
                f.write(head)
                f.write(bytes(_padding(len(head))))
                for k, dtype in enumerate(_KINDS):
                    for d in dumps:
                        f.write(_view((d.ids, d.counts, d.nbytes)[k], dtype))
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
                self._read(f)
        except (OSError, EOFError, ValueError, TypeError, IndexError, KeyError):
            self.table = StackTable()
            self.entries = {}

    def _read(self, f: BinaryIO) -> None:
        size = os.fstat(f.fileno()).st_size
        (length,) = _LENGTH.unpack(_read_exactly(f, _LENGTH.size))
        if length > size:
            raise ValueError("a head longer than the file")
        fmt, stacks, texts, maps, rows = marshal.loads(_read_exactly(f, length))
        if fmt != _FORMAT:
            raise ValueError("another format")
        lengths = [[int(n) for n in row[1]] for row in rows]
        if any(len(ns) != len(_KINDS) or min(ns) < 0 for ns in lengths):
            raise ValueError("a dump of no shape")
        totals = [sum(ns[k] for ns in lengths) for k in range(len(_KINDS))]
        at = _LENGTH.size + length + _padding(length)
        if at + 8 * sum(totals) != size:
            raise ValueError("arrays that do not fill the file")
        ids = np.empty(totals[0], dtype=np.int64)
        counts = np.empty(totals[1], dtype=np.float64)
        nbytes = np.empty(totals[2], dtype=np.float64)
        for whole in (ids, counts, nbytes):
            _fill(f.fileno(), whole.data.cast("B"), at)
            at += whole.nbytes
            whole.flags.writeable = False  # as scanned: nothing may change what is shared
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= len(stacks)):
            raise ValueError("a stack id beyond the table")
        table = StackTable()
        table.stacks = [tuple(s) for s in stacks]
        table.by_stack = {s: i for i, s in enumerate(table.stacks)}
        table.ids = dict(texts)
        mapsets = [tuple(Mapping(*x) for x in ms) for ms in maps]
        entries = {}
        starts = [0, 0, 0]
        for row, (ni, nc, nb) in zip(rows, lengths, strict=True):
            ident, _, period, sampling, unsampled, m, kind, time = row
            i, c, b = starts
            entries[tuple(ident)] = DumpCounts(ident[0], ids[i:i + ni], counts[c:c + nc],
                                               nbytes[b:b + nb], period, sampling, unsampled,
                                               mapsets[m], kind, time)
            starts = [i + ni, c + nc, b + nb]
        self.table, self.entries = table, entries


def _padding(length: int) -> int:
    """Bytes after a head of ``length`` (and its length) that align the arrays to 8."""
    return -(_LENGTH.size + length) % 8


def _fill(fd: int, buffer: memoryview, offset: int) -> None:
    """Read ``buffer`` full from ``fd`` at ``offset``."""
    done = 0
    while done < len(buffer):
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if got <= 0:
            raise EOFError("the file ends early")
        done += got


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    got = f.read(n)
    if len(got) != n:
        raise EOFError("the file ends early")
    return got


def _view(a: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> memoryview:
    """The bytes of ``a`` as ``dtype``, without a copy when it already is one (a long
    series' arrays are hundreds of MB that would otherwise be held twice as they are
    written)."""
    return np.ascontiguousarray(a, dtype=dtype).data.cast("B")


def _mapping(m: Mapping) -> tuple[Any, ...]:
    return (m.start, m.limit, m.offset, m.path, m.perms, m.build_id, m.deleted)
