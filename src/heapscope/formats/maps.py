"""Readers for the memory map at the end of a heap dump (the MAPPED_LIBRARIES section).

jemalloc copies ``/proc/<pid>/maps`` verbatim on Linux, writes ``start-end: path`` lines on
macOS (5.3.1+), and ``/proc/curproc/map`` lines on FreeBSD. Paths may contain spaces and may
end with `` (deleted)`` when the file was replaced after it was mapped.
"""

from __future__ import annotations

import re

from heapscope.model import Mapping

_DELETED = " (deleted)"
_LIMIT = 1 << 64  # mappings' numbers are 64-bit

# 7f20c4a00000-7f20c4a99000 r--p 00000000 fe:00 339903   /usr/lib/libstdc++.so.6
_LINUX = re.compile(
    r"^([0-9a-fA-F]+)-([0-9a-fA-F]+)\s+([-rwxsp]{4})\s+([0-9a-fA-F]+)\s+\S+\s+\d+\s?(.*)$"
)
# 0000000100000000-0000000100004000: /usr/local/bin/prog
_MACOS = re.compile(r"^(?:0x)?([0-9a-fA-F]+)-(?:0x)?([0-9a-fA-F]+):\s+(.*)$")
# 0x400000 0x401000 -1 1 0xfffff800 r-x 1 0 0x1000 COW NC vnode /bin/cat NCH -1
_FREEBSD = re.compile(
    r"^0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)\s+-?\d+\s+-?\d+\s+0x[0-9a-fA-F]+\s+"
    r"([-rwx]{3})\s+\d+\s+\d+\s+0x[0-9a-fA-F]+\s+\S+\s+\S+\s+(\S+)\s+(\S+)"
)


def _path(raw: str) -> tuple[str, bool]:
    path = raw.strip()
    if path.endswith(_DELETED):
        return path[: -len(_DELETED)], True
    return path, False


def parse_maps_line(line: str) -> Mapping | None:
    """Parse one memory-map line in any supported dialect; None if it is not one."""
    line = line.rstrip("\r\n")
    m = _LINUX.match(line)
    if m:
        path, deleted = _path(m.group(5))
        return Mapping(
            start=int(m.group(1), 16),
            limit=int(m.group(2), 16),
            offset=int(m.group(4), 16),
            path=path,
            perms=m.group(3),
            deleted=deleted,
        )
    m = _FREEBSD.match(line)
    if m:
        path = m.group(5) if m.group(4) == "vnode" else ""
        return Mapping(
            start=int(m.group(1), 16),
            limit=int(m.group(2), 16),
            offset=0,
            path=path if path != "-" else "",
            perms=m.group(3) + "p",
        )
    m = _MACOS.match(line)
    if m:
        path, deleted = _path(m.group(3))
        return Mapping(
            start=int(m.group(1), 16),
            limit=int(m.group(2), 16),
            offset=0,
            path=path,
            perms="r-xp",
            deleted=deleted,
        )
    return None


def parse_maps(lines: list[str]) -> tuple[Mapping, ...]:
    """Parse a block of memory-map lines, skipping lines that are not mappings: those that
    do not parse, and those whose range is empty or reaches past 64 bits (damage: no
    address space is that wide, and pprof could not hold it)."""
    out = []
    for line in lines:
        mp = parse_maps_line(line)
        if mp is not None and mp.start < mp.limit < _LIMIT and mp.offset < _LIMIT:
            out.append(mp)
    out.sort(key=lambda mp: mp.start)
    return tuple(out)
