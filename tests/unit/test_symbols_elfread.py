"""The struct-based ELF reader against pyelftools, on real ELF files of this machine.

heapscope reads ELF headers, build-ids, debuglinks, DT_RUNPATH and function symbols with
:mod:`heapscope.symbols.elfread` (struct), having replaced pyelftools. Every expected value
here comes from pyelftools (still installed for the tests) reading the same file, or from
the file's bytes (file size, CRC32 of a debug file): nothing is computed by the code under
test. The sample is bounded and deterministic: about 110 evenly spaced files out of the
sorted ``/usr/lib/x86_64-linux-gnu/lib*.so*`` and ``/usr/bin/*`` ELF files, a few fixed
ones (libc, the dynamic loader, python3.11) with their separate debug files from
``/usr/lib/debug/.build-id``, every twelfth file of that folder, and files built here for
what the machine may lack (RPATH and RUNPATH, .gnu_debuglink, compressed debug sections,
ELF32, big-endian).

Damaged files must raise :class:`heapscope.symbols.elf.ElfError` with a message, never
another exception.
"""

from __future__ import annotations

import bisect
import glob
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from elftools.elf import enums
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection
from elftools.elf.segments import NoteSegment

from heapscope.symbols.elf import ElfError, ElfInfo, _runpaths, file_crc32, search_path
from heapscope.symbols.elfread import ElfHeaders
from heapscope.symbols.symtab import SymbolTable, defined_functions

LIBDIR = "/usr/lib/x86_64-linux-gnu"
DEBUG_ROOT = "/usr/lib/debug/.build-id"
SAMPLE_SIZE = 110
# Symbol tables bigger than this are decoded with numpy from the bytes pyelftools reads
# (node's 185,000 symbols would take 5 s as pyelftools Symbol objects).
PYELFTOOLS_SYMBOLS = 4_000
PROBES_PER_FILE = 400
FIXED = [
    f"{LIBDIR}/libc.so.6",
    f"{LIBDIR}/ld-linux-x86-64.so.2",
    f"{LIBDIR}/libm.so.6",
    "/usr/bin/python3.11",
]


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _machine_sample() -> list[str]:
    """The deterministic sample of ELF files installed on this machine."""
    found = sorted({
        p for p in glob.glob(f"{LIBDIR}/lib*.so*") + glob.glob("/usr/bin/*")
        if os.path.isfile(p) and not os.path.islink(p) and _is_elf(p)
    })
    step = max(1, -(-len(found) // SAMPLE_SIZE))
    sample = found[::step]
    sample += [p for p in FIXED if _is_elf(p) and p not in sample]
    debug = sorted(glob.glob(f"{DEBUG_ROOT}/*/*.debug"))
    sample += [p for p in debug[::12] if _is_elf(p)]
    return sample


MACHINE_FILES = _machine_sample()


# --------------------------------------------------------------------------- references


def _values(*tables: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for table in tables:
        for name, value in table.items():
            if not name.startswith("_"):
                out.setdefault(name, value)
    return out


_SH_TYPES = _values(*(getattr(enums, n) for n in dir(enums) if n.startswith("ENUM_SH_TYPE")))
_P_TYPES = _values(*(getattr(enums, n) for n in dir(enums) if n.startswith("ENUM_P_TYPE")))
_SHN = _values(enums.ENUM_ST_SHNDX)
_BINDS = _values(enums.ENUM_ST_INFO_BIND)
_STT_FUNC, _STT_GNU_IFUNC = "STT_FUNC", "STT_LOOS"  # pyelftools names STT_GNU_IFUNC STT_LOOS


def _num(value: int | str, names: dict[str, int]) -> int:
    """pyelftools gives known enum values as names, unknown ones as numbers."""
    return value if isinstance(value, int) else names[value]


def _text(raw: str, errors: str) -> str:
    """A pyelftools string (bytes decoded as latin-1) decoded as UTF-8 like heapscope."""
    return raw.encode("latin-1").decode("utf-8", errors)


@dataclass(frozen=True)
class RefSymbol:
    start: int
    size: int
    name: str
    bind: int


@dataclass
class Reference:
    """What pyelftools says about one file."""

    elf64: bool
    little: bool
    e_type: str
    sections: list[tuple[str, int, int, int, int, int]]
    segments: list[tuple[int, int, int, int, int, int, int]]
    build_id: str
    debuglink: tuple[str, int] | None
    has_debug_info: bool
    has_symtab: bool
    runpaths: list[str]
    functions: list[RefSymbol]
    # section index -> contents, for the sections heapscope reads the contents of
    contents: dict[int, bytes]


def _reference(path: str) -> Reference:
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        sections: list[tuple[str, int, int, int, int, int]] = []
        contents: dict[int, bytes] = {}
        build_id = ""
        debuglink: tuple[str, int] | None = None
        has_debug_info = has_symtab = False
        all_sections = list(elf.iter_sections())
        for index, sec in enumerate(all_sections):
            sh_type = _num(sec["sh_type"], _SH_TYPES)
            sections.append((_text(sec.name, "replace"), sh_type, sec["sh_flags"],
                             sec["sh_offset"], sec["sh_size"], sec["sh_link"]))
            in_file = sec["sh_type"] != "SHT_NOBITS" and sec["sh_size"] > 0
            if isinstance(sec, NoteSection) and in_file and sec["sh_size"] < 1 << 20:
                contents[index] = sec.data()
                for note in sec.iter_notes():
                    if (not build_id and note["n_type"] == "NT_GNU_BUILD_ID"
                            and note["n_name"] == "GNU" and note["n_descsz"]):
                        build_id = note["n_desc"]
            if sec.name == ".gnu_debuglink" and in_file:
                data = contents[index] = sec.data()
                # Name, NUL, padding to 4, CRC32: the CRC is the section's last 4 bytes.
                name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                endian = "<" if elf.little_endian else ">"
                debuglink = (name, struct.unpack(endian + "I", data[-4:])[0])
            if sec.name in (".debug_info", ".zdebug_info") and in_file:
                has_debug_info = True
            if sec["sh_type"] == "SHT_SYMTAB" and in_file:
                has_symtab = True
        segments = [
            (_num(seg["p_type"], _P_TYPES), seg["p_flags"], seg["p_offset"], seg["p_vaddr"],
             seg["p_filesz"], seg["p_memsz"], seg["p_align"])
            for seg in elf.iter_segments()
        ]
        if not build_id:
            for seg in elf.iter_segments():
                if isinstance(seg, NoteSegment) and seg["p_filesz"]:
                    for note in seg.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                            build_id = build_id or note["n_desc"]
        runpaths: list[str] = []
        dynamic = next((s for s in all_sections if s.name == ".dynamic"), None)
        if isinstance(dynamic, DynamicSection):
            for tag in dynamic.iter_tags():
                if tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                    # pyelftools names the string after the tag: tag.runpath, tag.rpath
                    value = getattr(tag, tag.entry.d_tag[3:].lower())
                    runpaths.append(_text(value, "replace"))
        return Reference(
            elf64=elf.elfclass == 64,
            little=elf.little_endian,
            e_type=elf.header["e_type"],
            sections=sections,
            segments=segments,
            build_id=build_id,
            debuglink=debuglink,
            has_debug_info=has_debug_info,
            has_symtab=has_symtab,
            runpaths=runpaths,
            functions=_ref_functions(elf, all_sections),
            contents=contents,
        )


def _ref_functions(elf: Any, sections: list[Any]) -> list[RefSymbol]:
    """Defined, sized, named function symbols of the first non-empty .symtab-type table,
    else of the first non-empty .dynsym-type table."""
    for kind in ("SHT_SYMTAB", "SHT_DYNSYM"):
        table = next((s for s in sections if s["sh_type"] == kind and s["sh_size"] > 0), None)
        if table is not None:
            break
    if not isinstance(table, SymbolTableSection):
        return []
    strtab = sections[table["sh_link"]]
    if strtab["sh_type"] == "SHT_NOBITS":
        return []
    if table.num_symbols() > PYELFTOOLS_SYMBOLS:
        return _big_table_functions(elf, table, strtab)
    out = []
    for sym in table.iter_symbols():
        info = sym["st_info"]
        if (info["type"] in (_STT_FUNC, _STT_GNU_IFUNC) and sym["st_size"] > 0
                and sym["st_shndx"] != "SHN_UNDEF" and sym.name):
            out.append(RefSymbol(sym["st_value"], sym["st_size"],
                                 _text(sym.name, "surrogateescape"),
                                 _num(info["bind"], _BINDS)))
    return out


def _big_table_functions(elf: Any, table: Any, strtab: Any) -> list[RefSymbol]:
    """The same for a table too big for pyelftools' per-symbol objects (~25 µs each): its
    bytes (read by pyelftools) decoded with a numpy record type of the ELF spec's Elf_Sym."""
    end = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:
        fields = [("name", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2"),
                  ("value", "u8"), ("size", "u8")]
    else:
        fields = [("name", "u4"), ("value", "u4"), ("size", "u4"), ("info", "u1"),
                  ("other", "u1"), ("shndx", "u2")]
    dtype = np.dtype([(n, end + t) for n, t in fields])
    data = table.data()
    syms = np.frombuffer(data[: len(data) - len(data) % dtype.itemsize], dtype=dtype)
    kind = syms["info"] & 0xF
    keep = ((kind == 2) | (kind == 10)) & (syms["size"] > 0) & (syms["shndx"] != 0)
    strings = strtab.data()
    out = []
    for name_off, info, value, size in zip(syms["name"][keep].tolist(),
                                           syms["info"][keep].tolist(),
                                           syms["value"][keep].tolist(),
                                           syms["size"][keep].tolist(), strict=True):
        stop = strings.find(b"\0", name_off)
        raw = strings[name_off : stop if stop >= 0 else len(strings)]
        if raw:
            out.append(RefSymbol(value, size, raw.decode("utf-8", "surrogateescape"),
                                 info >> 4))
    return out


_BIND_RANK = {1: 0, 2: 1, 0: 2}  # STB_GLOBAL, STB_WEAK, STB_LOCAL; others after


class ExpectedLookup:
    """The documented answers of SymbolTable.lookup and covers, from reference symbols."""

    def __init__(self, symbols: list[RefSymbol]) -> None:
        # Symbols grouped by size (up to 16, 256, 4096, ... bytes), each group sorted by start:
        # a symbol of a group containing vaddr starts less than the group's limit before it,
        # and few (non-overlapping) symbols of a group fit there.
        self.tiers: list[tuple[int, list[int], list[RefSymbol]]] = []
        lower = 0
        for limit in (*(16**i for i in range(1, 8)), 1 << 64):
            tier = sorted((s for s in symbols if lower < s.size <= limit),
                          key=lambda s: (s.start, s.size))
            self.tiers.append((limit, [s.start for s in tier], tier))
            lower = limit

    def containing(self, vaddr: int) -> list[RefSymbol]:
        out = []
        for limit, starts, tier in self.tiers:
            lo = bisect.bisect_left(starts, vaddr - limit + 1)
            hi = bisect.bisect_right(starts, vaddr)
            out += [s for s in tier[lo:hi] if vaddr < s.start + s.size]
        return out

    def lookup(self, vaddr: int) -> str | None:
        """The smallest containing symbol, then the exported alias (GLOBAL, WEAK, LOCAL,
        other), then fewer leading underscores, then byte order."""
        found = self.containing(vaddr)
        if not found:
            return None
        return min(found, key=lambda s: (
            s.size, _BIND_RANK.get(s.bind, 3), len(s.name) - len(s.name.lstrip("_")),
            s.name)).name


# ------------------------------------------------------------------------------ checks


def check_against_pyelftools(path: str) -> None:
    ref = _reference(path)

    with ElfHeaders.open(path) as elf:
        assert (elf.elf64, elf.little, elf.e_type) == (ref.elf64, ref.little, ref.e_type)
        assert not elf.sections_truncated
        got_sections = [(s.name, s.sh_type, s.sh_flags, s.sh_offset, s.sh_size, s.sh_link)
                        for s in elf.sections]
        assert got_sections == ref.sections
        got_segments = [(h.p_type, h.p_flags, h.p_offset, h.p_vaddr, h.p_filesz, h.p_memsz,
                         h.p_align) for h in elf.segments]
        assert got_segments == ref.segments
        for index, data in ref.contents.items():
            sec = elf.section(index)
            assert sec is not None and elf.data(sec) == data, sec
        assert _runpaths(elf) == ref.runpaths

    info = ElfInfo.read(path)
    assert info.path == path
    assert info.e_type == ref.e_type
    assert info.position_dependent == (ref.e_type == "ET_EXEC")
    loads = [s for s in ref.segments if s[0] == _P_TYPES["PT_LOAD"]]
    assert [(s.flags, s.offset, s.vaddr, s.filesz, s.memsz, s.align)
            for s in info.segments] == [s[1:] for s in loads]
    assert [s.executable for s in info.segments] == [bool(s[1] & 1) for s in loads]
    assert info.build_id == ref.build_id
    assert info.debuglink == ref.debuglink
    assert info.has_debug_info == ref.has_debug_info
    assert info.has_symtab == ref.has_symtab
    st = os.stat(path)
    assert (info.size, info.mtime_ns) == (st.st_size, st.st_mtime_ns)

    origin = os.path.dirname(os.path.realpath(path))
    expanded = tuple(
        os.path.normpath(d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
        for entry in ref.runpaths for d in entry.split(":") if d
    )
    assert search_path(path) == expanded

    table = SymbolTable.read(path)
    assert len(table) == len(ref.functions)
    assert defined_functions(path) == {s.name for s in ref.functions}
    if not ref.functions:
        return
    expected = ExpectedLookup(ref.functions)
    ordered = sorted(ref.functions, key=lambda s: (s.start, s.size, s.name))
    for sym in ordered[:: max(1, len(ordered) // PROBES_PER_FILE)]:
        for vaddr in (sym.start, sym.start + sym.size - 1, sym.start + sym.size, sym.start - 1):
            assert table.lookup(vaddr) == expected.lookup(vaddr), (hex(vaddr), sym)
            names = {s.name for s in expected.containing(vaddr)}
            assert table.covers(vaddr, sym.name) == (sym.name in names), (hex(vaddr), sym)


# ------------------------------------------------------------------------ machine files


@pytest.mark.parametrize("path", MACHINE_FILES)
def test_machine_file_matches_pyelftools(path: str) -> None:
    check_against_pyelftools(path)


def test_sample_is_meaningful() -> None:
    """The sample holds what the comparison needs to mean something on this machine."""
    if len(MACHINE_FILES) < 20:
        pytest.skip(f"only {len(MACHINE_FILES)} ELF files under {LIBDIR} and /usr/bin")
    infos = [ElfInfo.read(p) for p in MACHINE_FILES]
    assert sum(bool(i.build_id) for i in infos) > len(infos) // 2
    assert {i.e_type for i in infos} >= {"ET_DYN"}
    assert any(i.debuglink for i in infos)
    assert any(i.has_symtab for i in infos) and any(not i.has_symtab for i in infos)


@dataclass(frozen=True)
class DebugPair:
    binary: str
    debug: str


def _ref_build_id(path: str) -> str:
    with open(path, "rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".note.gnu.build-id")
        if isinstance(sec, NoteSection):
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    return str(note["n_desc"])
    return ""


def _debug_pairs() -> Iterator[DebugPair]:
    for path in FIXED:
        build_id = _ref_build_id(path) if _is_elf(path) else ""
        if build_id:
            debug = f"{DEBUG_ROOT}/{build_id[:2]}/{build_id[2:]}.debug"
            if os.path.isfile(debug):
                yield DebugPair(path, debug)


def test_separate_debug_files_match_their_binaries() -> None:
    """A binary and its /usr/lib/debug/.build-id file: same build-id, the debuglink's CRC is
    the debug file's CRC32, and the debug file's .symtab (with NOBITS code sections)
    reads like pyelftools reads it."""
    if not os.path.isdir(DEBUG_ROOT):
        pytest.skip(f"{DEBUG_ROOT} does not exist (no -dbg packages installed)")
    pairs = list(_debug_pairs())
    if not pairs:
        pytest.skip(f"none of {FIXED} has a debug file under {DEBUG_ROOT}")
    for pair in pairs:
        binary, debug = ElfInfo.read(pair.binary), ElfInfo.read(pair.debug)
        assert binary.build_id and debug.build_id == binary.build_id
        assert debug.has_debug_info and debug.has_symtab
        if binary.debuglink is not None:
            with open(pair.debug, "rb") as fh:
                crc = zlib.crc32(fh.read())
            assert file_crc32(pair.debug) == crc
            assert binary.debuglink[1] == crc, pair
        check_against_pyelftools(pair.debug)


# --------------------------------------------------------------------- files built here


def _run(*cmd: str | Path, cwd: Path | None = None) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                          check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr}")


def _need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


LIB_C = """
static int helper(int x) { return x * 3 + 1; }
__attribute__((noinline)) int twice(int x) { return helper(x) * 2; }
int thrice(int x) __attribute__((alias("twice")));
__attribute__((weak)) int weakling(int x) { return x - 1; }
int main(void) { return twice(1) + weakling(2); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ELF files built here, for what the machine's files may not have."""
    _need("gcc", "objcopy")
    d = tmp_path_factory.mktemp("elfread") / "bin"
    d.mkdir()
    src = d / "prog.c"
    src.write_text(LIB_C)
    out = {name: d / name for name in
           ("runpath", "rpath", "stripped", "stripped.debug", "gz", "lib.so", "obj.o")}
    _run("gcc", "-g", "-O1", src, "-o", out["runpath"], "-Wl,--enable-new-dtags",
         "-Wl,-rpath,$ORIGIN/../lib:/opt/x//y/:${ORIGIN}", "-Wl,--build-id=sha1")
    _run("gcc", "-g", "-O1", src, "-o", out["rpath"], "-Wl,--disable-new-dtags",
         "-Wl,-rpath,/opt/old:$ORIGIN", "-Wl,--build-id=md5")
    # A stripped binary with a .gnu_debuglink to its debug file.
    _run("gcc", "-g", "-O1", src, "-o", out["stripped"])
    _run("objcopy", "--only-keep-debug", out["stripped"], out["stripped.debug"])
    _run("objcopy", "--strip-all", "--add-gnu-debuglink=stripped.debug", "stripped",
         cwd=d)
    _run("gcc", "-g", "-O1", "-gz=zlib", src, "-o", out["gz"])
    _run("gcc", "-g", "-O2", "-shared", "-fPIC", src, "-o", out["lib.so"])
    _run("gcc", "-g", "-c", src, "-o", out["obj.o"])
    # ELF32, if this gcc can produce 32-bit objects (no 32-bit libraries are needed).
    proc = subprocess.run(["gcc", "-m32", "-g", "-c", str(src), "-o", str(d / "obj32.o")],
                          capture_output=True, check=False)
    if proc.returncode == 0:
        out["obj32.o"] = d / "obj32.o"
    # Big-endian ELF64 and ELF32 (objcopy wraps raw bytes in a relocatable file).
    (d / "blob").write_bytes(bytes(range(256)))
    for target in ("elf64-big", "elf32-big"):
        _run("objcopy", "-I", "binary", "-O", target, "blob", f"{target}.o", cwd=d)
        out[f"{target}.o"] = d / f"{target}.o"
    return out


@pytest.mark.parametrize("name", ["runpath", "rpath", "stripped", "stripped.debug", "gz",
                                  "lib.so", "obj.o", "obj32.o", "elf64-big.o", "elf32-big.o"])
def test_built_file_matches_pyelftools(built: dict[str, Path], name: str) -> None:
    if name not in built:
        pytest.skip(f"gcc -m32 cannot build {name} here")
    check_against_pyelftools(str(built[name]))


def test_built_files_have_what_they_were_built_for(built: dict[str, Path]) -> None:
    """The features these files exist for really are in them (else the comparisons above
    would compare empty answers)."""
    d = built["runpath"].parent
    assert search_path(str(built["runpath"])) == (
        os.path.normpath(f"{d}/../lib"), "/opt/x/y", str(d))
    assert search_path(str(built["rpath"])) == ("/opt/old", str(d))
    runpath, rpath = ElfInfo.read(str(built["runpath"])), ElfInfo.read(str(built["rpath"]))
    assert len(runpath.build_id) == 40 and len(rpath.build_id) == 32
    stripped = ElfInfo.read(str(built["stripped"]))
    assert not stripped.has_symtab and not stripped.has_debug_info
    with open(built["stripped.debug"], "rb") as fh:
        crc = zlib.crc32(fh.read())
    assert stripped.debuglink == ("stripped.debug", crc)
    assert file_crc32(str(built["stripped.debug"])) == crc
    gz = ElfInfo.read(str(built["gz"]))
    assert gz.has_debug_info
    with ElfHeaders.open(str(built["gz"])) as elf:
        compressed = [s for s in elf.sections if s.sh_flags & 0x800]
        assert compressed
    with open(built["gz"], "rb") as fh:
        ref = ELFFile(fh)
        for sec in compressed:
            with ElfHeaders.open(str(built["gz"])) as elf:
                ref_sec = ref.get_section_by_name(sec.name)
                assert ref_sec is not None and elf.data(sec) == ref_sec.data(), sec.name
    table = SymbolTable.read(str(built["lib.so"]))
    start = {s.name: s for s in _reference(str(built["lib.so"])).functions}
    # twice and its alias thrice: both GLOBAL, same size and underscores: byte order
    assert table.lookup(start["twice"].start) == "thrice"
    assert table.covers(start["twice"].start, "twice")
    assert ElfInfo.read(str(built["obj.o"])).e_type == "ET_REL"
    with ElfHeaders.open(str(built["elf64-big.o"])) as elf:
        assert elf.elf64 and not elf.little


# ----------------------------------------------------------------------- damaged files


def _small_elf(built: dict[str, Path]) -> bytes:
    return built["runpath"].read_bytes()


def _patch(data: bytes, fmt: str, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt):]


# ELF64 header offsets
E_PHOFF, E_SHOFF, E_PHENTSIZE, E_PHNUM, E_SHENTSIZE, E_SHNUM, E_SHSTRNDX = (
    32, 40, 54, 56, 58, 60, 62)

DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda d: b"",
    "only magic": lambda d: d[:4],
    "truncated e_ident": lambda d: d[:10],
    "truncated header": lambda d: d[:40],
    "bad magic": lambda d: b"\x7fELG" + d[4:],
    "not elf at all": lambda d: b"#!/bin/sh\necho hello\n" * 10,
    "bad class": lambda d: d[:4] + b"\x07" + d[5:],
    "bad data encoding": lambda d: d[:5] + b"\x00" + d[6:],
    "section table past EOF": lambda d: _patch(d, "<Q", E_SHOFF, len(d) + 4096),
    "section table far past EOF": lambda d: _patch(d, "<Q", E_SHOFF, 1 << 62),
    "section table cut short": lambda d: d[: struct.unpack_from("<Q", d, E_SHOFF)[0] + 100],
    "tiny e_shentsize": lambda d: _patch(d, "<H", E_SHENTSIZE, 8),
    "program header table past EOF": lambda d: _patch(d, "<Q", E_PHOFF, len(d) + 64),
    "tiny e_phentsize": lambda d: _patch(d, "<H", E_PHENTSIZE, 4),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_file_raises_elf_error(built: dict[str, Path], tmp_path: Path,
                                       damage: str) -> None:
    path = tmp_path / "damaged"
    path.write_bytes(DAMAGES[damage](_small_elf(built)))
    with pytest.raises(ElfError) as info:
        ElfInfo.read(str(path))
    assert str(info.value).strip(), damage
    assert str(path) in str(info.value)
    # Symbol tables need only the section headers: with damaged program headers they may
    # still be read; anything else is an ElfError with a message.
    for read in (SymbolTable.read, defined_functions):
        try:
            read(str(path))
        except ElfError as exc:
            assert str(exc).strip()
    assert isinstance(search_path(str(path)), tuple)


def test_not_a_regular_file_raises_elf_error(tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):
        for read in (ElfInfo.read, SymbolTable.read, defined_functions):
            with pytest.raises(ElfError) as info:
                read(str(path))
            assert str(path) in str(info.value)
        assert search_path(str(path)) == ()


def test_every_truncation_of_a_small_elf_is_elf_error_or_a_clean_answer(
        built: dict[str, Path], tmp_path: Path) -> None:
    """Cutting a real ELF file at any of a few hundred lengths never gives anything but an
    ElfError or an answer."""
    data = built["obj.o"].read_bytes()
    path = tmp_path / "cut"
    for length in sorted({*range(0, 128), *range(0, len(data), max(1, len(data) // 200))}):
        path.write_bytes(data[:length])
        for read in (ElfInfo.read, SymbolTable.read, defined_functions):
            try:
                read(str(path))
            except ElfError as exc:
                assert str(exc).strip(), length
        search_path.cache_clear()
        search_path(str(path))
