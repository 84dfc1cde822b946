"""Counts-only reading of the dumps of a series: per stack, the in-use objects and bytes.

A series of a hundred dumps of a process with tens of thousands of stacks is gigabytes of
text that repeats the same stacks in every dump. Judging it needs only each stack's in-use
count and bytes, so a regular expression pulls ``(stack, count, bytes)`` out of a dump's
records at C speed; each stack text is turned into addresses once per process
(:class:`StackTable`), and memory maps that repeat from dump to dump are parsed once. Anything
unusual (legacy formats, heapscope's own profiles, stray ``<jemalloc>`` lines inside the
records, carriage returns, a record the expression does not match) is read by the full
parser and converted, so the result never depends on which path read the dump.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from heapscope.formats.jemalloc import ParseCache
from heapscope.formats.load import load, parse_dump_name, read_text
from heapscope.formats.maps import parse_maps
from heapscope.model import INUSE_OBJECTS, INUSE_SPACE, Location, Mapping, Profile

_HEADER = re.compile(r"heap_v2/(\d+)[ \t]*\n")
_RECORD = re.compile(r"^@[ \t]*([^\n]*)\n[ \t]*t\*:[ \t]*(\d+):[ \t]*(\d+)[ \t]*\[", re.M)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


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
    """Reads the dumps of one process into :class:`DumpCounts`, sharing what repeats."""

    def __init__(self) -> None:
        self.table = StackTable()
        self._maps: dict[str, tuple[Mapping, ...]] = {}
        self._parse = ParseCache()

    def read(self, path: str, *, keep: bool = False) -> tuple[DumpCounts, Profile | None]:
        """The dump's counts, and (when ``keep``, or when the fast path did not apply) the
        fully parsed profile. Bad input raises :class:`heapscope.errors.InputError`."""
        if not keep:
            text = read_text(path)
            fast = self._fast(path, text)
            if fast is not None:
                return fast, None
        profile = load(path, cache=self._parse)
        return self.from_profile(path, profile), profile

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
        head = _HEADER.match(text)
        maps_at = text.find("\nMAPPED_LIBRARIES:")
        first = text.find("\n@")
        if head is None or maps_at < 0 or first < 0 or first > maps_at:
            return None
        body = text[first + 1: maps_at + 1]
        if "<jemalloc>" in body or "\r" in body:
            return None
        records = _RECORD.findall(body)
        if len(records) != body.count("\n@") + 1:
            return None  # a record the expression did not match: the full parser decides
        table = self.table
        texts, counts_text, bytes_text = zip(*records, strict=True) if records else ((), (), ())
        ids = list(map(table.ids.get, texts))  # stacks seen in an earlier dump: one lookup
        try:
            for i, got in enumerate(ids):
                if got is None:
                    ids[i] = table.id_of_text(texts[i])
        except ValueError:
            return None
        counts = np.asarray(counts_text, dtype=np.float64)
        nbytes = np.asarray(bytes_text, dtype=np.float64)
        maps_text = text[maps_at + 1:]
        mappings = self._maps.get(maps_text)
        if mappings is None:
            mappings = self._maps[maps_text] = parse_maps(maps_text.splitlines())
        name = parse_dump_name(path)
        try:
            mtime: float | None = os.stat(path).st_mtime
        except OSError:
            mtime = None
        return DumpCounts(path, np.asarray(ids, dtype=np.int64), counts, nbytes,
                          int(head.group(1)), "v2", False, mappings,
                          name.kind if name is not None else "", mtime)


def unsampled(d: DumpCounts) -> tuple[Floats, Floats, Floats]:
    """(estimated bytes, estimated objects, sampled objects) per record of a dump.

    jeprof's adjustment, per stack: with mean period R, a stack of count c and bytes b is
    scaled by 1/(1-exp(-(b/c)/R)) (``v2``), or divided by (b/c)/R when that is below one
    (``v1``). The sampled count is what the dump really observed; trend tests need it
    because counting noise follows it. A profile already unsampled is turned back.
    """
    c, b = d.counts, d.nbytes
    r = float(d.period)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where((c > 0) & (r > 0), (b / np.where(c > 0, c, 1.0)) / max(r, 1.0), 0.0)
        if d.sampling == "v2":
            p = np.where(ratio > 0, -np.expm1(-ratio), 1.0)
        elif d.sampling == "v1":
            p = np.where((ratio > 0) & (ratio < 1), ratio, 1.0)
        else:
            p = np.ones_like(c)
    if d.unsampled:
        return b, c, c * p
    return b / p, c / p, c
