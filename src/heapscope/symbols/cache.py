"""On-disk cache of resolved frames, one JSON file per binary.

Files are keyed by build-id (or, for files without one, by real path, size and mtime) under
``<cache_dir>/symbols/<key[:2]>/<key[2:]>.json``. An entry holds the final raw frames for each
ELF address looked up so far and whether they came from DWARF; a run whose addresses are all
in the cache reads neither symbol tables nor DWARF and starts no llvm-symbolizer. Entries are
written atomically; unreadable or corrupt entries are ignored (and overwritten later).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from heapscope.symbols.elf import ElfInfo
from heapscope.symbols.llvm import RawFrame

FORMAT = 2

Chain = tuple[RawFrame, ...]


@dataclass
class CacheEntry:
    """Frames per ELF virtual address for one binary; ``dwarf`` says DWARF was available."""

    dwarf: bool
    frames: dict[int, Chain] = field(default_factory=dict)


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
            with open(path, encoding="utf-8") as fh:
                data = json.loads(fh.read())
            return _decode(data)
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None

    def store(self, key: str, entry: CacheEntry) -> None:
        """Write ``entry`` atomically; failures (read-only disk, full disk) are ignored."""
        path = self.path(key)
        if path is None:
            return
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
    """The JSON document for an entry: a string table, distinct chains, address -> chain.

    Interning keeps the file small and the warm path fast: nearby addresses share lines, so
    there are far fewer distinct chains and strings than addresses.
    """
    strings: dict[str, int] = {}
    chains: dict[Chain, int] = {}
    flat_chains: list[list[int]] = []
    addrs: dict[str, int] = {}
    for vaddr, chain in sorted(entry.frames.items()):
        index = chains.get(chain)
        if index is None:
            flat: list[int] = []
            for f in chain:
                flat += (strings.setdefault(f.function, len(strings)),)
                flat += (strings.setdefault(f.file, len(strings)), f.line)
            index = chains[chain] = len(flat_chains)
            flat_chains.append(flat)
        addrs[f"{vaddr:x}"] = index
    return {
        "format": FORMAT,
        "dwarf": entry.dwarf,
        "strings": list(strings),
        "chains": flat_chains,
        "addrs": addrs,
    }


def _decode(data: Any) -> CacheEntry | None:
    """Validate and convert a loaded JSON document; None when it is not a current entry.

    Malformed documents raise TypeError/ValueError/IndexError/KeyError, which the caller
    treats like a missing entry.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    dwarf = data["dwarf"]
    strings = data["strings"]
    if type(dwarf) is not bool or not all(type(x) is str for x in strings):
        return None
    chains: list[Chain] = []
    for flat in data["chains"]:
        if len(flat) % 3:
            return None
        it = iter(flat)
        chain = []
        for name, file, line in zip(it, it, it, strict=True):
            if type(line) is not int:
                return None
            chain.append(RawFrame(strings[name], strings[file], line))
        chains.append(tuple(chain))
    frames = {int(k, 16): chains[v] for k, v in data["addrs"].items()}
    return CacheEntry(dwarf, frames)
