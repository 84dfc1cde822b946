"""ELF facts, address translation and the strict symbol table."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from heapscope.model import Mapping
from heapscope.symbols.elf import ElfError, ElfInfo, Segment, _gnu_build_id, file_crc32
from heapscope.symbols.symtab import STB_GLOBAL, STB_LOCAL, STB_WEAK, SymbolTable

from .test_symbols_support import build_c, functions, run


def note(owner: bytes, ntype: int, desc: bytes) -> bytes:
    name = owner + b"\0"
    pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
    return struct.pack("<III", len(name), len(desc), ntype) + pad(name) + pad(desc)


def test_build_id_only_from_gnu_owned_notes() -> None:
    # stapsdt (SystemTap) notes also use type 3; they must not be taken for a build-id.
    data = note(b"stapsdt", 3, b"\x01" * 40) + note(b"GNU", 3, bytes.fromhex("ab12cd34"))
    assert _gnu_build_id(data, little=True) == "ab12cd34"
    assert _gnu_build_id(note(b"stapsdt", 3, b"\x01" * 20), little=True) == ""
    assert _gnu_build_id(data[:30], little=True) == ""  # truncated: no crash


def info(e_type: str, *segments: Segment) -> ElfInfo:
    return ElfInfo("x", e_type, "", tuple(segments), None, False, False, 0, 0)


def test_to_vaddr_pie_gnu_ld_layout() -> None:
    elf = info(
        "ET_DYN",
        Segment(0x0, 0x0, 0x5F8, 0x5F8, 4),
        Segment(0x1000, 0x1000, 0x1A5, 0x1A5, 5),
        Segment(0x2000, 0x2000, 0x104, 0x104, 4),
    )
    text = Mapping(0x555555555000, 0x555555556000, 0x1000, "/bin/x", "r-xp")
    assert elf.to_vaddr(text, 0x555555555123) == 0x1123
    assert elf.segment_for_mapping(text) is elf.segments[1]


def test_to_vaddr_lld_layout_where_vaddr_differs_from_offset() -> None:
    # lld: the executable segment starts mid-page in the file and one page later in memory.
    elf = info(
        "ET_DYN",
        Segment(0x0, 0x0, 0x71C, 0x71C, 4),
        Segment(0x720, 0x1720, 0x2A0, 0x2A0, 5),
        Segment(0x9C0, 0x29C0, 0x1F8, 0x1F8, 6),
    )
    text = Mapping(0x7F0000001000, 0x7F0000002000, 0x0, "/lib/libx.so", "r-xp")
    # runtime 0x7f0000001800 -> file offset 0x800 -> vaddr 0x1800
    assert elf.to_vaddr(text, 0x7F0000001800) == 0x1800
    # bytes of the mapped page before p_offset follow the same rule
    assert elf.to_vaddr(text, 0x7F0000001700) == 0x1700
    assert elf.segment_for_mapping(text) is elf.segments[1]


def test_to_vaddr_non_pie_uses_runtime_address() -> None:
    elf = info("ET_EXEC", Segment(0x1000, 0x401000, 0x200, 0x200, 5))
    text = Mapping(0x401000, 0x402000, 0x1000, "/bin/x", "r-xp")
    assert elf.to_vaddr(text, 0x401010) == 0x401010


def test_to_vaddr_outside_every_segment() -> None:
    elf = info("ET_DYN", Segment(0x1000, 0x1000, 0x100, 0x100, 5))
    wrong = Mapping(0x7F0000000000, 0x7F0000010000, 0x40000, "/lib/libx.so", "r-xp")
    assert elf.to_vaddr(wrong, 0x7F0000000010) is None
    assert elf.segment_for_mapping(wrong) is None


def test_read_real_binary_and_debuglink(tmp_path: Path) -> None:
    exe = build_c("inline.c", tmp_path / "prog", "-O1", "-g", "-Wl,--build-id=sha1")
    elf = ElfInfo.read(str(exe))
    assert elf.e_type == "ET_DYN" and len(elf.build_id) == 40 and elf.build_id.islower()
    assert elf.has_debug_info and elf.has_symtab and elf.debuglink is None
    readelf = run("readelf", "-n", exe)
    assert elf.build_id in readelf
    assert any(s.executable for s in elf.segments)

    debug = tmp_path / "prog.debug"
    run("objcopy", "--only-keep-debug", exe, debug)
    run("strip", "--strip-all", exe)
    run("objcopy", f"--add-gnu-debuglink={debug}", exe)
    stripped = ElfInfo.read(str(exe))
    assert stripped.debuglink == ("prog.debug", file_crc32(str(debug)))
    assert not stripped.has_debug_info and not stripped.has_symtab
    kept = ElfInfo.read(str(debug))
    assert kept.build_id == elf.build_id and kept.has_debug_info and kept.has_symtab


def test_read_rejects_non_elf(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x7fELF" + b"\xff" * 20)
    for path in (bad, tmp_path / "missing", Path("/etc/hostname")):
        with pytest.raises(ElfError):
            ElfInfo.read(str(path))


def test_symtab_requires_containment() -> None:
    table = SymbolTable(
        [
            (0x1000, 0x20, "a", STB_GLOBAL),
            (0x1040, 0x10, "b", STB_GLOBAL),
            (0x1080, 0x0, "zero_size", STB_GLOBAL),
        ]
    )
    assert table.lookup(0x1000) == "a"
    assert table.lookup(0x101F) == "a"
    assert table.lookup(0x1020) is None  # gap between a and b: never "the nearest"
    assert table.lookup(0x1050) is None  # past b's end
    assert table.lookup(0x1080) is None  # unsized symbols are ignored
    assert table.lookup(0xFFF) is None
    assert table.covers(0x1005, "a") and not table.covers(0x1005, "b")


def test_symtab_aliases_and_nesting() -> None:
    table = SymbolTable(
        [
            (0x2000, 0x100, "__libc_malloc_local", STB_LOCAL),
            (0x2000, 0x100, "__malloc", STB_WEAK),
            (0x2000, 0x100, "malloc", STB_GLOBAL),
            (0x3000, 0x400, "outer", STB_GLOBAL),
            (0x3100, 0x10, "inner_asm", STB_LOCAL),
        ]
    )
    assert table.lookup(0x2050) == "malloc"  # the exported alias wins
    assert table.covers(0x2050, "__malloc")
    assert table.lookup(0x3105) == "inner_asm"  # the innermost symbol wins
    assert table.lookup(0x3200) == "outer"  # found although inner_asm starts later


def test_symtab_of_stripped_library_has_only_exported(tmp_path: Path) -> None:
    full = build_c("lib.c", tmp_path / "lib.so", "-O1", "-fPIC", "-shared", "-fno-toplevel-reorder")
    syms = functions(full)
    run("strip", "--strip-all", full)
    table = SymbolTable.read(str(full))
    start, _size = syms["lib_internal_alloc"]
    assert table.lookup(start + 2) is None
    a_start, _ = syms["lib_public_a"]
    assert table.lookup(a_start + 2) == "lib_public_a"
