"""pprof export: a gzip-compressed ``perftools.profiles.Profile`` (profile.proto).

The profile carries the four heap sample types in the order Go and pprof's legacy heap parser
use (``alloc_objects, alloc_space, inuse_objects, inuse_space``, so pprof's default selection
prefers ``inuse_space``; ``default_sample_type`` says so as well), ``period_type space/bytes``
and the dump's sampling period. Values are heapscope's unsampled estimates, summed per distinct
stack and rounded to integers.

Mappings are the executable regions of the dump's memory map (main binary first) with the
build-id read from the file. ``Location.address`` is the runtime address of the call
instruction (return address minus one, what the symbolizer looked up) inside a mapping whose
``memory_start``/``memory_limit``/``file_offset`` are the dump's, so a backend that applies
pprof's normalisation (``address - start + file_offset``, then the ELF segment rule) arrives at
the same ELF address heapscope symbolized. Symbolized locations carry their frames as
``Line`` entries, innermost (inlined) first; unsymbolized ones carry none, and their mapping
does not claim ``has_functions``, so a backend with better debug info may still name them.

IDs are dense (1..N, in order) for mappings, locations and functions, as Parca requires.

The encoder is a few lines of protobuf wire format (varints and length-delimited fields);
:func:`decode_profile` reads the same subset back (for tests and scripts).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from heapscope.model import (
    ALLOC_OBJECTS,
    ALLOC_SPACE,
    INUSE_OBJECTS,
    INUSE_SPACE,
    Frame,
    Location,
    Mapping,
    Profile,
)
from heapscope.symbols.elf import ElfError, ElfInfo

# pprof's order of the four heap sample types, as indices into HEAP_SAMPLE_TYPES.
PPROF_ORDER = (ALLOC_OBJECTS, ALLOC_SPACE, INUSE_OBJECTS, INUSE_SPACE)
SAMPLE_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
)
DEFAULT_SAMPLE_TYPE = "inuse_space"

_VARINT = 0
_LEN = 2


# ---------------------------------------------------------------------------------------------
# Wire format


def _varint_slow(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 negatives are ten-byte two's complement varints
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint_slow(i) for i in range(1 << 14)]


def varint(n: int) -> bytes:
    """The protobuf base-128 varint encoding of ``n`` (negative: as uint64)."""
    if 0 <= n < 16384:
        return _SMALL[n]
    return _varint_slow(n)


def _key(field_no: int, wire: int) -> bytes:
    return varint(field_no << 3 | wire)


class _Msg:
    """A message under construction: a list of encoded fields (zero scalars omitted)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def uint(self, field_no: int, value: int) -> _Msg:
        if value:
            self.parts.append(_key(field_no, _VARINT))
            self.parts.append(varint(value))
        return self

    def flag(self, field_no: int, value: bool) -> _Msg:
        return self.uint(field_no, 1 if value else 0)

    def data(self, field_no: int, payload: bytes) -> _Msg:
        self.parts.append(_key(field_no, _LEN))
        self.parts.append(varint(len(payload)))
        self.parts.append(payload)
        return self

    def packed(self, field_no: int, values: Iterable[int]) -> _Msg:
        payload = b"".join(map(varint, values))
        if payload:
            self.data(field_no, payload)
        return self

    def sub(self, field_no: int, msg: _Msg) -> _Msg:
        return self.data(field_no, msg.bytes())

    def bytes(self) -> bytes:
        return b"".join(self.parts)


# ---------------------------------------------------------------------------------------------
# Building the profile


BuildIdFn = Callable[[Mapping], str]


def _elf_build_id(paths: Callable[[str], list[str]]) -> BuildIdFn:
    memo: dict[str, str] = {}

    def build_id(m: Mapping) -> str:
        if m.build_id:
            return m.build_id
        if m.anonymous:
            return ""
        found = memo.get(m.path)
        if found is None:
            found = ""
            for candidate in paths(m.path):
                try:
                    found = ElfInfo.read(candidate).build_id
                except (ElfError, OSError):
                    continue
                if found:
                    break
            memo[m.path] = found
        return found

    return build_id


def file_build_ids(sysroot: str | None = None, binaries: Iterable[str] = ()) -> BuildIdFn:
    """Build-ids read from the mapped files, "" when unreadable: a ``binaries`` file of the
    same base name first, then the path under ``sysroot``, then the recorded path."""
    by_name: dict[str, list[str]] = {}
    for b in binaries:
        by_name.setdefault(os.path.basename(b), []).append(b)

    def paths(path: str) -> list[str]:
        out = list(by_name.get(os.path.basename(path), ()))
        if sysroot:
            out.append(os.path.join(sysroot, path.lstrip("/")))
        out.append(path)
        return out

    return _elf_build_id(paths)


@dataclass
class _MappingInfo:
    mapping: Mapping
    build_id: str
    locations: int = 0
    functions: bool = True
    filenames: bool = True
    line_numbers: bool = True


@dataclass
class PprofOptions:
    """What goes into the profile besides the samples."""

    thread_labels: bool = False  # split samples per thread (needs per-thread values)
    build_id: BuildIdFn = field(default_factory=file_build_ids)
    comments: tuple[str, ...] = ()
    default_sample_type: str = DEFAULT_SAMPLE_TYPE


class _Builder:
    def __init__(self, options: PprofOptions) -> None:
        self.options = options
        self.strings: dict[str, int] = {"": 0}
        self.mappings: dict[tuple[int, int, int, str, str], int] = {}
        self.mapping_info: list[_MappingInfo] = []
        self.functions: dict[tuple[str, str, str], int] = {}
        self.function_msgs: list[bytes] = []
        self.locations: dict[tuple[int, int, tuple[Frame, ...]], int] = {}
        self.location_msgs: list[bytes] = []
        self.location_varints: list[bytes] = [b""]  # by id: the packed encoding of the id
        # (location ids, thread uid or -1) -> summed values in PPROF_ORDER
        self.samples: dict[tuple[tuple[int, ...], int], list[float]] = {}
        self.thread_names: dict[int, str] = {}
        self.period = 0
        self.time: float | None = None

    def string(self, s: str) -> int:
        i = self.strings.get(s)
        if i is None:
            i = self.strings[s] = len(self.strings)
        return i

    def mapping_id(self, m: Mapping) -> int:
        build_id = self.options.build_id(m)
        key = (m.start, m.limit, m.offset, m.path, build_id)
        i = self.mappings.get(key)
        if i is None:
            self.mapping_info.append(_MappingInfo(m, build_id))
            i = self.mappings[key] = len(self.mapping_info)
        return i

    def function_id(self, name: str, system_name: str, filename: str) -> int:
        key = (name, system_name, filename)
        i = self.functions.get(key)
        if i is None:
            i = self.functions[key] = len(self.function_msgs) + 1
            msg = (
                _Msg()
                .uint(1, i)
                .uint(2, self.string(name))
                .uint(3, self.string(system_name or name))
                .uint(4, self.string(filename))
            )
            self.function_msgs.append(msg.bytes())
        return i

    def location_id(self, loc: Location, mapping_ids: dict[int, int]) -> int:
        # Return addresses point after the call; the call instruction (what was symbolized and
        # what pprof's own symbolizer expects) is one byte earlier.
        address = loc.address - 1 if loc.address > 0 else 0
        mid = mapping_ids.get(loc.mapping.start, 0) if loc.mapping is not None else 0
        if loc.mapping is not None and mid == 0 and not loc.mapping.anonymous:
            mid = mapping_ids[loc.mapping.start] = self.mapping_id(loc.mapping)
        key = (mid, address, loc.frames)
        i = self.locations.get(key)
        if i is not None:
            return i
        i = self.locations[key] = len(self.location_msgs) + 1
        msg = _Msg().uint(1, i).uint(2, mid).uint(3, address)
        for f in loc.frames:
            fid = self.function_id(f.function or loc.fallback_name, f.system_name, f.file)
            msg.sub(4, _Msg().uint(1, fid).uint(2, f.line))
        self.location_msgs.append(msg.bytes())
        self.location_varints.append(varint(i))
        if mid:
            info = self.mapping_info[mid - 1]
            info.locations += 1
            if not loc.frames:
                info.functions = info.filenames = info.line_numbers = False
            elif not all(f.file for f in loc.frames):
                info.filenames = info.line_numbers = False
            elif not all(f.line for f in loc.frames):
                info.line_numbers = False
        return i

    def add(self, profile: Profile) -> None:
        if not self.period:
            self.period = profile.period
        if profile.time is not None:
            # The sum of several dumps is as of the latest one.
            self.time = profile.time if self.time is None else max(self.time, profile.time)
        mapping_ids: dict[int, int] = {}
        main = next((m for m in profile.mappings if not m.anonymous), None)
        code = [m for m in profile.mappings if m.executable and not m.anonymous]
        code.sort(key=lambda m: (main is None or m.path != main.path, m.start))
        for m in code:
            mapping_ids[m.start] = self.mapping_id(m)
        loc_of: dict[int, int] = {
            a: self.location_id(profile.location(a), mapping_ids) for a in profile.addresses()
        }
        for t in profile.threads:
            if t.name:
                self.thread_names.setdefault(t.id, t.name)
        samples = self.samples
        split = self.options.thread_labels
        for s in profile.samples:
            ids = tuple(map(loc_of.__getitem__, s.stack))
            parts = [(t.thread, t.values) for t in s.threads] if split and s.threads else []
            if not parts:
                parts = [(-1, s.values)]
            for thread, values in parts:
                if not any(values):
                    continue
                acc = samples.get((ids, thread))
                if acc is None:
                    samples[(ids, thread)] = [values[k] for k in PPROF_ORDER]
                else:
                    for j, k in enumerate(PPROF_ORDER):
                        acc[j] += values[k]

    def encode(self) -> bytes:
        out = _Msg()
        for type_, unit in SAMPLE_TYPES:
            out.sub(1, _Msg().uint(1, self.string(type_)).uint(2, self.string(unit)))
        parts = out.parts
        sample_key = _key(2, _LEN)
        loc_key = _key(1, _LEN)
        value_key = _key(2, _LEN)
        loc_varints = self.location_varints
        thread_key = self.string("thread_id")
        name_key = self.string("thread")
        for (ids, thread), values in sorted(self.samples.items()):
            vals = b"".join([varint(round(v)) for v in values])
            if vals == b"\x00\x00\x00\x00":
                continue  # every estimate rounds to zero
            locs = b"".join(map(loc_varints.__getitem__, ids))
            body = [loc_key, varint(len(locs)), locs, value_key, varint(len(vals)), vals]
            if thread >= 0:
                label = _Msg().uint(1, thread_key).uint(3, thread)
                body.append(_Msg().sub(3, label).bytes())
                name = self.thread_names.get(thread)
                if name:
                    label = _Msg().uint(1, name_key).uint(2, self.string(name))
                    body.append(_Msg().sub(3, label).bytes())
            encoded = b"".join(body)
            parts.append(sample_key)
            parts.append(varint(len(encoded)))
            parts.append(encoded)
        for i, info in enumerate(self.mapping_info, 1):
            m = info.mapping
            has_functions = info.locations > 0 and info.functions
            msg = (
                _Msg()
                .uint(1, i)
                .uint(2, m.start)
                .uint(3, m.limit)
                .uint(4, m.offset)
                .uint(5, self.string(m.path))
                .uint(6, self.string(info.build_id))
                .flag(7, has_functions)
                .flag(8, has_functions and info.filenames)
                .flag(9, has_functions and info.filenames and info.line_numbers)
                # DWARF (file names) was read with inline chains for every location.
                .flag(10, has_functions and info.filenames)
            )
            out.sub(3, msg)
        for loc in self.location_msgs:
            out.data(4, loc)
        for fn in self.function_msgs:
            out.data(5, fn)
        # Strings last: every index above has been handed out by now.
        period_type = _Msg().uint(1, self.string("space")).uint(2, self.string("bytes"))
        comments = [self.string(c) for c in self.options.comments]
        default = self.string(self.options.default_sample_type)
        for s in self.strings:  # dicts keep insertion order == index order
            out.data(6, s.encode("utf-8", "surrogateescape"))
        if self.time is not None:
            out.uint(9, int(self.time * 1e9))
        out.sub(11, period_type)
        out.uint(12, self.period)
        out.packed(13, comments)
        out.uint(14, default)
        return out.bytes()


def encode_profile(profiles: Iterable[Profile], options: PprofOptions | None = None) -> bytes:
    """The uncompressed profile.proto bytes for the sum of ``profiles``."""
    b = _Builder(options or PprofOptions())
    for p in profiles:
        b.add(p)
    return b.encode()


def render_pprof(profiles: Iterable[Profile], options: PprofOptions | None = None) -> bytes:
    """The gzip-compressed profile.proto for the sum of ``profiles``."""
    return gzip.compress(encode_profile(profiles, options), compresslevel=6, mtime=0)
