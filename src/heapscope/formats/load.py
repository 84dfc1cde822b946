"""Open a dump file of any supported kind: detect gzip and the format, read file-name facts.

jemalloc names dumps ``<prefix>.<pid>.<seq>.<kind><n>.heap`` (kind ``f`` final, ``i`` interval,
``m`` manual ``prof.dump``, ``u`` gdump); 5.3.1 may put the pid namespace before the pid.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final

from heapscope.errors import InputError
from heapscope.files import NotRegularFile, open_regular
from heapscope.formats.gperftools import parse_legacy
from heapscope.formats.jemalloc import ParseCache, parse_heap_v2_text
from heapscope.model import Profile
from heapscope.units import shorten

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
# The largest real dumps measured are 19 MB of text (65,000 stacks at lg_prof_sample:0, see
# bench/); a dump of 512 MiB would hold about 1.7 million such stacks. More than that is
# refused before it is held, unless $HEAPSCOPE_MAX_INPUT allows it.
DEFAULT_MAX_INPUT = 512 << 20
_CHUNK = 1 << 22  # bytes read (or decompressed) at a time
# A run of lines holding only blanks, after the newline that ends the line before it.
_BLANK_RUN = re.compile(rb"\n[ \t\r\n]*\n")


def max_input() -> int:
    """How many bytes of text one input may hold (after decompression, blank lines not
    counted): $HEAPSCOPE_MAX_INPUT (bytes), else 512 MiB (27 times the largest real dump
    measured, far below what a few-MB "gzip bomb" can expand to)."""
    try:
        return max(1, int(os.environ.get(MAX_INPUT_ENV, "")[:20]))
    except ValueError:
        return DEFAULT_MAX_INPUT


def _too_big(path: str, cap: int, what: str) -> InputError:
    return InputError(path, f"{what} more than {cap} bytes ({MAX_INPUT_ENV}=BYTES to allow more)")


def _gunzip_pieces(data: bytes, more: Callable[[], bytes], cap: int, path: str
                   ) -> Iterator[bytes]:
    """The decompressed text of gzip ``data`` (then of ``more()`` until it is empty), every
    member, a piece at a time; refused as soon as it expands past ``cap`` bytes."""
    total = 0
    d: Any = None  # zlib's decompressor (its class is not importable for a type)
    while True:
        if not data:
            data = more()
            if not data:
                if d is None or not d.eof:
                    raise EOFError("truncated gzip stream")
                return
        if d is None or d.eof:
            data = data.lstrip(b"\x00")  # padding between members
            if not data:
                continue
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        piece = d.decompress(data, _CHUNK)
        data = d.unused_data if d.eof else d.unconsumed_tail
        total += len(piece)
        if total > cap:
            raise _too_big(path, cap, "expands to")
        if piece:
            yield piece


def gunzip(data: bytes, path: str) -> bytes:
    """Decompress gzip ``data`` (all members) up to :func:`max_input` bytes."""
    return b"".join(_gunzip_pieces(data, lambda: b"", max_input(), path))


class _Text:
    """A dump's text gathered a piece at a time: runs of blank lines become one blank line
    (a gigabyte of newlines costs a few MB, not gigabytes), at most ``cap`` bytes kept."""

    def __init__(self, path: str, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.kept: list[bytes] = []
        self.size = 0
        self.dropped = 0  # blank lines left out
        self._open: list[bytes] = []  # the start of a line whose end has not come yet

    def add(self, piece: bytes) -> None:
        """Take the next piece of the text."""
        cut = piece.rfind(b"\n") + 1
        if cut == 0:
            self._open.append(piece)
            self._grew(len(piece))
            return
        body = piece[:cut]
        if self._open:
            body = b"".join([*self._open, body])
            self._open = []
        self._keep(body)
        if cut < len(piece):
            self._open.append(piece[cut:])
            self._grew(len(piece) - cut)

    def _keep(self, body: bytes) -> None:
        # Real dumps have one empty line (before MAPPED_LIBRARIES): left as it is, without
        # copying, and line numbers stay true.
        if any(m.end() - m.start() > 2 for m in _BLANK_RUN.finditer(body)):
            lines = body.count(b"\n")
            body = _BLANK_RUN.sub(b"\n\n", body)
            self.dropped += lines - body.count(b"\n")
        self.kept.append(body)
        self._grew(len(body))

    def _grew(self, n: int) -> None:
        self.size += n
        if self.size > self.cap:
            raise _too_big(self.path, self.cap, "holds")

    def data(self) -> bytes:
        """The text gathered, as bytes."""
        return b"".join([*self.kept, *self._open])


def _read_bytes(path: str) -> tuple[bytes, int]:
    """The bytes of a dump (decompressed; runs of blank lines made one) and how many blank
    lines were left out, with one-line errors."""
    cap = max_input()
    try:
        with open_regular(path) as f:
            head = f.read(_CHUNK)
            if not head:
                raise InputError(path, "empty file (is the dump still being written?)")
            gz = head[:2] == _GZIP_MAGIC
            pieces = (_gunzip_pieces(head, lambda: f.read(_CHUNK), cap, path) if gz
                      else _plain_pieces(head, lambda: f.read(_CHUNK)))
            text = _Text(path, cap)
            first = True
            for piece in pieces:
                if first and b"\x00" in piece[:4096]:
                    return _binary(path, piece, pieces, cap), 0
                first = False
                text.add(piece)
            if first:
                raise InputError(path, "empty file inside gzip")
            return text.data(), text.dropped
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, not a dump file") from None
    except PermissionError:
        raise InputError(path, "permission denied") from None
    except NotRegularFile:
        raise InputError(path, "not a regular file (a FIFO, device or socket?)") from None
    except (EOFError, zlib.error):
        raise InputError(path, "corrupt or truncated gzip data") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None


def _plain_pieces(head: bytes, more: Callable[[], bytes]) -> Iterator[bytes]:
    piece = head
    while piece:
        yield piece
        piece = more()


def _binary(path: str, first: bytes, rest: Iterator[bytes], cap: int) -> bytes:
    """Binary input (no dump has a NUL byte): read whole, up to ``cap``, to say what it is."""
    parts = [first]
    size = len(first)
    for piece in rest:
        size += len(piece)
        if size > cap:
            raise _too_big(path, cap, "holds")
        parts.append(piece)
    data = b"".join(parts)
    if _looks_like_pprof(data):
        raise InputError(path, "a pprof profile (profile.proto), not a jemalloc heap "
                               "dump: read it with go tool pprof")
    raise InputError(path, "binary data, not a jemalloc heap profile")


def _looks_like_pprof(data: bytes) -> bool:
    from heapscope.formats.pprof import decode_profile

    try:
        doc = decode_profile(data)
    except (ValueError, IndexError, KeyError, TypeError):
        return False
    return bool(doc.get("sample_type")) and bool(doc.get("string_table"))


def _read(path: str) -> tuple[str, int]:
    """A dump's text (see :func:`read_text`) and how many blank lines were left out of it."""
    data, dropped = _read_bytes(path)
    try:
        return data.decode("utf-8"), dropped
    except UnicodeDecodeError:
        # Paths in the memory map may be in any encoding; keep going rather than refuse.
        return data.decode("latin-1"), dropped


def read_text(path: str) -> str:
    """Read a dump's text, transparently decompressing gzip, with one-line errors.

    Memory is bounded by what the text holds, not by the file's size: it is read a piece at
    a time, runs of blank lines are kept as one, and more than :func:`max_input` bytes of
    text (or of decompressed data) is refused as soon as it is reached."""
    return _read(path)[0]


def _first_line(lines: list[str]) -> str:
    for line in lines:
        if line.strip() and not line.startswith("<jemalloc>"):
            return line
    return ""


def load(path: str, *, threads: bool = False, cache: ParseCache | None = None) -> Profile:
    """Load one heap dump (heap_v2 or legacy, plain or gzip) into a raw Profile.

    ``cache`` shares parsed stacks between the dumps of one process (a series).
    """
    text, dropped = _read(path)
    try:
        return _parse(path, text, threads=threads, cache=cache)
    except InputError as e:
        if dropped and e.problem.startswith("line "):
            # The parsers count the lines they were given; say how those differ.
            raise InputError(path, f"{e.problem} (counting each run of blank lines as one "
                                   "line)") from None
        raise


def _parse(path: str, text: str, *, threads: bool, cache: ParseCache | None) -> Profile:
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
        shown = shorten(first.strip(), 40)
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
