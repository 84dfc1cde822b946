"""Counts-only reading of the dumps of a series: per stack, the in-use objects and bytes.

A series of a hundred dumps of a process with tens of thousands of stacks is gigabytes of
text that repeats the same stacks in every dump. Judging it needs only each stack's in-use
count and bytes, so a regular expression pulls ``(stack, count, bytes)`` out of a dump's
records at C speed; each stack text is turned into addresses once per process
(:class:`StackTable`), and memory maps that repeat from dump to dump are parsed once. With the
compiled loops (:mod:`heapscope.native`) a plain dump's bytes go straight to
``scan_counts``, which numbers its stacks and writes the counts into arrays without making
a Python object per record; whatever it finds unusual it leaves to the expression. Anything
unusual (legacy formats, heapscope's own profiles, stray ``<jemalloc>`` lines inside the
records, carriage returns, a record the expression does not match) is read by the full
parser and converted, so the result never depends on which path read the dump.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from heapscope.errors import InputError
from heapscope.files import open_regular
from heapscope.formats.jemalloc import ParseCache
from heapscope.formats.load import load, max_input, parse_dump_name, read_text
from heapscope.formats.maps import parse_maps
from heapscope.model import INUSE_OBJECTS, INUSE_SPACE, Location, Mapping, Profile
from heapscope.native import core

_HEADER = re.compile(r"heap_v2/(\d{1,19})[ \t]*\n")
# Every record starts a line with "@"; a record whose next line is not its t* counts still
# matches, with empty counts, which the conversion to numbers then refuses.
_RECORD = re.compile(
    r"^@[ \t]*([^\n]*)\n(?:[ \t]*t\*:[ \t]*(\d{1,19}):[ \t]*(\d{1,19})[ \t]*\[)?", re.M)
# The same header, and the blank runs load.read_text makes one, in the bytes of a dump.
_HEADER_BYTES = re.compile(rb"heap_v2/([0-9]{1,19})[ \t]*\n")
_BLANK_RUN = re.compile(rb"\n[ \t\r\n]*\n")

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
#: Called with how many dumps of a series are read so far: 1, 2, … up to all of them.
Done = Callable[[int], None]


class ScanMemory(Protocol):
    """Where scanned dumps are remembered between runs (see formats/scancache.py)."""

    table: StackTable

    def get(self, path: str) -> DumpCounts | None:
        """The counts scanned from this very file before, if any."""

    def put(self, path: str, counts: DumpCounts) -> None:
        """Remember a dump just scanned."""


class StackTable:
    """The distinct stacks of one process's dumps, numbered in the order first seen."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self._hex: dict[str, int] = {}
        self.by_stack: dict[tuple[int, ...], int] = {}

    def id_of_text(self, text: str) -> int:
        """The id of the stack written ``text`` (addresses, leaf first); ValueError if bad."""
        got = self.ids.get(text)
        if got is None:
            hexes = self._hex
            addrs = []
            for tok in text.split():
                a = hexes.get(tok)
                if a is None:
                    a = hexes[tok] = int(tok, 16)
                addrs.append(a)
            got = self.ids[text] = self.id_of_stack(tuple(addrs))
        return got

    def id_of_stack(self, stack: tuple[int, ...]) -> int:
        """The id of a stack of addresses."""
        got = self.by_stack.get(stack)
        if got is None:
            got = self.by_stack[stack] = len(self.stacks)
            self.stacks.append(stack)
        return got


@dataclass
class DumpCounts:
    """One dump of a series: raw in-use counts per stack id, and the facts around them."""

    path: str
    ids: Ints
    counts: Floats  # in-use objects, as written (sampled)
    nbytes: Floats  # in-use bytes, as written
    period: int
    sampling: str
    unsampled: bool
    mappings: tuple[Mapping, ...]
    kind: str = ""
    time: float | None = None
    locations: dict[int, Location] = field(default_factory=dict)  # heapscope profiles only


class Scanner:
    """Reads the dumps of one process into :class:`DumpCounts`, sharing what repeats.

    With a ``memory`` (:class:`heapscope.formats.scancache.ScanCache`) dumps scanned by an
    earlier run are taken from it, and new ones are added to it.
    """

    def __init__(self, memory: ScanMemory | None = None) -> None:
        self.memory = memory
        self.table = memory.table if memory is not None else StackTable()
        self._maps: dict[str, tuple[Mapping, ...]] = {}
        self._parse = ParseCache()
        self._bytes = ByteTexts(self.table.id_of_text)

    def read(self, path: str, *, keep: bool = False) -> tuple[DumpCounts, Profile | None]:
        """The dump's counts, and (when ``keep``, or when the fast path did not apply) the
        fully parsed profile. Bad input raises :class:`heapscope.errors.InputError`."""
        if not keep:
            if self.memory is not None:
                known = self.memory.get(path)
                if known is not None:
                    return known, None
            fast = self._fast_bytes(path)
            if fast is None:
                fast = self._fast(path, read_text(path))
            if fast is not None:
                if self.memory is not None:
                    self.memory.put(path, fast)
                return fast, None
        profile = load(path, cache=self._parse)
        counts = self.from_profile(path, profile)
        if self.memory is not None and not keep:
            self.memory.put(path, counts)
        return counts, profile

    def from_profile(self, path: str, profile: Profile) -> DumpCounts:
        """Counts of a fully parsed profile."""
        ids, counts, nbytes = [], [], []
        for s in profile.samples:
            ids.append(self.table.id_of_stack(s.stack))
            counts.append(s.values[INUSE_OBJECTS])
            nbytes.append(s.values[INUSE_SPACE])
        return DumpCounts(path, np.asarray(ids, dtype=np.int64),
                          np.asarray(counts, dtype=np.float64),
                          np.asarray(nbytes, dtype=np.float64), profile.period,
                          profile.sampling, profile.unsampled, profile.mappings, profile.kind,
                          profile.time, dict(profile.locations))

    def _fast(self, path: str, text: str) -> DumpCounts | None:
        got = _extract(text)
        if got is None:
            return None
        texts, counts, nbytes, period, maps_text = got
        table = self.table
        ids = list(map(table.ids.get, texts))  # stacks seen in an earlier dump: one lookup
        try:
            for i, known in enumerate(ids):
                if known is None:
                    ids[i] = table.id_of_text(texts[i])
        except ValueError:
            return None
        return DumpCounts(path, np.asarray(ids, dtype=np.int64), counts, nbytes, period, "v2",
                          False, self._mappings(maps_text), *_name_and_time(path))

    def _fast_bytes(self, path: str) -> DumpCounts | None:
        """The compiled way (:class:`ByteTexts`), or None when it does not apply."""
        data = read_plain(path) if core is not None else None
        got = self._bytes.scan(data) if data is not None else None
        if got is None:
            return None
        ids, counts, nbytes, period, maps_text = got
        return DumpCounts(path, ids, counts, nbytes, period, "v2", False,
                          self._mappings(maps_text), *_name_and_time(path))

    def _mappings(self, maps_text: str) -> tuple[Mapping, ...]:
        mappings = self._maps.get(maps_text)
        if mappings is None:
            mappings = self._maps[maps_text] = parse_maps(maps_text.splitlines())
        return mappings

    def read_all(self, paths: list[str], jobs: int = 1,
                 done: Done | None = None) -> list[DumpCounts | InputError]:
        """Every dump's counts (or its error), in order; with ``jobs`` > 1 the dumps not
        remembered are scanned by that many threads (compiled loop) or worker processes
        (pure Python), each process over its own share.
        ``done`` hears each dump read (remembered, scanned or refused): 1, 2, … len(paths),
        each once and in order, whichever process read it."""
        out: list[DumpCounts | InputError | None] = [None] * len(paths)
        tally = _Tally(done, len(paths))
        todo = []
        for i, path in enumerate(paths):
            known = self.memory.get(path) if self.memory is not None else None
            if known is not None:
                out[i] = known
                tally.to(tally.shown + 1)
            else:
                todo.append(i)
        if jobs > 1 and len(todo) >= PARALLEL_MIN:
            self._parallel(paths, todo, out, jobs, tally)
        # Dumps the workers left to this process (unusual text) are read here, one by one.
        read = sum(r is not None for r in out)
        for i in todo:
            if out[i] is None:
                try:
                    out[i] = self.read(paths[i])[0]
                except InputError as e:
                    out[i] = e
                read += 1
                tally.to(read)
        return [r for r in out if r is not None]

    def _threads(self, paths: list[str], todo: list[int],
                 out: list[DumpCounts | InputError | None], jobs: int, tally: _Tally) -> None:
        """Scan with the compiled loop in ``jobs`` threads: it reads a dump's records
        without the GIL, and the counts stay in this process (no copy back from workers).
        Each thread numbers its texts in its own :class:`ByteTexts`, mapped to the one
        table under a lock. Dumps it finds unusual are left (None) to the caller."""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        lock = threading.Lock()
        mine = threading.local()

        def number(text: str) -> int:
            with lock:
                return self.table.id_of_text(text)

        def scan(i: int) -> Scanned | None:
            texts = getattr(mine, "texts", None)
            if texts is None:
                texts = mine.texts = ByteTexts(number)
            data = read_plain(paths[i])
            return texts.scan(data) if data is not None else None

        scanned = tally.shown
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for i, got in zip(todo, pool.map(scan, todo), strict=True):
                if got is None:
                    continue
                ids, counts, nbytes, period, maps_text = got
                d = DumpCounts(paths[i], ids, counts, nbytes, period, "v2", False,
                               self._mappings(maps_text), *_name_and_time(paths[i]))
                if self.memory is not None:
                    self.memory.put(paths[i], d)
                out[i] = d
                scanned += 1
                tally.to(scanned)

    def _parallel(self, paths: list[str], todo: list[int],
                  out: list[DumpCounts | InputError | None], jobs: int,
                  tally: _Tally) -> None:
        """Scan ``todo`` in threads (compiled loop) or else in worker processes."""
        if core is not None:
            self._threads(paths, todo, out, jobs, tally)
            return
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        share = -(-len(todo) // jobs)
        chunks = [todo[k:k + share] for k in range(0, len(todo), share)]
        ctx = multiprocessing.get_context("fork")
        # The workers count the dumps they have scanned into one shared number, so a long
        # share shows its progress while it runs, not only when the whole share returns.
        counter = ctx.Value("q", 0) if tally.wanted else None
        before = tally.shown
        with ProcessPoolExecutor(max_workers=len(chunks), mp_context=ctx,
                                 initializer=_count_into, initargs=(counter,)) as pool:
            futures = [pool.submit(_scan_chunk, [paths[i] for i in c]) for c in chunks]
            pending = set(futures)
            while counter is not None and pending:
                _, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                tally.to(before + counter.value)
            results = [f.result() for f in futures]
        for chunk, (texts, rows) in zip(chunks, results, strict=True):
            try:
                to_global = np.asarray([self.table.id_of_text(t) for t in texts],
                                       dtype=np.int64)
            except ValueError:
                continue  # a bad stack somewhere: those dumps are read one by one
            for i, row in zip(chunk, rows, strict=True):
                if row is None:
                    continue
                local, counts, nbytes, period, maps_text = row
                d = DumpCounts(paths[i], to_global[local] if local.size else local, counts,
                               nbytes, period, "v2", False, self._mappings(maps_text),
                               *_name_and_time(paths[i]))
                if self.memory is not None:
                    self.memory.put(paths[i], d)
                out[i] = d


class _Tally:
    """Tells ``done`` each count of dumps read, once and in order, as the count rises.

    Counts may arrive in jumps (the workers' shared number, read every ``POLL_S``) and may
    fall back (a worker's share refused after it was counted is read again here): each
    number between the last told and the new one is told, and a lower one is not."""

    def __init__(self, done: Done | None, total: int) -> None:
        self.done = done
        self.total = total
        self.shown = 0

    @property
    def wanted(self) -> bool:
        """True when someone listens."""
        return self.done is not None

    def to(self, count: int) -> None:
        """The count of dumps read is now ``count``."""
        count = min(count, self.total)
        if self.done is None:
            self.shown = max(self.shown, count)
            return
        while self.shown < count:
            self.shown += 1
            self.done(self.shown)


POLL_S = 0.2  # seconds between two looks at the workers' count (a result ends a wait early)
PARALLEL_MIN = 16  # dumps to scan before it pays to start worker processes

Extracted = tuple[tuple[str, ...], Floats, Floats, int, str]
#: (stack ids, counts, bytes, period, memory-map text) of a dump read the compiled way.
Scanned = tuple[Ints, Floats, Floats, int, str]


def read_plain(path: str) -> bytes | None:
    """The bytes of an uncompressed dump read whole, or None when it is anything else
    (gzip, binary, empty, too big, unreadable): :func:`read_text` then reads it and says
    what is wrong. Skips read_text's piecewise copy, which costs ten times the read."""
    cap = max_input()
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > cap:
                return None
            data = f.read(size + 1)
    except OSError:
        return None
    # A size that changed while read is a dump still being written.
    if not data or len(data) != size or data[:2] == b"\x1f\x8b" or b"\x00" in data[:4096]:
        return None
    return data


class ByteTexts:
    """Stack texts as the compiled scanner keeps them (bytes, found by a hash of each), each
    also numbered by ``number`` (a :class:`StackTable`'s ``id_of_text``, or a worker's own
    numbering)."""

    def __init__(self, number: Callable[[str], int]) -> None:
        self.ids: dict[int, int] = {}
        self.texts: list[bytes] = []
        self.to: Ints = np.zeros(0, dtype=np.int64)
        self.number = number

    def scan(self, data: bytes) -> Scanned | None:
        """A plain heap_v2 dump's counts, its stacks numbered by ``number``; None when
        anything in it is unusual (or ``number`` refuses a stack), and then nothing of it
        is kept."""
        known = len(self.texts)
        got = _scan_bytes(data, self.ids, self.texts)
        try:
            if got is None:
                raise ValueError("unusual")
            if len(self.texts) > known:
                # Bytes of plain ASCII (scan_counts refuses any other), so the text is the
                # one read_text would give.
                new = [self.number(t.decode("ascii")) for t in self.texts[known:]]
                self.to = np.concatenate([self.to, np.asarray(new, dtype=np.int64)])
        except ValueError:
            if len(self.texts) > known:
                for h in [h for h, i in self.ids.items() if i >= known]:
                    del self.ids[h]
                del self.texts[known:]
            return None
        local, counts, nbytes, period, maps_text = got
        return self.to[local], counts, nbytes, period, maps_text


def _scan_bytes(data: bytes, ids: dict[int, int], texts: list[bytes]) -> Scanned | None:
    """:func:`_extract` of a dump's bytes by the compiled loop, stack ids numbering
    ``texts``; None when anything differs from a plain dump or no compiled loop is there."""
    head = _HEADER_BYTES.match(data)
    first = data.find(b"\n@")
    if core is None or head is None or first < 0 or \
            data.find(b"\nMAPPED_LIBRARIES:", 0, first) >= 0:
        return None
    # The compiled loop finds where the memory map starts (the first such line after the
    # first record) and refuses what _extract refuses, and any other byte than ASCII.
    got = core.scan_counts(data, first + 1, ids, texts)
    if got is None:
        return None
    maps_at, local, counts, nbytes = got
    maps = data[maps_at + 1:]
    if any(m.end() - m.start() > 2 for m in _BLANK_RUN.finditer(maps)):
        return None  # read_text would make those lines one: leave it to read_text
    try:
        data[:first].decode("utf-8")  # read_text decodes the whole dump one way or the other
        maps_text = maps.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return (np.frombuffer(local, dtype=np.int64), np.frombuffer(counts, dtype=np.float64),
            np.frombuffer(nbytes, dtype=np.float64), int(head.group(1)), maps_text)


def _extract(text: str) -> Extracted | None:
    """(stack texts, counts, bytes, period, memory-map text) of a plain heap_v2 dump, or
    None when anything in it is unusual (the full parser then reads it)."""
    head = _HEADER.match(text)
    maps_at = text.find("\nMAPPED_LIBRARIES:")
    first = text.find("\n@")
    if head is None or maps_at < 0 or first < 0 or first > maps_at:
        return None
    body = text[first + 1: maps_at + 1]
    if "<jemalloc>" in body or "\r" in body:
        return None
    records = _RECORD.findall(body)
    texts, counts_text, bytes_text = zip(*records, strict=True) if records else ((), (), ())
    try:
        counts = np.asarray(counts_text, dtype=np.float64)
        nbytes = np.asarray(bytes_text, dtype=np.float64)
    except ValueError:
        return None  # a record without its counts: the full parser says where
    return texts, counts, nbytes, int(head.group(1)), text[maps_at + 1:]


def _name_and_time(path: str) -> tuple[str, float | None]:
    name = parse_dump_name(path)
    try:
        mtime: float | None = os.stat(path).st_mtime
    except OSError:
        mtime = None
    return (name.kind if name is not None else "", mtime)


ChunkRow = tuple[Ints, Floats, Floats, int, str] | None


_scanned: Synchronized[int] | None = None  # in a worker: where it counts the dumps it read


def _count_into(counter: Synchronized[int] | None) -> None:
    """A worker's start: remember the shared count of scanned dumps (None: not counted)."""
    global _scanned
    _scanned = counter


def _scan_chunk(paths: list[str]) -> tuple[list[str], list[ChunkRow]]:
    """A worker's share: each dump's records as ids into this worker's own list of stack
    texts (the parent maps them to its table), or None to leave the dump to the parent
    (which then counts it when it reads it). Each dump scanned is counted in ``_scanned``."""
    ids: dict[str, int] = {}
    texts: list[str] = []
    rows: list[ChunkRow] = []

    def number(t: str) -> int:
        k = ids.get(t)
        if k is None:
            k = ids[t] = len(texts)
            texts.append(t)
        return k

    compiled = ByteTexts(number)
    for path in paths:
        data = read_plain(path) if core is not None else None
        row: ChunkRow = compiled.scan(data) if data is not None else None
        if row is None:
            try:
                got = _extract(read_text(path))
            except InputError:
                got = None
            if got is None:
                rows.append(None)
                continue
            stacks, counts, nbytes, period, maps_text = got
            row = (np.asarray([number(t) for t in stacks], dtype=np.int64), counts, nbytes,
                   period, maps_text)
        rows.append(row)
        if _scanned is not None:
            with _scanned.get_lock():
                _scanned.value += 1
    return texts, rows


def unsampled(d: DumpCounts) -> tuple[Floats, Floats, Floats]:
    """(estimated bytes, estimated objects, sampled objects) per record of a dump.

    jeprof's adjustment, per stack: with mean period R, a stack of count c and bytes b is
    scaled by 1/(1-exp(-(b/c)/R)) (``v2``), or divided by (b/c)/R when that is below one
    (``v1``). The sampled count is what the dump really observed; trend tests need it
    because counting noise follows it. A profile already unsampled is turned back.
    InputError when an estimate is not a finite number.
    """
    c, b = d.counts, d.nbytes
    r = float(d.period)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where((c > 0) & (r > 0), (b / np.where(c > 0, c, 1.0)) / max(r, 1.0), 0.0)
        if d.sampling == "v2":
            p = np.where(ratio > 0, -np.expm1(-ratio), 1.0)
        elif d.sampling == "v1":
            p = np.where((ratio > 0) & (ratio < 1), ratio, 1.0)
        else:
            p = np.ones_like(c)
    if d.unsampled:
        return b, c, c * p
    with np.errstate(over="ignore"):
        est_b, est_c = b / p, c / p
    if not (np.isfinite(est_b).all() and np.isfinite(est_c).all()):
        # Only absurd counts do this (fractions of a byte per object): damage, said in one
        # line rather than estimates of inf bytes.
        raise InputError(d.path, "counts whose unsampled estimate is past any number "
                                 "(a damaged dump?)")
    return est_b, est_c, c
