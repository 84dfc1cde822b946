"""Cheap facts about one ELF file, and the runtime-address to ELF-address translation.

:class:`ElfInfo` reads only the ELF header, the program headers, the section headers and a
few small sections (notes, ``.gnu_debuglink``); it never touches symbol tables or DWARF, so
reading it for every module of a profile costs a few milliseconds.
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from heapscope.files import open_regular
from heapscope.model import Mapping

PF_X = 0x1
NT_GNU_BUILD_ID = 3
_MAX_NOTE_SECTION = 1 << 20  # notes are tiny; refuse to read a corrupt "note" of gigabytes


class ElfError(ValueError):
    """The file is not a readable ELF file."""


@dataclass(frozen=True, slots=True)
class Segment:
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


@dataclass(frozen=True, slots=True)
class ElfInfo:
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
        try:
            st = os.stat(path)
            with open_regular(path) as fh:
                if fh.read(4) != b"\x7fELF":
                    raise ElfError(f"{path}: not an ELF file")
                fh.seek(0)
                return cls._parse(path, ELFFile(fh), st)
        except ElfError:
            raise
        except OSError as exc:
            raise ElfError(f"{path}: {exc.strerror or exc}") from exc
        except Exception as exc:
            # pyelftools raises a zoo of exception types (ELFError, struct.error, KeyError,
            # construct errors, …) on truncated or corrupt files; all mean "unreadable ELF".
            raise ElfError(f"{path}: corrupt ELF file ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def _parse(cls, path: str, elf: ELFFile, st: os.stat_result) -> ElfInfo:
        little = bool(elf.little_endian)
        segments = []
        for seg in elf.iter_segments():
            h = seg.header
            if h.p_type == "PT_LOAD":
                segments.append(
                    Segment(h.p_offset, h.p_vaddr, h.p_filesz, h.p_memsz, h.p_flags, h.p_align)
                )
        build_id = ""
        debuglink: tuple[str, int] | None = None
        has_debug_info = False
        has_symtab = False
        for sec in elf.iter_sections():
            h = sec.header
            has_data = h.sh_type != "SHT_NOBITS" and h.sh_size > 0
            if h.sh_type == "SHT_NOTE" and has_data and not build_id:
                if h.sh_size <= _MAX_NOTE_SECTION:
                    build_id = _gnu_build_id(sec.data(), little)
            elif sec.name == ".gnu_debuglink" and has_data:
                debuglink = _parse_debuglink(sec.data(), little)
            elif sec.name in (".debug_info", ".zdebug_info") and has_data:
                has_debug_info = True
            elif h.sh_type == "SHT_SYMTAB" and has_data:
                has_symtab = True
        if not build_id:
            # No section headers (e.g. sstrip'ed files): fall back to the PT_NOTE segments.
            for seg in elf.iter_segments():
                h = seg.header
                if h.p_type == "PT_NOTE" and 0 < h.p_filesz <= _MAX_NOTE_SECTION:
                    build_id = _gnu_build_id(seg.data(), little)
                    if build_id:
                        break
        return cls(
            path=path,
            e_type=str(elf.header.e_type),
            build_id=build_id,
            segments=tuple(segments),
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
        with open_regular(path) as fh:
            elf = ELFFile(fh)
            dynamic = elf.get_section_by_name(".dynamic")
            if dynamic is None or not hasattr(dynamic, "iter_tags"):
                return ()
            found = [str(getattr(t, "runpath", "") or getattr(t, "rpath", ""))
                     for t in dynamic.iter_tags()
                     if t.entry.d_tag in ("DT_RUNPATH", "DT_RPATH")]
    except (OSError, ELFError, ValueError, AttributeError, KeyError, TypeError):
        return ()  # not a readable ELF file: no search path
    origin = os.path.dirname(os.path.realpath(path))
    out = []
    for entry in found:
        for d in entry.split(":"):
            d = d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
            if d:
                out.append(os.path.normpath(d))
    return tuple(out)
