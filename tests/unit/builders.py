"""Small builders for symbolized profiles, so unit tests need no binaries."""

from __future__ import annotations

from types import MappingProxyType

from heapscope.model import Frame, Location, Mapping, Profile, Sample

EXE = Mapping(0x555555554000, 0x555555600000, 0, "/srv/app", "r-xp")
JEMALLOC = Mapping(0x7F0000000000, 0x7F0000100000, 0, "/usr/lib/libjemalloc.so.2", "r-xp")
LIBC = Mapping(0x7F1000000000, 0x7F1000100000, 0, "/usr/lib/libc.so.6", "r-xp")
PG = Mapping(0x560000000000, 0x560000100000, 0, "/usr/lib/postgresql/15/bin/postgres", "r-xp")
LIBXML = Mapping(0x7F2000000000, 0x7F2000100000, 0,
                 "/usr/lib/x86_64-linux-gnu/libxml2.so.2.9.14", "r-xp")


class Builder:
    """Assigns each function name an address in a module and builds samples from names."""

    def __init__(self) -> None:
        self.locations: dict[int, Location] = {}
        self.by_name: dict[tuple[str, str], int] = {}
        self.next = {m.path: m.start + 0x1000 for m in (EXE, JEMALLOC, LIBC, PG, LIBXML)}

    def loc(self, spec: str) -> int:
        """Address for ``spec``: 'name', 'name@file:line', 'je:name', 'libc:name', 'pg:name',
        'xml:name' (libxml2, a dependency), '?exe' (no symbol)."""
        mapping = EXE
        if spec.startswith("je:"):
            mapping, spec = JEMALLOC, spec[3:]
        elif spec.startswith("libc:"):
            mapping, spec = LIBC, spec[5:]
        elif spec.startswith("pg:"):
            mapping, spec = PG, spec[3:]
        elif spec.startswith("xml:"):
            mapping, spec = LIBXML, spec[4:]
        key = (mapping.path, spec)
        if key in self.by_name:
            return self.by_name[key]
        addr = self.next[mapping.path]
        self.next[mapping.path] += 0x40
        frames: tuple[Frame, ...] = ()
        if not spec.startswith("?"):
            chain = []
            parts = spec.split(";")  # innermost (inlined) first, containing function last
            for k, part in enumerate(parts):
                name, _, where = part.partition("@")
                file, _, line = where.partition(":")
                chain.append(Frame(name, file, int(line or 0), inlined=k < len(parts) - 1))
            frames = tuple(chain)
        self.locations[addr] = Location(addr, mapping, mapping.name, addr - mapping.start, frames)
        self.by_name[key] = addr
        return addr

    def sample(self, *specs: str, values: tuple[float, ...] = (1, 100, 1, 100)) -> Sample:
        """A sample whose stack is the given specs, leaf first."""
        return Sample(tuple(self.loc(s) for s in specs), values)

    def profile(self, *samples: Sample, **kw: object) -> Profile:
        """A symbolized, already-unsampled profile holding ``samples``."""
        p = Profile(samples=tuple(samples), mappings=(EXE, JEMALLOC, LIBC, PG, LIBXML), period=1,
                    sampling="none", unsampled=True, source="built.heap")
        return p.with_(locations=MappingProxyType(dict(self.locations)), **kw)
