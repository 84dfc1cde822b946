"""On-disk cache of resolved frames, one JSON file per binary.

Files are keyed by build-id (or, for files without one, by real path, size and mtime) under
``<cache_dir>/symbols/<key[:2]>/<key[2:]>.json``. An entry holds the final raw frames for each
ELF address looked up so far and whether they came from DWARF; a run whose addresses are all
in the cache reads neither symbol tables nor DWARF and starts no llvm-symbolizer. Entries are
written atomically; unreadable or corrupt entries are ignored (and overwritten later).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from heapscope.files import open_private
from heapscope.symbols.elf import ElfInfo
from heapscope.symbols.llvm import RawFrame

FORMAT = 3

Chain = tuple[RawFrame, ...]


class CacheEntry:
    """Frames per ELF virtual address for one binary; ``dwarf`` says DWARF was available."""

    __slots__ = ("dwarf", "frames")

    def __init__(self, dwarf: bool, frames: dict[int, Chain] | None = None) -> None:
        self.dwarf = dwarf
        self.frames: dict[int, Chain] = {} if frames is None else frames

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheEntry):
            return NotImplemented
        return (self.dwarf, self.frames) == (other.dwarf, other.frames)


class SymbolCache:
    """The frame cache; every method is a no-op when ``root`` is None."""

    def __init__(self, root: str | None) -> None:
        self.root = root

    @property
    def enabled(self) -> bool:
        """True when a cache directory was configured."""
        return self.root is not None

    @staticmethod
    def key(elf: ElfInfo) -> str:
        """The cache key of a binary: its build-id, else a hash of path, size and mtime."""
        if elf.build_id:
            return elf.build_id.lower()
        import hashlib  # here: loading it costs 5 ms, and most modules have a build-id

        ident = f"{os.path.realpath(elf.path)}\0{elf.size}\0{elf.mtime_ns}"
        return "nobuildid-" + hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()

    def path(self, key: str) -> str | None:
        """Where the entry for ``key`` lives, or None when the cache is disabled."""
        if self.root is None:
            return None
        return os.path.join(self.root, "symbols", key[:2], key[2:] + ".json")

    def load(self, key: str) -> CacheEntry | None:
        """The stored entry for ``key``, or None when missing, unreadable or corrupt."""
        path = self.path(key)
        if path is None:
            return None
        try:
            import json  # here: heapscope.symbols.ahead imports this module first thing

            fh = open_private(path)
            if fh is None:
                return None
            with fh:
                data = json.loads(fh.read().decode("utf-8"))
            return _decode(data)
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None

    def store(self, key: str, entry: CacheEntry) -> None:
        """Write ``entry`` atomically; failures (read-only disk, full disk) are ignored."""
        path = self.path(key)
        if path is None:
            return
        import json
        import tempfile  # here: a warm run stores nothing

        data = _encode(entry)
        tmp = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(data, separators=(",", ":")))  # C encoder; dump() is not
            os.replace(tmp, path)
            tmp = None
        except OSError:
            pass  # the cache is an optimisation; never fail symbolization because of it
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _encode(entry: CacheEntry) -> dict[str, Any]:
    """The JSON document for an entry: a string table, distinct chains, and for each vaddr
    (in order) the index of its chain.

    Interning keeps the file small and the warm path fast: nearby addresses share lines, so
    there are far fewer distinct chains and strings than addresses. Plain lists of numbers
    (no hex strings as keys) are what json reads fastest.
    """
    strings: dict[str, int] = {}
    chains: dict[Chain, int] = {}
    flat_chains: list[list[int]] = []
    vaddrs: list[int] = []
    chain_of: list[int] = []
    for vaddr, chain in sorted(entry.frames.items()):
        index = chains.get(chain)
        if index is None:
            flat: list[int] = []
            for f in chain:
                flat += (strings.setdefault(f.function, len(strings)),)
                flat += (strings.setdefault(f.file, len(strings)), f.line)
            index = chains[chain] = len(flat_chains)
            flat_chains.append(flat)
        vaddrs.append(vaddr)
        chain_of.append(index)
    return {
        "format": FORMAT,
        "dwarf": entry.dwarf,
        "strings": list(strings),
        "chains": flat_chains,
        "vaddrs": vaddrs,
        "chain_of": chain_of,
    }


def _decode(data: Any) -> CacheEntry | None:
    """Validate and convert a loaded JSON document; None when it is not a current entry.

    Malformed documents raise TypeError/ValueError/IndexError/KeyError, which the caller
    treats like a missing entry.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    dwarf, strings, flats = data["dwarf"], data["strings"], data["chains"]
    vaddrs, chain_of = data["vaddrs"], data["chain_of"]
    if (type(dwarf) is not bool or not all(type(x) is str for x in strings)
            or not all(type(x) is int for flat in flats for x in flat)
            or any(len(flat) % 3 for flat in flats)
            or not all(type(x) is int and x >= 0 for x in vaddrs)
            # (a negative chain index would silently pick a chain from the end)
            or not all(type(x) is int and x >= 0 for x in chain_of)
            or len(vaddrs) != len(chain_of)):
        return None
    # tuple.__new__ skips the NamedTuple's Python-level __new__: a warm run builds one
    # RawFrame per cached line (7,900 for a 20 MB dump's program).
    new = tuple.__new__
    chains: list[Chain] = []
    for flat in flats:
        if len(flat) == 3:
            chains.append((new(RawFrame, (strings[flat[0]], strings[flat[1]], flat[2])),))
        else:
            chains.append(tuple(new(RawFrame, (strings[flat[i]], strings[flat[i + 1]],
                                                flat[i + 2]))
                                for i in range(0, len(flat), 3)))
    return CacheEntry(dwarf, dict(zip(vaddrs, map(chains.__getitem__, chain_of), strict=True)))
