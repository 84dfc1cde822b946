"""Reader for the legacy ``heap profile:`` format (jemalloc ≤3.6, gperftools/tcmalloc).

Header: ``heap profile: <inuse objs>: <inuse bytes> [<alloc objs>: <alloc bytes>] @ <type>[/<n>]``
where type is ``heap_v2`` (Poisson sampling, mean period n), ``heap`` (v1 sampling, n is twice
the mean period), ``heapprofile`` or ``growth`` (no sampling). With no type at all, jeprof treats
the profile as v1-sampled at 128 KiB when the in-use and allocated pairs are equal; so do we.
Each following line is ``c: b [c: b] @ 0x… 0x…``; then the memory map.

Go's ``debug=1`` heap profiles use the same header with ``@ heap/<2×MemProfileRate>`` and
follow each record with ``#`` lines naming its frames (``#\t0xPC-1\tfunc+0xoff\tfile:line``),
then a ``# runtime.MemStats`` block instead of a memory map. Go samples the way jemalloc's
heap_v2 does (an exponential distribution of mean MemProfileRate), so those files are
unsampled like heap_v2 with half the header's number (as google/pprof does), and their
frames are named from the ``#`` lines (no binary needed).
"""

from __future__ import annotations

import re
from types import MappingProxyType

from heapscope.errors import InputError
from heapscope.formats.maps import parse_maps
from heapscope.model import Frame, Location, Profile, Sample
from heapscope.units import shorten

_HEADER = re.compile(
    r"^heap profile:\s*(\d{1,19}):\s+(\d{1,19})\s+\[\s*(\d{1,19}):\s+(\d{1,19})\s*\]"
    r"(?:\s*@\s*([^/\s]*)(?:/(\d{1,19}))?)?"
)
_ENTRY = re.compile(
    r"^\s*(\d{1,19}):\s+(\d{1,19})\s+\[\s*(\d{1,19}):\s+(\d{1,19})\s*\]\s+@(.*)$")
_DEFAULT_V1_PERIOD = 128 * 1024
_GO_FRAME = re.compile(
    r"^#\s+0x([0-9a-fA-F]{1,16})\s+(\S+?)(?:\+0x[0-9a-fA-F]+)?\s+(\S.*?):(\d{1,9})\s*$")


def _sampling(kind: str, number: str | None, header: tuple[float, ...]) -> tuple[str, int]:
    if kind:
        if kind == "heapprofile" or "heap" not in kind:
            return "none", 0
        if "_v2" in kind:
            return "v2", int(number) if number else _DEFAULT_V1_PERIOD
        return "v1", int(number) // 2 if number else _DEFAULT_V1_PERIOD
    if header[0] == header[2] and header[1] == header[3]:
        return "v1", _DEFAULT_V1_PERIOD
    return "none", 0


def parse_legacy(path: str, lines: list[str]) -> Profile:
    """Parse the lines of a legacy ``heap profile:`` dump."""
    start = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].startswith("<")):
        start += 1
    m = _HEADER.match(lines[start]) if start < len(lines) else None
    if m is None:
        raise InputError(path, "not a legacy heap profile (bad 'heap profile:' header)")
    header = tuple(float(m.group(k)) for k in (1, 2, 3, 4))
    sampling, period = _sampling(m.group(5) or "", m.group(6), header)

    samples: list[Sample] = []
    cache: dict[str, int] = {}
    maps_at = -1
    go_frames: dict[int, list[Frame]] = {}  # return address -> frames named by '#' lines
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line.strip() or line.startswith("<jemalloc>"):
            continue
        if line.startswith("MAPPED_LIBRARIES:") or line.startswith("--- Memory map:"):
            maps_at = i + 1
            break
        if line.startswith("#"):
            if line.startswith("# runtime.MemStats"):
                break  # Go's statistics, not records
            f = _GO_FRAME.match(line)
            if f is not None:
                # Go prints the PC minus one; stacks hold the return address itself.
                go_frames.setdefault(int(f.group(1), 16) + 1, []).append(
                    Frame(f.group(2), f.group(3), int(f.group(4))))
            continue
        e = _ENTRY.match(line)
        if e is None:
            raise InputError(path, f"line {i + 1}: unexpected line {shorten(line.strip(), 60)!r}")
        stack = []
        for tok in e.group(5).split():
            a = cache.get(tok)
            if a is None:
                try:
                    a = int(tok, 16)
                except ValueError:
                    raise InputError(path, f"line {i + 1}: bad address "
                                           f"{shorten(tok, 30)!r}") from None
                cache[tok] = a
            stack.append(a)
        values = tuple(float(e.group(k)) for k in (1, 2, 3, 4))
        samples.append(Sample(tuple(stack), values))
    mappings = parse_maps(lines[maps_at:]) if maps_at >= 0 else ()
    locations: dict[int, Location] = {}
    if go_frames:
        if m.group(5) == "heap" and m.group(6):
            sampling, period = "v2", int(m.group(6)) // 2
        for a in {a for smp in samples for a in smp.stack}:
            chain = go_frames.get(a, [])
            # Inlined calls share a PC: every frame but the last one printed is inlined.
            frames = tuple(Frame(fr.function, fr.file, fr.line, k < len(chain) - 1)
                           for k, fr in enumerate(chain))
            locations[a] = Location(a, None, "", 0, frames)
    return Profile(
        samples=tuple(samples),
        mappings=mappings,
        period=period,
        sampling=sampling,
        header=header,
        source=path,
        format="heap profile",
        locations=MappingProxyType(locations),
    )
