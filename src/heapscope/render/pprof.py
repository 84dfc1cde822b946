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
Strings are UTF-8, as profile.proto's ``string`` says: an undecodable byte of a name or path
is written as the text ``\\xNN`` (:func:`heapscope.safetext.valid`); every other character is
kept as it is.

The message is built with the classes generated from ``formats/proto/profile.proto``;
:func:`heapscope.formats.pprof.decode_profile` reads it back (for tests and scripts).
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from heapscope.errors import InputError
from heapscope.formats.proto import profile_pb2
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
from heapscope.safetext import valid
from heapscope.symbols.elf import ElfError, ElfInfo
from heapscope.units import short_number

# pprof's order of the four heap sample types, as indices into HEAP_SAMPLE_TYPES.
PPROF_ORDER = (ALLOC_OBJECTS, ALLOC_SPACE, INUSE_OBJECTS, INUSE_SPACE)
SAMPLE_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
)
DEFAULT_SAMPLE_TYPE = "inuse_space"

# ---------------------------------------------------------------------------------------------
# Building the profile


BuildIdFn = Callable[[Mapping], str]


UINT64 = (1 << 64) - 1  # pprof's Location.address, Mapping.memory_start/limit/file_offset
INT64 = (1 << 63) - 1  # pprof's Sample.value, Label.num, Line.line, period and time_nanos


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
        self.prof = profile_pb2.Profile()
        self.strings: dict[str, int] = {"": 0}
        self.mappings: dict[tuple[int, int, int, str, str], int] = {}
        self.mapping_info: list[_MappingInfo] = []
        self.functions: dict[tuple[str, str, str], int] = {}
        self.locations: dict[tuple[int, int, tuple[Frame, ...]], int] = {}
        # (location ids, thread uid or -1) -> summed values in PPROF_ORDER
        self.samples: dict[tuple[tuple[int, ...], int], list[float]] = {}
        self.thread_names: dict[int, str] = {}
        self.sources: list[str] = []  # the dumps added, to name in an error
        self.period = 0
        self.time: float | None = None

    def string(self, s: str) -> int:
        # profile.proto's strings are UTF-8 (Go's protobuf and the backends built on it
        # refuse anything else): an undecodable byte of a name is written as "\xNN".
        s = valid(s)
        i = self.strings.get(s)
        if i is None:
            i = self.strings[s] = len(self.strings)
        return i

    def where(self) -> str:
        """The dumps added so far, as an error names them."""
        if len(self.sources) <= 1:
            return self.sources[0] if self.sources else "the profile"
        return f"{self.sources[0]} (and {len(self.sources) - 1} more)"

    def fits(self, what: str, value: float, signed: bool = True) -> None:
        """A one-line error naming the dump when ``value`` does not fit pprof's field."""
        low, high = (-INT64 - 1, INT64) if signed else (0, UINT64)
        if not low <= value <= high:
            bits = "64-bit signed" if signed else "64-bit unsigned"
            raise InputError(self.where(), f"{what} {short_number(value)} does not fit in "
                                           f"pprof's {bits} field (a damaged dump?)")

    def mapping_id(self, m: Mapping) -> int:
        for what, value in (("mapping start", m.start), ("mapping limit", m.limit),
                            ("mapping offset", m.offset)):
            self.fits(what, value, signed=False)
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
            i = self.functions[key] = len(self.functions) + 1
            self.prof.function.add(id=i, name=self.string(name),
                                   system_name=self.string(system_name or name),
                                   filename=self.string(filename))
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
        i = self.locations[key] = len(self.locations) + 1
        msg = self.prof.location.add(id=i, mapping_id=mid, address=address)
        for f in loc.frames:
            self.fits("line number", f.line)
            fid = self.function_id(f.function or loc.fallback_name, f.system_name, f.file)
            msg.line.add(function_id=fid, line=f.line)
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
        source = profile.source or "the profile"
        self.sources.append(source)
        # pprof's addresses are 64-bit: a wider one is damage, said in one line.
        wide = next((a for a in profile.addresses() if a - 1 > UINT64 or a < 0), None)
        if wide is not None:
            raise InputError(source, f"address {short_number(wide, hexadecimal=True)} does "
                                     "not fit in pprof's 64 bits (a damaged dump?)")
        self.fits("sampling period", profile.period)
        if profile.time is not None:
            self.fits("time (ns)", profile.time * 1e9)
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
                if thread != -1:
                    self.fits("thread id", thread)
                acc = samples.get((ids, thread))
                if acc is None:
                    samples[(ids, thread)] = [values[k] for k in PPROF_ORDER]
                else:
                    for j, k in enumerate(PPROF_ORDER):
                        acc[j] += values[k]

    def encode(self) -> bytes:
        prof = self.prof
        for type_, unit in SAMPLE_TYPES:
            prof.sample_type.add(type=self.string(type_), unit=self.string(unit))
        thread_key = self.string("thread_id")
        name_key = self.string("thread")
        for (ids, thread), values in sorted(self.samples.items()):
            if not all(abs(v) < INT64 for v in values):  # (not for nan either)
                big = max(values, key=lambda v: abs(v) if v == v else math.inf)
                raise InputError(self.where(),
                                 f"a value of {short_number(big)} does not fit in pprof's "
                                 "64-bit signed values (a damaged dump, or counts summed past "
                                 "2^63)")
            vals = [round(v) for v in values]
            if not any(vals):
                continue  # every estimate rounds to zero
            sample = prof.sample.add(location_id=ids, value=vals)
            if thread >= 0:
                sample.label.add(key=thread_key, num=thread)
                name = self.thread_names.get(thread)
                if name:
                    sample.label.add(key=name_key, str=self.string(name))
        for i, info in enumerate(self.mapping_info, 1):
            m = info.mapping
            has_functions = info.locations > 0 and info.functions
            prof.mapping.add(
                id=i, memory_start=m.start, memory_limit=m.limit, file_offset=m.offset,
                filename=self.string(m.path), build_id=self.string(info.build_id),
                has_functions=has_functions,
                has_filenames=has_functions and info.filenames,
                has_line_numbers=has_functions and info.filenames and info.line_numbers,
                # DWARF (file names) was read with inline chains for every location.
                has_inline_frames=has_functions and info.filenames)
        # Strings last: every index above has been handed out by now.
        prof.period_type.type = self.string("space")
        prof.period_type.unit = self.string("bytes")
        prof.comment.extend(self.string(c) for c in self.options.comments)
        prof.default_sample_type = self.string(self.options.default_sample_type)
        prof.string_table.extend(s.encode("utf-8") for s in self.strings)
        if self.time is not None:
            prof.time_nanos = int(self.time * 1e9)
        prof.period = self.period
        return prof.SerializeToString()


def encode_profile(profiles: Iterable[Profile], options: PprofOptions | None = None) -> bytes:
    """The uncompressed profile.proto bytes for the sum of ``profiles``."""
    b = _Builder(options or PprofOptions())
    for p in profiles:
        b.add(p)
    return b.encode()


def render_pprof(profiles: Iterable[Profile], options: PprofOptions | None = None) -> bytes:
    """The gzip-compressed profile.proto for the sum of ``profiles``."""
    return gzip.compress(encode_profile(profiles, options), compresslevel=6, mtime=0)
