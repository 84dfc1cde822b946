"""Open a dump file of any supported kind: detect gzip and the format, read file-name facts.

jemalloc names dumps ``<prefix>.<pid>.<seq>.<kind><n>.heap`` (kind ``f`` final, ``i`` interval,
``m`` manual ``prof.dump``, ``u`` gdump); 5.3.1 may put the pid namespace before the pid.
"""

from __future__ import annotations

import os
import re
import zlib
from typing import Final

from heapscope.errors import InputError
from heapscope.files import NotRegularFile, open_regular
from heapscope.formats.gperftools import parse_legacy
from heapscope.formats.jemalloc import ParseCache, parse_heap_v2_text
from heapscope.model import Profile

_NAME = re.compile(r"\.(\d+)\.(\d+)\.(f|[imu]\d+)\.heap(?:\.json)?(?:\.gz)?$")
_GZIP_MAGIC = b"\x1f\x8b"


# Written by hand, not as a dataclass: `heapscope top` must not import dataclasses (start-up
# time); not a NamedTuple, whose field ``index`` would hide tuple.index.
class DumpName:
    """Facts jemalloc encodes in a dump's file name."""

    __slots__ = ("index", "kind", "pid", "seq")

    def __init__(self, pid: int, seq: int, kind: str, index: int) -> None:
        self.pid: Final = pid
        self.seq: Final = seq
        self.kind: Final = kind  # "f", "i", "m" or "u"
        self.index: Final = index  # the n of i<n>/m<n>/u<n>; -1 for the final dump


def parse_dump_name(path: str) -> DumpName | None:
    """Read pid, sequence and kind from a jemalloc dump file name; None if it has no such name."""
    m = _NAME.search(os.path.basename(path))
    if m is None:
        return None
    kind = m.group(3)
    return DumpName(
        pid=int(m.group(1)),
        seq=int(m.group(2)),
        kind=kind[0],
        index=int(kind[1:]) if len(kind) > 1 else -1,
    )


def dump_order(path: str) -> tuple[int, int, int, str]:
    """Sort key in jemalloc's own order: pid, sequence, then the index of ``i``/``m``/``u``
    dumps numerically (``m10`` after ``m9``), the final dump last; unnamed files at the end."""
    d = parse_dump_name(path)
    if d is None:
        return (1 << 62, 0, 0, path)
    return (d.pid, d.seq, (1 << 30) if d.kind == "f" else d.index, path)


MAX_INPUT_ENV = "HEAPSCOPE_MAX_INPUT"
DEFAULT_MAX_INPUT = 4 << 30  # bytes a compressed input may expand to


def max_input() -> int:
    """How many bytes a compressed input may expand to: $HEAPSCOPE_MAX_INPUT (bytes), else
    4 GiB (far above real dumps, far below what a few-MB "gzip bomb" can expand to)."""
    try:
        return max(1, int(os.environ.get(MAX_INPUT_ENV, "")[:20]))
    except ValueError:
        return DEFAULT_MAX_INPUT


def gunzip(data: bytes, path: str) -> bytes:
    """Decompress gzip ``data`` (all members) up to :func:`max_input` bytes."""
    cap = max_input()
    out = []
    total = 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = d.decompress(data, cap - total + 1)
        total += len(chunk)
        if total > cap or d.unconsumed_tail:
            raise InputError(path, f"expands to more than {cap} bytes ({MAX_INPUT_ENV}=BYTES "
                                   "to allow more)")
        out.append(chunk)
        if not d.eof:
            raise EOFError("truncated gzip stream")
        data = d.unused_data.lstrip(b"\x00")
    return b"".join(out)


def _looks_like_pprof(data: bytes) -> bool:
    from heapscope.formats.pprof import decode_profile

    try:
        doc = decode_profile(data)
    except (ValueError, IndexError, KeyError, TypeError):
        return False
    return bool(doc.get("sample_type")) and bool(doc.get("string_table"))


def read_text(path: str) -> str:
    """Read a dump's text, transparently decompressing gzip, with one-line errors."""
    try:
        with open_regular(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, not a dump file") from None
    except PermissionError:
        raise InputError(path, "permission denied") from None
    except NotRegularFile:
        raise InputError(path, "not a regular file (a FIFO, device or socket?)") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    if not data:
        raise InputError(path, "empty file (is the dump still being written?)")
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gunzip(data, path)
        except (OSError, EOFError, zlib.error):
            raise InputError(path, "corrupt or truncated gzip data") from None
        if not data:
            raise InputError(path, "empty file inside gzip")
    if b"\x00" in data[:4096]:
        if _looks_like_pprof(data):
            raise InputError(path, "a pprof profile (profile.proto), not a jemalloc heap "
                                   "dump: read it with go tool pprof")
        raise InputError(path, "binary data, not a jemalloc heap profile")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # Paths in the memory map may be in any encoding; keep going rather than refuse.
        return data.decode("latin-1")


def _first_line(lines: list[str]) -> str:
    for line in lines:
        if line.strip() and not line.startswith("<jemalloc>"):
            return line
    return ""


def load(path: str, *, threads: bool = False, cache: ParseCache | None = None) -> Profile:
    """Load one heap dump (heap_v2 or legacy, plain or gzip) into a raw Profile.

    ``cache`` shares parsed stacks between the dumps of one process (a series).
    """
    text = read_text(path)
    lines = text[:4096].splitlines()
    first = _first_line(lines)
    if first.startswith("heap_v2/"):
        profile = parse_heap_v2_text(path, text, threads=threads, cache=cache)
    elif first.startswith("heap profile:"):
        profile = parse_legacy(path, text.splitlines())
    elif first.startswith("{"):
        from heapscope.formats import symbolized

        profile = symbolized.parse(text, path)
    elif first.startswith("--- symbol") or first.startswith("%"):
        raise InputError(path, "symbolized/remote pprof text profiles are not supported yet")
    else:
        shown = first.strip()[:40]
        raise InputError(path, f"not a jemalloc heap profile (first line {shown!r})")
    name = parse_dump_name(path)
    try:
        mtime: float | None = os.stat(path).st_mtime
    except OSError:
        mtime = None
    if name is not None:
        profile = profile.with_(pid=name.pid, seq=name.seq, kind=name.kind)
    # A heapscope profile keeps the time of the dump it was made from; its own file is newer.
    return profile if profile.time is not None else profile.with_(time=mtime)
