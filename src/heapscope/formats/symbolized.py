"""heapscope's self-contained profile file: a dump plus its symbols, readable anywhere.

Written next to raw dumps while the binaries are still present (``heapscope run``), so a
session can be analysed later on another machine. The file is gzip-compressed JSON:
``{"format": "heapscope-profile", "version": 1, "meta": {…}, "mappings": […], "threads": […],
"samples": [[stack, values, threads], …], "locations": [[address, module, offset, mapping
index, frames], …]}``. Values stay raw (as sampled); frames are ``[function, file, line,
inlined, full_name, system_name]``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from types import MappingProxyType
from typing import Any

from heapscope.errors import InputError
from heapscope.model import (
    ADDRESS_LIMIT,
    HEAP_SAMPLE_TYPES,
    Frame,
    Location,
    Mapping,
    Profile,
    Sample,
    Thread,
    ThreadValues,
    wide_address,
)
from heapscope.units import short_number

FORMAT = "heapscope-profile"
VERSION = 1
SUFFIX = ".json.gz"


def encode(p: Profile) -> dict[str, Any]:
    """The JSON-ready form of a (symbolized) profile; InputError for a damaged one whose
    addresses do not fit in 64 bits (decode() would refuse them)."""
    wide = wide_address(p)
    if wide is not None:
        raise InputError(p.source or "the profile",
                         f"address {short_number(wide, hexadecimal=True)} does not fit in "
                         "64 bits (a damaged dump?)")
    index = {m: i for i, m in enumerate(p.mappings)}
    return {
        "format": FORMAT,
        "version": VERSION,
        "meta": {
            "period": p.period, "sampling": p.sampling, "unsampled": p.unsampled,
            "header": list(p.header), "pid": p.pid, "seq": p.seq, "kind": p.kind,
            "source": p.source, "time": p.time, "format": p.format,
            "sample_types": [[v.type, v.unit] for v in p.sample_types],
        },
        "mappings": [[m.start, m.limit, m.offset, m.path, m.perms, m.build_id, m.deleted]
                     for m in p.mappings],
        "threads": [[t.id, t.name, list(t.values)] for t in p.threads],
        "samples": [[list(s.stack), list(s.values), [[t.thread, list(t.values)]
                                                     for t in s.threads]]
                    for s in p.samples],
        "locations": [
            [loc.address, loc.module, loc.offset,
             index.get(loc.mapping, -1) if loc.mapping is not None else -1,
             [[f.function, f.file, f.line, f.inlined, f.full_name, f.system_name]
              for f in loc.frames]]
            for loc in p.locations.values()
        ],
    }


def decode(data: dict[str, Any], source: str) -> Profile:
    """A Profile from its JSON form; InputError when the content is not one."""
    try:
        if data.get("format") != FORMAT:
            raise InputError(source, "not a heapscope profile")
        if data.get("version") != VERSION:
            raise InputError(source, f"heapscope profile version {data.get('version')} "
                                     f"is not supported (expected {VERSION})")
        from heapscope.model import ValueType

        meta = data["meta"]
        mappings = tuple(Mapping(_address(a), _address(b), _address(c), str(d), str(e), str(f),
                                 bool(g))
                         for a, b, c, d, e, f, g in data["mappings"])
        locations: dict[int, Location] = {}
        for address, module, offset, mi, frames in data["locations"]:
            mapping = mappings[mi] if 0 <= mi < len(mappings) else None
            locations[_address(address)] = Location(
                _address(address), mapping, str(module), int(offset),
                tuple(Frame(str(fn), str(fl), int(ln), bool(inl), str(full), str(sysn))
                      for fn, fl, ln, inl, full, sysn in frames),
            )
        sample_types = tuple(ValueType(str(t), str(u)) for t, u in meta["sample_types"])
        # Every pass reads the four heap values by index (inuse and alloc, objects and
        # bytes): a profile with other columns would fail far from here, or be misread.
        if len(sample_types) != len(HEAP_SAMPLE_TYPES):
            raise ValueError("not the four heap sample types")
        width = len(sample_types)
        return Profile(
            samples=tuple(
                Sample(tuple(_address(a) for a in stack), _finite(values, width),
                       tuple(ThreadValues(_whole(t), _finite(vs, width)) for t, vs in threads))
                for stack, values, threads in data["samples"]
            ),
            mappings=mappings,
            sample_types=sample_types,
            period=int(meta["period"]),
            sampling=str(meta["sampling"]),
            unsampled=bool(meta["unsampled"]),
            header=_finite(meta["header"]),
            threads=tuple(Thread(_whole(i), str(n), _finite(v, width, empty=True))
                          for i, n, v in data["threads"]),
            locations=MappingProxyType(locations),
            pid=None if meta.get("pid") is None else _whole(meta["pid"]),
            seq=None if meta.get("seq") is None else _whole(meta["seq"]),
            kind=str(meta.get("kind") or ""), source=source, time=_seconds(meta.get("time")),
            format=FORMAT,
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
            RecursionError) as e:
        raise InputError(source, f"damaged heapscope profile ({type(e).__name__})") from None


def _finite(values: Any, width: int | None = None, *, empty: bool = False
            ) -> tuple[float, ...]:
    """Numbers as floats; ValueError for anything that is not a finite number, or (with
    ``width``) for a row of another length (of none, when ``empty`` allows that)."""
    out = tuple(float(v) for v in values)
    if not all(math.isfinite(v) and abs(v) < 1e20 for v in out):
        raise ValueError("a value is not a finite number")
    if width is not None and len(out) != width and not (empty and not out):
        raise ValueError(f"{len(out)} values where there are {width} sample types")
    return out


def _address(value: Any) -> int:
    """An address or memory-map number: 64 bits, as encode() wrote it."""
    n = int(value)
    if not 0 <= n < ADDRESS_LIMIT:
        raise ValueError("an address does not fit in 64 bits")
    return n


def _whole(value: Any) -> int:
    """A thread id, pid or sequence number: a whole number, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("a thread id, pid or sequence number is not a whole number")
    return value


def _seconds(value: Any) -> float | None:
    """A dump's time (seconds since the epoch, a finite number), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value):
        raise ValueError("the time is not a number")
    return float(value)


def parse(text: str, source: str) -> Profile:
    """A Profile from the (decompressed) text of a heapscope profile file."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise InputError(source, "damaged heapscope profile (invalid JSON)") from None
    if not isinstance(data, dict):
        raise InputError(source, "not a heapscope profile")
    return decode(data, source)


def write(profile: Profile, path: str) -> None:
    """Write ``profile`` to ``path`` atomically (gzip JSON)."""
    folder = os.path.dirname(os.path.abspath(path))
    import tempfile  # only when writing: start-up time

    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb",
                                                       compresslevel=5, mtime=0) as f:
            f.write(json.dumps(encode(profile), separators=(",", ":")).encode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
