"""The raw profile model every pass reads and every view is derived from.

The shape follows pprof's profile.proto: samples refer to locations by their raw address, a
location belongs to at most one mapping and, once symbolized, carries frames (innermost first,
so inlined callees come before the function that contains them). Values are kept exactly as
parsed; unsampling is a separate pass that returns a new Profile.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from collections.abc import Mapping as MappingT
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple, NoReturn

INUSE_OBJECTS = 0
INUSE_SPACE = 1
ALLOC_OBJECTS = 2
ALLOC_SPACE = 3


# NamedTuples and a hand-written Profile, not dataclasses: `heapscope top` must not import
# dataclasses (start-up time).
class ValueType(NamedTuple):
    """A kind of sample value, e.g. ``inuse_space`` measured in ``bytes``."""

    type: str
    unit: str


HEAP_SAMPLE_TYPES: tuple[ValueType, ...] = (
    ValueType("inuse_objects", "count"),
    ValueType("inuse_space", "bytes"),
    ValueType("alloc_objects", "count"),
    ValueType("alloc_space", "bytes"),
)


class Mapping(NamedTuple):
    """One line of the process's memory map: a file (or anonymous) region at an address."""

    start: int
    limit: int
    offset: int
    path: str
    perms: str = "r-xp"
    build_id: str = ""
    deleted: bool = False

    @property
    def executable(self) -> bool:
        """True when the region is mapped executable."""
        return len(self.perms) > 2 and self.perms[2] == "x"

    @property
    def anonymous(self) -> bool:
        """True for regions with no backing file (JIT code, heap, stacks)."""
        return not self.path or self.path.startswith("[")

    @property
    def name(self) -> str:
        """The module's short name: the file's base name, or the bracketed pseudo-path."""
        if not self.path:
            return "[anon]"
        return self.path if self.path.startswith("[") else os.path.basename(self.path)

    def contains(self, address: int) -> bool:
        """True when ``address`` lies in ``[start, limit)``."""
        return self.start <= address < self.limit


class Frame(NamedTuple):
    """One function activation at a location; several when calls were inlined.

    ``function`` is the display name (demangled, parameters removed); ``full_name`` keeps the
    whole demangled signature and ``system_name`` the raw (mangled) symbol, when known. An
    empty ``function`` means the address is not inside any known symbol. A NamedTuple, as
    are :class:`Location` and :class:`Sample`: a dump has tens of thousands of them and a
    tuple is built twice as fast as a frozen dataclass.
    """

    function: str
    file: str = ""
    line: int = 0
    inlined: bool = False
    full_name: str = ""
    system_name: str = ""


class Location(NamedTuple):
    """A code address, the mapping it falls in, and its frames once symbolized.

    ``module`` is the mapping's short name (or ``[jit]``/``[unknown]``), ``offset`` the address
    relative to the module's load base (what ``module+0xoffset`` prints). ``frames`` is empty
    until symbolization; innermost first, the last one is the real (non-inlined) function.
    """

    address: int
    mapping: Mapping | None = None
    module: str = ""
    offset: int = 0
    frames: tuple[Frame, ...] = ()

    @property
    def fallback_name(self) -> str:
        """The name printed when no symbol covers the address: ``module+0xoffset``."""
        if self.module:
            return f"{self.module}+{self.offset:#x}"
        return f"{self.address:#x}"


class ThreadValues(NamedTuple):
    """A stack's values for one thread (jemalloc's per-thread ``tN:`` lines)."""

    thread: int
    values: tuple[float, ...]


class ViaFrame(NamedTuple):
    """A frame folded into an allocation's site: library, dependency or wrapper code the
    program's own code called to allocate (see :mod:`heapscope.analysis.fold`)."""

    function: str  # or module+0xoffset when no symbol covers it
    file: str
    line: int
    module: str
    kind: str  # "library", "dependency", "wrapper" (an allocation wrapper) or "own"

    @property
    def text(self) -> str:
        """``function file:line``, or the function alone when the line is unknown."""
        return f"{self.function} {self.file}:{self.line}" if self.file else self.function


class Sample(NamedTuple):
    """One allocation stack and its values.

    ``stack`` holds raw addresses, leaf first, as written in the dump (keys into
    ``Profile.locations``). ``values`` are aligned with ``Profile.sample_types``; ``threads``
    splits them per thread where the dump says so. ``via`` lists the frames folded into the
    stack's first frame (its site), innermost first, when stacks were folded. A NamedTuple
    rather than a dataclass: dumps hold hundreds of thousands of samples and tuples are
    several times cheaper to build.
    """

    stack: tuple[int, ...]
    values: tuple[float, ...]
    threads: tuple[ThreadValues, ...] = ()
    via: tuple[ViaFrame, ...] = ()


class Thread(NamedTuple):
    """A thread named in the dump header: jemalloc's thread uid and optional name."""

    id: int
    name: str = ""
    values: tuple[float, ...] = ()


_NO_LOCATIONS: MappingT[int, Location] = MappingProxyType({})
# The arguments of Profile(), which with_() copies.
_PROFILE_FIELDS = ("samples", "mappings", "sample_types", "period", "sampling", "unsampled",
                   "header", "threads", "locations", "pid", "seq", "kind", "source", "time",
                   "format")


class Profile:
    """A heap profile: samples, the memory map, and where it came from.

    ``sampling`` names how values must be unsampled: ``"v2"`` (jemalloc/tcmalloc heap_v2,
    Poisson sampling every ``period`` bytes on average), ``"v1"`` (legacy ``heap/P``) or
    ``"none"`` (every allocation recorded). ``unsampled`` is True once the unsample pass ran.
    Immutable: assigning to an attribute raises AttributeError.
    """

    samples: tuple[Sample, ...]
    mappings: tuple[Mapping, ...]
    sample_types: tuple[ValueType, ...]
    period: int
    sampling: str
    unsampled: bool
    header: tuple[float, ...]
    threads: tuple[Thread, ...]
    locations: MappingT[int, Location]
    pid: int | None
    seq: int | None
    kind: str
    source: str
    time: float | None
    format: str

    def __init__(
        self,
        samples: tuple[Sample, ...],
        mappings: tuple[Mapping, ...] = (),
        sample_types: tuple[ValueType, ...] = HEAP_SAMPLE_TYPES,
        period: int = 0,
        sampling: str = "v2",
        unsampled: bool = False,
        header: tuple[float, ...] = (),
        threads: tuple[Thread, ...] = (),
        locations: MappingT[int, Location] = _NO_LOCATIONS,
        pid: int | None = None,
        seq: int | None = None,
        kind: str = "",
        source: str = "",
        time: float | None = None,
        format: str = "heap_v2",
    ) -> None:
        # Written into __dict__: attribute assignment is refused (see __setattr__).
        self.__dict__.update(
            samples=samples, mappings=mappings, sample_types=sample_types, period=period,
            sampling=sampling, unsampled=unsampled, header=header, threads=threads,
            locations=locations, pid=pid, seq=seq, kind=kind, source=source, time=time,
            format=format,
        )

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        # Field by field, as the dataclass did (tests compare symbolize() results).
        if other.__class__ is not self.__class__:
            return NotImplemented
        mine, theirs = self.__dict__, other.__dict__
        return tuple(mine[f] for f in _PROFILE_FIELDS) == tuple(theirs[f] for f in _PROFILE_FIELDS)

    def with_(self, *, same_stacks: bool = False, **changes: object) -> Profile:
        """Return a copy with some fields replaced (the model is never mutated).

        ``same_stacks`` says the new samples have the very same stacks (only values
        changed), so derived address sets carry over instead of being recomputed.
        """
        fields = self.__dict__
        args = {f: fields[f] for f in _PROFILE_FIELDS}
        args.update(changes)
        new = Profile(**args)
        if (same_stacks or "samples" not in changes) and "_address_sets" in fields:
            new.__dict__["_address_sets"] = fields["_address_sets"]
        return new

    def addresses(self) -> frozenset[int]:
        """Every distinct address that appears in any stack."""
        return self._address_sets[0]

    def caller_addresses(self) -> frozenset[int]:
        """Addresses that appear at least once in a non-leaf position (return addresses)."""
        return self._address_sets[1]

    @cached_property
    def _address_sets(self) -> tuple[frozenset[int], frozenset[int]]:
        # Several passes ask for these; computing them once matters on 300k-stack dumps.
        from heapscope.native import core

        if core is not None:
            return core.address_sets(self.samples)
        leaves = {s.stack[0] for s in self.samples if s.stack}
        callers: set[int] = set()
        for s in self.samples:
            callers.update(s.stack[1:])
        return frozenset(leaves | callers), frozenset(callers)

    def location(self, address: int) -> Location:
        """The location for ``address``; a bare one when it was never symbolized."""
        loc = self.locations.get(address)
        return loc if loc is not None else Location(address)

    def stack_locations(self, sample: Sample) -> Iterator[Location]:
        """The sample's locations, leaf first."""
        for a in sample.stack:
            yield self.location(a)

    def thread_name(self, thread: int) -> str:
        """The name given to a thread uid in the header, or '' if none."""
        for t in self.threads:
            if t.id == thread:
                return t.name
        return ""

    def total(self, index: int) -> float:
        """Sum of one value over all samples."""
        return sum(s.values[index] for s in self.samples)


ADDRESS_LIMIT = 1 << 64  # addresses, and a memory map's numbers, are 64-bit


def wide_address(profile: Profile) -> int | None:
    """The first stack address or memory-map number of ``profile`` that is negative or does
    not fit in 64 bits, or None. Readers keep such damage (the rest of the dump may still be
    shown); a file written for other programs must not hold it (pprof's fields cannot, and
    a number of thousands of digits is past what JSON writers and readers take)."""
    for a in profile.addresses():
        if not 0 <= a < ADDRESS_LIMIT:
            return a
    for m in profile.mappings:
        for n in (m.start, m.limit, m.offset):
            if not 0 <= n < ADDRESS_LIMIT:
                return n
    for a in profile.locations:
        if not 0 <= a < ADDRESS_LIMIT:
            return a
    return None
