"""Names for JIT code from ``perf-<pid>.map`` files (JVM, Node, .NET, CPython -X perf).

Each line is ``START SIZE name``: hex numbers with or without ``0x``, the name being the rest
of the line (it may contain spaces, and it is untrusted text: renderers must escape it).
Entries can overlap when code is moved or recompiled; the later line wins.
"""

from __future__ import annotations

import heapq
import os
import re
import stat
from bisect import bisect_right
from collections.abc import Iterable

from heapscope.files import open_regular

MAX_MAP_BYTES = 256 << 20  # perf maps grow without bound; never read more than this
_LINE_MAX = 1 << 16  # a perf map line longer than this is not an entry
_CHUNK = 1 << 20  # bytes read at a time
_LINE = re.compile(rb"[^\n]*[^\s][^\n]*")  # a line that is not blank
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]{1,16}\Z")


class PerfMap:
    """Non-overlapping ``[start, end) -> name`` intervals built from a perf map's lines."""

    def __init__(self, entries: Iterable[tuple[int, int, str]] = ()) -> None:
        """Build from ``(start, size, name)`` in file order; later entries win on overlap."""
        items = [(start, start + size, name) for start, size, name in entries if size > 0]
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._entry: list[int] = []  # index into items of the entry owning each piece
        self._items = items
        # Sweep over every boundary; in each elementary interval the live entry with the
        # highest line number (the latest write) wins. O(n log n) even for 100k-line maps.
        order = sorted(range(len(items)), key=lambda k: items[k][0])
        points = sorted({p for lo, hi, _ in items for p in (lo, hi)})
        live: list[tuple[int, int]] = []  # heap of (-line, end)
        nxt = 0
        for j, p in enumerate(points[:-1]):
            while nxt < len(order) and items[order[nxt]][0] == p:
                k = order[nxt]
                heapq.heappush(live, (-k, items[k][1]))
                nxt += 1
            while live and live[0][1] <= p:
                heapq.heappop(live)
            if not live:
                continue
            owner = -live[0][0]
            if self._entry and self._entry[-1] == owner and self._ends[-1] == p:
                self._ends[-1] = points[j + 1]
            else:
                self._starts.append(p)
                self._ends.append(points[j + 1])
                self._entry.append(owner)

    def __len__(self) -> int:
        return len(self._starts)

    def lookup(self, address: int) -> tuple[str, int] | None:
        """``(name, entry start)`` for the entry that covers ``address`` last, or None."""
        i = bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._ends[i]:
            start, _end, name = self._items[self._entry[i]]
            return name, start
        return None

    @classmethod
    def parse(cls, text: str) -> PerfMap:
        """Parse perf map text; malformed or torn lines are skipped."""
        entries = []
        for line in text.splitlines():
            parsed = parse_line(line)
            if parsed is not None:
                entries.append(parsed)
        return cls(entries)

    @classmethod
    def read(cls, path: str) -> PerfMap:
        """Read and parse a perf map file (at most :data:`MAX_MAP_BYTES`)."""
        entries = []
        left = MAX_MAP_BYTES
        tail = b""  # the start of a line whose end has not been read yet
        skipping = False  # inside a line longer than any entry
        # A piece at a time, lines found at C speed: memory stays bounded by the entries,
        # whatever the file holds (a million blank lines cost nothing).
        with open_regular(path) as fh:  # /tmp is anyone's: never block on a FIFO there
            while left > 0:
                chunk = fh.read(min(_CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
                end = chunk.rfind(b"\n") + 1
                if end == 0:
                    tail = b"" if skipping else tail + chunk
                else:
                    body = tail + chunk[:end]
                    if skipping:
                        body = body[body.find(b"\n") + 1:]
                    tail, skipping = chunk[end:], False
                    for m in _LINE.finditer(body):
                        parsed = parse_line(m.group().decode("utf-8", "replace"))
                        if parsed is not None and m.end() - m.start() <= _LINE_MAX:
                            entries.append(parsed)
                if len(tail) > _LINE_MAX:
                    tail, skipping = b"", True
        # What is left in ``tail`` is a last line still being written: not an entry yet.
        return cls(entries)


def parse_line(line: str) -> tuple[int, int, str] | None:
    """``(start, size, name)`` from one perf map line, or None when it is malformed."""
    parts = line.strip().split(None, 2)
    if len(parts) != 3:
        return None
    if not (_HEX.match(parts[0]) and _HEX.match(parts[1])):
        return None  # also rejects what int(x, 16) would take: "-1", "1_0", "+5"
    start = int(parts[0], 16)
    size = int(parts[1], 16)
    name = parts[2].strip()
    if size <= 0 or not name:
        return None
    return start, size, name


def untrusted(path: str, owners: Iterable[int]) -> str:
    """Why the perf map at ``path`` must not be read ("" when it may): like perf itself, a
    map is trusted only when owned by root or by the process's user (``owners``), and
    writable by nobody else (anyone can plant /tmp/perf-PID.map)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    allowed = {0, *owners}
    if st.st_uid not in allowed:
        return f"owned by uid {st.st_uid}, not by root or the process's user"
    if st.st_mode & 0o022:
        return "writable by other users"
    return ""


def find_perf_map(pid: int | None, dirs: Iterable[str]) -> str | None:
    """The first ``perf-<pid>.map`` in ``dirs``, or None."""
    if pid is None:
        return None
    for d in dirs:
        path = os.path.join(d, f"perf-{pid}.map")
        if os.path.isfile(path):
            return path
    return None
