"""Cheap facts about one ELF file, and the runtime-address to ELF-address translation.

:class:`ElfInfo` reads only the ELF header, the program headers, the section headers and a
few small sections (notes, ``.gnu_debuglink``) through :mod:`heapscope.symbols.elfread`; it
never touches symbol tables or DWARF, so reading it for every module of a profile costs well
under a millisecond per module.
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from typing import NamedTuple

from heapscope.files import open_regular
from heapscope.model import Mapping
from heapscope.symbols.elfread import (
    PT_LOAD,
    PT_NOTE,
    SHT_DYNAMIC,
    SHT_NOTE,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfError,
    ElfHeaders,
)

__all__ = ["ElfError", "ElfInfo", "Segment", "file_crc32", "search_path"]

PF_X = 0x1
DT_NULL, DT_RPATH, DT_RUNPATH = 0, 15, 29
NT_GNU_BUILD_ID = 3
_MAX_NOTE_SECTION = 1 << 20  # notes are tiny; refuse to read a corrupt "note" of gigabytes


# NamedTuples, not dataclasses: `heapscope top` must not import dataclasses (start-up time).
class Segment(NamedTuple):
    """One PT_LOAD program header."""

    offset: int
    vaddr: int
    filesz: int
    memsz: int
    flags: int
    align: int = 0x1000

    @property
    def executable(self) -> bool:
        """True when the segment is mapped executable (PF_X)."""
        return bool(self.flags & PF_X)

    def contains_offset(self, file_offset: int) -> bool:
        """True when ``file_offset`` is one of the bytes this segment loads from the file."""
        return self.offset <= file_offset < self.offset + self.filesz

    def page_start(self) -> int:
        """The file offset of the page the kernel maps first for this segment."""
        # The kernel maps whole pages, so /proc/PID/maps shows the offset rounded down to the
        # page size; p_align bounds the page size (4 KiB on x86-64, up to 64 KiB elsewhere).
        page = min(max(self.align, 0x1000), 0x10000)
        return self.offset - self.offset % page


class ElfInfo(NamedTuple):
    """What heapscope needs to know about an ELF file before symbolizing against it."""

    path: str
    e_type: str  # "ET_EXEC", "ET_DYN", ...
    build_id: str  # lowercase hex, "" when the file has no GNU build-id note
    segments: tuple[Segment, ...]  # PT_LOAD only, in file order
    debuglink: tuple[str, int] | None  # (.gnu_debuglink file name, CRC32)
    has_debug_info: bool  # a non-empty .debug_info (or .zdebug_info) with contents
    has_symtab: bool  # a .symtab with contents (stripped files have only .dynsym)
    size: int
    mtime_ns: int

    @classmethod
    def read(cls, path: str) -> ElfInfo:
        """Read the cheap facts of ``path``; raise :class:`ElfError` if it is not ELF."""
        with ElfHeaders.open(path) as elf:
            try:
                st = os.fstat(elf.fileno())
            except OSError as exc:
                raise ElfError(f"{path}: {exc.strerror or exc}") from exc
            return cls._parse(path, elf, st)

    @classmethod
    def _parse(cls, path: str, elf: ElfHeaders, st: os.stat_result) -> ElfInfo:
        if elf.sections_truncated:
            # Facts from part of the sections could miss the build-id or the debug info.
            raise ElfError(f"{path}: corrupt ELF file (truncated section header table)")
        segments = tuple(
            Segment(h.p_offset, h.p_vaddr, h.p_filesz, h.p_memsz, h.p_flags, h.p_align)
            for h in elf.segments if h.p_type == PT_LOAD
        )
        build_id = ""
        debuglink: tuple[str, int] | None = None
        has_debug_info = False
        has_symtab = False
        for sec in elf.sections:
            has_data = sec.has_data
            if sec.sh_type == SHT_NOTE and has_data and not build_id:
                if sec.sh_size <= _MAX_NOTE_SECTION:
                    build_id = _gnu_build_id(elf.data(sec), elf.little)
            elif sec.name == ".gnu_debuglink" and has_data:
                debuglink = _parse_debuglink(elf.data(sec), elf.little)
            elif sec.name in (".debug_info", ".zdebug_info") and has_data:
                has_debug_info = True
            elif sec.sh_type == SHT_SYMTAB and has_data:
                has_symtab = True
        if not build_id:
            # No section headers (e.g. sstrip'ed files): fall back to the PT_NOTE segments.
            for seg in elf.segments:
                if seg.p_type == PT_NOTE and 0 < seg.p_filesz <= _MAX_NOTE_SECTION:
                    build_id = _gnu_build_id(elf.segment_data(seg), elf.little)
                    if build_id:
                        break
        return cls(
            path=path,
            e_type=elf.e_type,
            build_id=build_id,
            segments=segments,
            debuglink=debuglink,
            has_debug_info=has_debug_info,
            has_symtab=has_symtab,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
        )

    @property
    def position_dependent(self) -> bool:
        """True for ET_EXEC (non-PIE) files, whose runtime addresses are their ELF addresses."""
        return self.e_type == "ET_EXEC"

    def segment_for_mapping(self, mapping: Mapping) -> Segment | None:
        """The executable PT_LOAD that ``mapping`` maps, judged by its file offset."""
        for seg in self.segments:
            if seg.executable and seg.page_start() <= mapping.offset < seg.offset + seg.filesz:
                return seg
        return None

    def delta(self, mapping: Mapping) -> int | None:
        """``vaddr - runtime address`` for every address of an executable mapping, or None.

        None when no executable segment explains the mapping (then :meth:`to_vaddr` decides
        address by address).
        """
        if self.position_dependent:
            return 0
        seg = self.segment_for_mapping(mapping) if mapping.executable else None
        if seg is None:
            return None
        return mapping.offset - mapping.start - seg.offset + seg.vaddr

    def to_vaddr(self, mapping: Mapping, address: int) -> int | None:
        """The ELF virtual address of runtime ``address`` inside ``mapping``, or None.

        None means no PT_LOAD explains the address, i.e. the file is not what was mapped.
        """
        if self.position_dependent:
            return address
        file_off = address - mapping.start + mapping.offset
        # The mapping maps one segment, and every byte of it (even page bytes before an lld
        # segment's unaligned p_offset) follows that segment's offset->vaddr rule.
        mapped = self.segment_for_mapping(mapping) if mapping.executable else None
        if mapped is not None:
            return file_off - mapped.offset + mapped.vaddr
        for seg in self.segments:
            if seg.contains_offset(file_off):
                return file_off - seg.offset + seg.vaddr
        return None


def _gnu_build_id(data: bytes, little: bool) -> str:
    """The NT_GNU_BUILD_ID descriptor in a block of notes, as lowercase hex, or ""."""
    # Only notes owned by "GNU" count: stapsdt (SystemTap) notes also use type 3.
    end = "<" if little else ">"
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(end + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        pos = desc_at + ((descsz + 3) & ~3)
        if desc_at + descsz > len(data):
            break  # truncated note
        name = data[name_at : name_at + namesz]
        if ntype == NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU" and descsz:
            return data[desc_at : desc_at + descsz].hex()
    return ""


def _parse_debuglink(data: bytes, little: bool) -> tuple[str, int] | None:
    """(file name, CRC32) from the contents of a .gnu_debuglink section."""
    nul = data.find(b"\0")
    if nul <= 0:
        return None
    crc_at = (nul + 4) & ~3
    if crc_at + 4 > len(data):
        return None
    (crc,) = struct.unpack_from("<I" if little else ">I", data, crc_at)
    return data[:nul].decode("utf-8", "surrogateescape"), crc


def file_crc32(path: str) -> int | None:
    """The CRC32 that .gnu_debuglink records for a debug file, or None if unreadable."""
    crc = 0
    try:
        with open_regular(path) as fh:
            while chunk := fh.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None
    return crc & 0xFFFFFFFF


@functools.lru_cache(maxsize=64)
def search_path(path: str) -> tuple[str, ...]:
    """The folders a program's DT_RUNPATH (or DT_RPATH) names, ``$ORIGIN`` expanded: where its
    own shared libraries are installed. Empty when the file cannot be read."""
    try:
        with ElfHeaders.open(path) as elf:
            found = _runpaths(elf)
    except ElfError:
        return ()  # not a readable ELF file: no search path
    origin = os.path.dirname(os.path.realpath(path))
    out = []
    for entry in found:
        for d in entry.split(":"):
            d = d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
            if d:
                out.append(os.path.normpath(d))
    return tuple(out)


def _runpaths(elf: ElfHeaders) -> list[str]:
    """The DT_RUNPATH and DT_RPATH strings of the ``.dynamic`` section, in table order."""
    dynamic = elf.section_by_name(".dynamic")
    if dynamic is None or dynamic.sh_type != SHT_DYNAMIC:
        return []
    strtab = elf.section(dynamic.sh_link)
    if strtab is None or strtab.sh_type != SHT_STRTAB:
        return []
    strings = elf.data(strtab)
    data = elf.data(dynamic)
    fmt = elf.endian + ("qQ" if elf.elf64 else "iI")  # d_tag, d_val
    entry = struct.calcsize(fmt)
    found = []
    for tag, value in struct.iter_unpack(fmt, data[: len(data) - len(data) % entry]):
        if tag == DT_NULL:
            break
        if tag in (DT_RPATH, DT_RUNPATH):
            end = strings.find(b"\0", value)
            raw = strings[value : end if end >= 0 else len(strings)]
            found.append(raw.decode("utf-8", "replace"))
    return found
