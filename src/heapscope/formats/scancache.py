"""On-disk memory of a series' scanned dumps, so that one more dump costs one more dump.

``heapscope attach PID watch`` and ``run --every`` grow a series by a dump at a time; judging
it again should not read the thousand dumps before. One file per series (the folder and pid
of its dumps) keeps the process's stack table and each dump's counts, keyed by the dump's
real path, size, modification time and inode: a dump that changed is scanned again. Entries
are written atomically; a damaged or foreign file is ignored and replaced. Profiles that
carry their own symbols (heapscope's copies) are not kept: they are small and self-contained.

A file is a small marshal head (the stack table, the memory maps, each dump's facts and
lengths; after its length and its digest, so that marshal only ever reads a head heapscope
wrote) and then the dumps' arrays as raw bytes, every dump's stack ids first, then their
counts, then their bytes. A long series' arrays are hundreds of MB: written one by one and
read back in the series' order, a few MB of consecutive dumps into pages of their own
(:func:`heapscope.memory.returnable`), they are never held twice (as one marshal blob would
be), and they go back to the system a few MB at a time as the series' matrices are built
(:func:`heapscope.analysis.series.series_of`), not only once the last dump is added. A
cache lets go of its entries once saved: from then on they are their reader's.
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
from heapscope.memory import returnable
from heapscope.model import Mapping

_FORMAT = 3
_LENGTH = struct.Struct("<Q")  # the head's length, before it
_DIGEST = 16  # then the head's BLAKE2b digest, bytes
# A dump's stack ids, counts and bytes.
_KINDS = (np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64))
GROUP = 8 << 20  # bytes of consecutive dumps' arrays read into one mapping


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
        # The identity of each of the series' dumps, in its order, as they were opened.
        self.wanted: dict[str, tuple[str, int, int, int]] = {}
        if cache_dir is None or not paths:
            return
        for path in paths:
            got = identity(path)
            if got is not None:
                self.wanted[path] = got
        folder = os.path.realpath(os.path.dirname(os.path.abspath(paths[0])))
        ident = (folder, pid, __version__, sys.version, _FORMAT)
        key = hashlib.sha1(repr(ident).encode()).hexdigest()
        self.file = os.path.join(cache_dir, "series", key + ".marshal")
        self._load()

    def get(self, path: str) -> DumpCounts | None:
        """The counts scanned from this very file before, if any."""
        ident = self.wanted.get(path) or identity(path)
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
        """Write the series back when anything was added (entries not used are dropped),
        then let go of every entry: the dumps read are their reader's from now on, so their
        arrays can go back to the system one dump at a time while the series is built."""
        try:
            self._write()
        finally:
            self.entries = {}
            self.used = set()
            self.changed = False

    def _write(self) -> None:
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
                f.write(_digest(head))
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
        except (OSError, EOFError, ValueError, TypeError, IndexError, KeyError,
                OverflowError, MemoryError, RecursionError, SystemError):
            self.table = StackTable()
            self.entries = {}

    def _read(self, f: BinaryIO) -> None:
        size = os.fstat(f.fileno()).st_size
        (length,) = _LENGTH.unpack(_read_exactly(f, _LENGTH.size))
        if length > size:
            raise ValueError("a head longer than the file")
        digest = _read_exactly(f, _DIGEST)
        head = _read_exactly(f, length)
        # marshal is for what heapscope wrote itself: a head that is not, byte for byte (a
        # file cut short, damaged on disk), is refused before marshal reads any of it.
        if _digest(head) != digest:
            raise ValueError("a head that is not the one written")
        fmt, stacks, texts, maps, rows = marshal.loads(head)
        if fmt != _FORMAT:
            raise ValueError("another format")
        lengths = [[int(n) for n in row[1]] for row in rows]
        if any(len(ns) != len(_KINDS) or min(ns) < 0 or len(set(ns)) != 1 for ns in lengths):
            raise ValueError("a dump of no shape")
        totals = [sum(ns[k] for ns in lengths) for k in range(len(_KINDS))]
        at = _LENGTH.size + _DIGEST + length + _padding(length)
        if at + 8 * sum(totals) != size:
            raise ValueError("arrays that do not fill the file")
        table = StackTable()
        table.stacks = [tuple(s) for s in stacks]
        table.by_stack = {s: i for i, s in enumerate(table.stacks)}
        table.ids = dict(texts)
        mapsets = [tuple(Mapping(*x) for x in ms) for ms in maps]
        # Where each dump's arrays start in the file, kind by kind.
        starts = []
        nexts = [at, at + 8 * totals[0], at + 8 * (totals[0] + totals[1])]
        for ns in lengths:
            starts.append(nexts)
            nexts = [a + 8 * n for a, n in zip(nexts, ns, strict=True)]
        # The dumps of this series in its order (then any others), a group at a time: a
        # group goes back to the system once the series is past it (see _read_group).
        position = {ident: k for k, ident in enumerate(self.wanted.values())}
        order = sorted((position.get(tuple(row[0]), len(position)), k)
                       for k, row in enumerate(rows))
        entries = {}
        group: list[int] = []
        held = 0
        for last, (_, k) in enumerate(order, 1):
            group.append(k)
            held += 8 * sum(lengths[k])
            if held < GROUP and last < len(order):
                continue
            arrays = _read_group(f.fileno(), [starts[i] for i in group],
                                 [lengths[i] for i in group], held)
            for i, (ids, counts, nbytes) in zip(group, arrays, strict=True):
                if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= len(stacks)):
                    raise ValueError("a stack id beyond the table")
                ident, _, period, sampling, unsampled, m, kind, time = rows[i]
                entries[tuple(ident)] = DumpCounts(ident[0], ids, counts, nbytes, period,
                                                   sampling, unsampled, mapsets[m], kind,
                                                   time)
            group, held = [], 0
        self.table, self.entries = table, entries


def _read_group(fd: int, starts: list[list[int]], lengths: list[list[int]], size: int
                ) -> list[tuple[np.ndarray[Any, Any], ...]]:
    """The stack ids, counts and bytes of dumps that follow each other in their series,
    read-only, from where each array starts in the file (``starts``, per dump and kind) into
    ``size`` bytes of pages of their own: they go back to the system when the last of these
    dumps is done with, and a few MB at a time take huge pages (a dump's own would not)."""
    whole = returnable((size,), np.dtype(np.uint8))
    out = []
    at = 0
    for where, ns in zip(starts, lengths, strict=True):
        dump = []
        for start, n, dtype in zip(where, ns, _KINDS, strict=True):
            part = whole[at:at + 8 * n]
            _fill(fd, part.data, start)
            view = part.view(dtype)
            view.flags.writeable = False  # as scanned: nothing may change what is shared
            dump.append(view)
            at += 8 * n
        out.append(tuple(dump))
    return out


def _padding(length: int) -> int:
    """Bytes after a head of ``length`` (and its length and digest) that align the arrays
    to 8."""
    return -(_LENGTH.size + _DIGEST + length) % 8


def _digest(head: bytes) -> bytes:
    return hashlib.blake2b(head, digest_size=_DIGEST).digest()


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
