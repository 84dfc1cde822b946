"""A small ELF reader: the ELF header, the program and section headers, section contents.

Everything is decoded with :mod:`struct` from a handful of reads (the ELF header, the
program header table, the section header table, the section-name string table), so reading
the headers of a 24 MB executable with 40 sections costs about 0.1 ms. pyelftools built
a parsed object per section and per field (about 25 ms per file, plus 60 ms to import it),
which made ELF facts and symbol tables a large share of a cold symbolization.

Only what :mod:`heapscope.symbols` needs is decoded. The reader is strict about the tables
it reads (a truncated header table raises :class:`ElfError`) but never looks at sections it
is not asked for.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import BinaryIO, NamedTuple

from heapscope.files import open_regular

PT_LOAD = 1
PT_NOTE = 4
SHT_NULL = 0
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_DYNAMIC = 6
SHT_NOTE = 7
SHT_NOBITS = 8
SHT_DYNSYM = 11
SHF_COMPRESSED = 0x800
ELFCOMPRESS_ZLIB = 1
SHN_XINDEX = 0xFFFF
PN_XNUM = 0xFFFF

# The names pyelftools gave e_type values (ElfInfo.e_type keeps them as strings).
_E_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}


class ElfError(ValueError):
    """The file is not a readable ELF file."""


# NamedTuples, not dataclasses: `heapscope top` must not import dataclasses (start-up time).
class ProgramHeader(NamedTuple):
    """One entry of the program header table."""

    p_type: int
    p_flags: int
    p_offset: int
    p_vaddr: int
    p_filesz: int
    p_memsz: int
    p_align: int


class SectionHeader(NamedTuple):
    """One entry of the section header table, with its name resolved."""

    name: str
    sh_type: int
    sh_flags: int
    sh_offset: int
    sh_size: int
    sh_link: int
    sh_addr: int = 0  # its address in memory (0: not loaded)

    @property
    def has_data(self) -> bool:
        """True when the section occupies bytes in the file (not NOBITS, not empty)."""
        return self.sh_type != SHT_NOBITS and self.sh_size > 0


class ElfHeaders:
    """The headers of one ELF file, and its open file to read section contents from.

    Use as a context manager (``with ElfHeaders.open(path) as elf:``) so the file is closed.
    """

    def __init__(self, fh: BinaryIO, path: str) -> None:
        """Read the headers from ``fh`` (positioned anywhere); raise :class:`ElfError`."""
        self.path = path
        self._fh = fh
        try:
            self.file_size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise ElfError(f"{path}: {exc.strerror or exc}") from exc
        ident = self._read(0, 16)
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{path}: not an ELF file")
        if len(ident) < 16:
            raise ElfError(f"{path}: corrupt ELF file (truncated e_ident)")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfError(f"{path}: corrupt ELF file (bad class or data encoding in e_ident)")
        self.elf64 = ident[4] == 2
        self.little = ident[5] == 1
        self.endian = "<" if self.little else ">"
        # type, machine, version, entry, phoff, shoff, flags, ehsize, phentsize, phnum,
        # shentsize, shnum, shstrndx
        fmt = self.endian + ("HHIQQQIHHHHHH" if self.elf64 else "HHIIIIIHHHHHH")
        size = struct.calcsize(fmt)
        raw = self._read(16, size)
        if len(raw) < size:
            raise ElfError(f"{path}: corrupt ELF file (truncated ELF header)")
        (e_type, machine, _version, _entry, phoff, shoff, _flags, _ehsize,
         phentsize, phnum, shentsize, shnum, shstrndx) = struct.unpack(fmt, raw)
        self.e_type_value: int = e_type
        self.machine: int = machine  # e_machine (62: x86-64)
        self.sections_truncated = False
        self.sections = self._read_sections(shoff, shentsize, shnum, shstrndx)
        self._ph = (phoff, phentsize, phnum, shoff)
        self._segments: tuple[ProgramHeader, ...] | None = None

    @classmethod
    def open(cls, path: str) -> ElfHeaders:
        """Open ``path`` (regular files only) and read its headers."""
        try:
            fh = open_regular(path)
        except OSError as exc:
            raise ElfError(f"{path}: {exc.strerror or exc}") from exc
        try:
            return cls(fh, path)
        except BaseException:
            fh.close()
            raise

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

    def fileno(self) -> int:
        """The descriptor of the open file (for fstat)."""
        return self._fh.fileno()

    def __enter__(self) -> ElfHeaders:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def e_type(self) -> str:
        """``ET_EXEC``, ``ET_DYN``, …, or the number for values without a name."""
        return _E_TYPES.get(self.e_type_value, str(self.e_type_value))

    def _read(self, offset: int, size: int) -> bytes:
        # Never ask for more than the file holds: a corrupt size of terabytes would otherwise
        # allocate the buffer before reading a byte.
        size = max(0, min(size, self.file_size - offset))
        if size == 0:
            return b""
        try:
            return os.pread(self._fh.fileno(), size, offset)
        except (OSError, OverflowError, ValueError) as exc:
            raise ElfError(f"{self.path}: cannot read {size} bytes at {offset:#x}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from exc

    def _shdr_format(self) -> str:
        e = self.endian
        # name, type, flags, addr, offset, size, link, info, addralign, entsize
        return e + ("IIQQQQIIQQ" if self.elf64 else "IIIIIIIIII")

    def _section0(self, shoff: int) -> tuple[int, ...]:
        """(type, flags, offset, size, info, link) of section 0, which holds the real counts
        when the ELF header's fields overflow (extended numbering)."""
        fmt = self._shdr_format()
        raw = self._read(shoff, struct.calcsize(fmt)) if shoff else b""
        if len(raw) < struct.calcsize(fmt):
            raise ElfError(f"{self.path}: corrupt ELF file (no section header 0)")
        _name, stype, flags, _addr, offset, size, link, info, _align, _entsize = struct.unpack(
            fmt, raw)
        return (stype, flags, offset, size, info, link)

    def _read_sections(self, shoff: int, shentsize: int, shnum: int, shstrndx: int
                       ) -> tuple[SectionHeader, ...]:
        """The section headers with their names. A table cut short by the end of the file
        gives the complete entries and sets :attr:`sections_truncated`."""
        if shoff == 0:
            return ()
        fmt = self._shdr_format()
        std = struct.calcsize(fmt)
        if shnum == 0 or shstrndx == SHN_XINDEX:
            # Extended numbering: the real counts live in section 0's sh_size / sh_link.
            zero = self._section0(shoff)
            if shnum == 0:
                shnum = zero[3]
            if shstrndx == SHN_XINDEX:
                shstrndx = zero[5]
        if shnum == 0:
            return ()
        if shentsize < std:
            raise ElfError(f"{self.path}: corrupt ELF file (e_shentsize {shentsize})")
        table = self._read(shoff, (shnum - 1) * shentsize + std)
        complete = min(shnum, (len(table) - std) // shentsize + 1) if len(table) >= std else 0
        self.sections_truncated = complete < shnum
        rows = [struct.unpack_from(fmt, table, i * shentsize) for i in range(complete)]
        if not rows:
            return ()
        if shstrndx < complete:
            strtab = rows[shstrndx]
        else:
            # Out of range: read the header where the index points anyway, as pyelftools did
            # (so a damaged e_shstrndx names sections exactly as before, garbage or not).
            raw = self._read(shoff + shstrndx * shentsize, std)
            if len(raw) < std:
                raise ElfError(f"{self.path}: corrupt ELF file (no section-name table)")
            strtab = struct.unpack(fmt, raw)
        names_at, names = strtab[4], self._read(strtab[4], strtab[5])
        out = []
        for name_off, stype, flags, addr, offset, size, link, _info, _align, _entsize in rows:
            end = names.find(b"\0", name_off)
            raw = names[name_off:end] if end >= 0 else self._cstring_at(names_at + name_off)
            out.append(SectionHeader(raw.decode("utf-8", "replace"), stype, flags, offset,
                                     size, link, addr))
        return tuple(out)

    def _cstring_at(self, offset: int) -> bytes:
        """The NUL-terminated bytes at a file offset; b"" when the file ends first.

        Section names are read this way when they run past the end of the name table
        (pyelftools did not bound them by the table either).
        """
        chunks = []
        while True:
            chunk = self._read(offset, 64)
            head, nul, _ = chunk.partition(b"\0")
            chunks.append(head)
            if nul:
                return b"".join(chunks)
            if len(chunk) < 64:
                return b""
            offset += 64

    def _read_segments(self, phoff: int, phentsize: int, phnum: int
                       ) -> tuple[ProgramHeader, ...]:
        if phnum == 0:
            return ()  # (e_phoff 0 with entries reads them from offset 0, as pyelftools did)
        # 64-bit: type, flags, offset, vaddr, paddr, filesz, memsz, align;
        # 32-bit: type, offset, vaddr, paddr, filesz, memsz, flags, align
        fmt = self.endian + ("IIQQQQQQ" if self.elf64 else "IIIIIIII")
        std = struct.calcsize(fmt)
        if phentsize < std:
            raise ElfError(f"{self.path}: corrupt ELF file (e_phentsize {phentsize})")
        table = self._read(phoff, (phnum - 1) * phentsize + std)
        if len(table) < (phnum - 1) * phentsize + std:
            raise ElfError(f"{self.path}: corrupt ELF file (truncated program header table)")
        out = []
        for i in range(phnum):
            row = struct.unpack_from(fmt, table, i * phentsize)
            if self.elf64:
                ptype, flags, offset, vaddr, _paddr, filesz, memsz, align = row
            else:
                ptype, offset, vaddr, _paddr, filesz, memsz, flags, align = row
            out.append(ProgramHeader(ptype, flags, offset, vaddr, filesz, memsz, align))
        return tuple(out)

    @property
    def segments(self) -> tuple[ProgramHeader, ...]:
        """The program headers, read on first use: symbol tables need only the sections, and
        a damaged program header table must not hide an intact symbol table."""
        if self._segments is None:
            phoff, phentsize, phnum, shoff = self._ph
            if phnum == PN_XNUM:
                # More program headers than fit e_phnum: the count is section 0's sh_info.
                phnum = self._section0(shoff)[4]
            self._segments = self._read_segments(phoff, phentsize, phnum)
        return self._segments

    def section(self, index: int) -> SectionHeader | None:
        """Section ``index``, or None when there is no such section."""
        return self.sections[index] if 0 <= index < len(self.sections) else None

    def section_by_name(self, name: str) -> SectionHeader | None:
        """The first section called ``name``, or None."""
        return next((s for s in self.sections if s.name == name), None)

    def data(self, sec: SectionHeader) -> bytes:
        """The contents of ``sec`` (zlib-compressed sections decompressed, NOBITS as zeros).

        A section running past the end of the file gives the bytes that are there.
        """
        if sec.sh_type == SHT_NOBITS:
            return bytes(sec.sh_size)
        if not sec.sh_flags & SHF_COMPRESSED:
            return self._read(sec.sh_offset, sec.sh_size)
        chdr = self.endian + ("IIQQ" if self.elf64 else "III")
        head = self._read(sec.sh_offset, struct.calcsize(chdr))
        if len(head) < struct.calcsize(chdr):
            raise ElfError(f"{self.path}: corrupt ELF file (truncated compression header "
                           f"of {sec.name})")
        fields = struct.unpack(chdr, head)
        ch_type, ch_size = fields[0], fields[-2]
        if ch_type != ELFCOMPRESS_ZLIB:
            raise ElfError(f"{self.path}: {sec.name}: unknown compression type {ch_type:#x}")
        packed = self._read(sec.sh_offset + len(head), sec.sh_size - len(head))
        try:
            result = zlib.decompressobj().decompress(packed, ch_size)
        except zlib.error as exc:
            raise ElfError(f"{self.path}: {sec.name}: {exc}") from exc
        if len(result) != ch_size:
            raise ElfError(f"{self.path}: {sec.name}: decompressed to {len(result)} bytes, "
                           f"not {ch_size}")
        return result

    def segment_data(self, seg: ProgramHeader) -> bytes:
        """The file bytes of a program header's segment (``p_filesz`` from ``p_offset``)."""
        return self._read(seg.p_offset, seg.p_filesz)
