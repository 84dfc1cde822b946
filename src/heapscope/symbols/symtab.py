"""Function symbols of one ELF file, looked up strictly by ``start <= vaddr < start + size``.

This is the fallback (and the check) for names when DWARF has nothing to say. Unlike jeprof's
``nm``-based lookup it never names an address after the nearest symbol: an address in a
``static`` function of a stripped library, or in padding, gets no name at all.
"""

from __future__ import annotations

import itertools
import struct
from bisect import bisect_right
from collections.abc import Iterable

from heapscope.native import core
from heapscope.symbols.elfread import SHT_DYNSYM, SHT_NOBITS, SHT_SYMTAB, ElfError, ElfHeaders

STT_FUNC = 2
STT_GNU_IFUNC = 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHN_UNDEF = 0
# st_info values of functions (STT_FUNC or STT_GNU_IFUNC, any binding), for one set lookup.
_FUNCTION_INFOS = frozenset(bind << 4 | kind for bind in range(16)
                            for kind in (STT_FUNC, STT_GNU_IFUNC))
# Among aliases of one function (same start and size) prefer the exported name.
_BIND_RANK = {STB_GLOBAL: 0, STB_WEAK: 1, STB_LOCAL: 2}


class SymbolTable:
    """Sized function symbols sorted by start address, with interval lookup.

    Names are decoded only for the symbols a lookup finds: a table read from a file keeps the
    string-table offsets, because a module usually needs a few dozen of its thousands of
    names (decoding and ranking all of libstdc++'s took longer than reading the table).
    """

    def __init__(self, symbols: list[tuple[int, int, str, int]]) -> None:
        """Build from ``(start, size, name, binding)`` tuples (any order, sizes > 0)."""
        rows = [(start, start + size, bind, name)
                for start, size, name, bind in symbols if size > 0 and name]
        self._build(rows, b"")

    @classmethod
    def _from_offsets(cls, rows: list[tuple[int, int, int, int]], strings: bytes
                      ) -> SymbolTable:
        """A table from ``(start, end, binding, name offset)`` rows of a string table."""
        table = cls.__new__(cls)
        table._build(rows, strings)
        return table

    def _build(self, rows: list[tuple[int, int, int, str]] | list[tuple[int, int, int, int]],
               strings: bytes) -> None:
        rows.sort()  # by start, then end (binding and name only make the order total)
        starts, ends, binds, names = tuple(zip(*rows, strict=True)) or ((), (), (), ())
        # _reach[i] = the furthest end among symbols 0..i; lets lookups find a long symbol that
        # encloses a shorter one that starts later (rare, but it happens with aliases/asm).
        self._set(list(starts), list(ends), list(binds), list[str | int](names),
                  list(itertools.accumulate(ends, max)), strings)

    def _set(self, starts: list[int], ends: list[int], binds: list[int],
             names: list[str | int], reach: list[int], strings: bytes) -> None:
        """Take the sorted columns (see _build) as they are."""
        self._starts = starts
        self._ends = ends
        self._binds = binds
        # A str is a decoded name; an int an offset into ``strings``, decoded on first use.
        self._names = names
        self._strings = strings
        self._reach = reach

    def __len__(self) -> int:
        return len(self._starts)

    def _name(self, i: int) -> str:
        name = self._names[i]
        if isinstance(name, int):
            name = self._names[i] = _cstring(self._strings, name)
        return name

    def _rank(self, i: int) -> tuple[int, int, str]:
        """Among aliases of one function (same start and size) prefer the exported name,
        then the one with fewer leading underscores, then the first in byte order."""
        name = self._name(i)
        return (_BIND_RANK.get(self._binds[i], 3), _underscores(name), name)

    def _containing(self, vaddr: int) -> list[int]:
        out = []
        i = bisect_right(self._starts, vaddr) - 1
        while i >= 0 and self._reach[i] > vaddr:
            if self._ends[i] > vaddr:
                out.append(i)
            i -= 1
        return out

    def lookup(self, vaddr: int) -> str | None:
        """The name of the function symbol containing ``vaddr``, or None.

        When several contain it, the smallest (innermost) wins, then the exported alias.
        """
        found = self._containing(vaddr)
        if not found:
            return None
        if len(found) == 1:
            return self._name(found[0])
        starts, ends = self._starts, self._ends
        return self._name(min(found, key=lambda i: (ends[i] - starts[i], self._rank(i))))

    def functions(self) -> list[tuple[int, int, str]]:
        """Every function as ``(start, end, name)``, in address order."""
        return [(self._starts[i], self._ends[i], self._name(i)) for i in range(len(self))]

    def covers(self, vaddr: int, name: str) -> bool:
        """True when a function symbol called ``name`` contains ``vaddr``."""
        return any(self._name(i) == name for i in self._containing(vaddr))

    @classmethod
    def read(cls, path: str) -> SymbolTable:
        """Read ``.symtab`` (else ``.dynsym``) of ``path``; raise ElfError if unreadable."""
        try:
            with ElfHeaders.open(path) as elf:
                raw = _symbol_section(elf)
                columns = None
                if core is not None and raw is not None:
                    # Filtered and sorted in C: python3.11d's 31,000 entries in 6 ms, not 41.
                    columns = core.function_columns(*raw, elf.elf64, elf.little)
                if columns is None:
                    rows, strings = _function_rows(elf, raw, named=True)
        except ElfError:
            raise
        except Exception as exc:
            # Whatever else a corrupt table provokes (struct.error, MemoryError, …).
            raise ElfError(f"{path}: corrupt symbol table ({type(exc).__name__})") from exc
        if columns is not None and raw is not None:
            table = cls.__new__(cls)
            table._set(*columns, raw[1])
            return table
        return cls._from_offsets(rows, strings)


def defined_functions(path: str) -> set[str]:
    """Names of the functions ``path`` defines (``.symtab``, else ``.dynsym``)."""
    try:
        with ElfHeaders.open(path) as elf:
            rows, strings = _function_rows(elf, _symbol_section(elf), named=False)
    except ElfError:
        raise
    except Exception as exc:
        raise ElfError(f"{path}: unreadable ELF ({type(exc).__name__})") from exc
    return {_cstring(strings, off) for _start, _end, _bind, off in rows}


def _underscores(name: str) -> int:
    return len(name) - len(name.lstrip("_"))


def _cstring(strings: bytes, offset: int) -> str:
    """The NUL-terminated string at ``offset`` of a string table ("" past its end)."""
    stop = strings.find(b"\0", offset)
    return strings[offset : stop if stop >= 0 else len(strings)].decode(
        "utf-8", "surrogateescape")


def _symbol_section(elf: ElfHeaders) -> tuple[bytes, bytes] | None:
    """The raw entries of the best symbol table (the first non-empty SHT_SYMTAB, else
    SHT_DYNSYM) and its string table, or None when there is none."""
    table = None
    for kind in (SHT_SYMTAB, SHT_DYNSYM):
        table = next((s for s in elf.sections if s.sh_type == kind and s.sh_size > 0), None)
        if table is not None:
            break
    strtab = elf.section(table.sh_link) if table is not None else None
    if elf.sections_truncated and (table is None or strtab is None):
        # The table or its strings may be in the part of the section headers that is cut off.
        raise ElfError(f"{elf.path}: corrupt ELF file (truncated section header table)")
    if table is None or strtab is None or strtab.sh_type == SHT_NOBITS:
        return None
    return elf.data(table), elf.data(strtab)


def _function_rows(elf: ElfHeaders, raw: tuple[bytes, bytes] | None, *, named: bool
                   ) -> tuple[list[tuple[int, int, int, int]], bytes]:
    """``(start, end, binding, name offset)`` of the defined, sized function symbols of
    ``raw`` (see _symbol_section), and its strings. ``named`` leaves out the symbols without
    a name."""
    if raw is None:
        return [], b""
    data, strings = raw
    # One struct.iter_unpack pass over the raw entries and one comprehension to filter them
    # (pyelftools' Symbol objects cost ~23 µs each: 230 ms for libc's 10,000 symbols).
    if elf.elf64:
        entries: Iterable[tuple[int, int, int, int, int]] = (
            (name_off, info, shndx, value, size)
            for name_off, info, _other, shndx, value, size
            in struct.iter_unpack(elf.endian + "IBBHQQ", data[: len(data) - len(data) % 24]))
    else:
        entries = (
            (name_off, info, shndx, value, size)
            for name_off, value, size, info, _other, shndx
            in struct.iter_unpack(elf.endian + "IIIBBH", data[: len(data) - len(data) % 16]))
    # An unnamed symbol's name offset points at a NUL (or past the table).
    unnamed = (b"", b"\0") if named else ()
    return [
        (value, value + size, info >> 4, name_off)
        for name_off, info, shndx, value, size in entries
        if size and shndx != SHN_UNDEF and info in _FUNCTION_INFOS
        and strings[name_off : name_off + 1] not in unnamed
    ], strings
