"""End-to-end symbolization of tiny real binaries with fabricated memory maps."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from heapscope.model import Mapping
from heapscope.symbols import SymbolOptions, symbolize
from heapscope.symbols.elf import ElfInfo
from heapscope.symbols.llvm import BackendError, LlvmSymbolizer, RawFrame
from heapscope.symbols.options import ModuleFacts

from .test_symbols_support import (
    EXE_BASE,
    LIB_BASE,
    CountingBackend,
    build_c,
    functions,
    mappings_for,
    need,
    profile,
    return_address,
    run,
    source_line,
    split_debug,
)


def opts(tmp: Path, **kw: object) -> SymbolOptions:
    """Options isolated from the host: no cache, no debuginfod, an empty system debug dir."""
    base: dict[str, object] = {
        "cache_dir": None,
        "debuginfod_urls": (),
        "system_debug_dir": str(tmp / "no-system-debug"),
    }
    base.update(kw)
    return SymbolOptions(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """All fixture binaries, built once for this module."""
    need("gcc", "llvm-symbolizer", "objdump")
    d = tmp_path_factory.mktemp("symbols")
    out = {"dir": d}
    out["pie"] = build_c("inline.c", d / "inline_prog", "-O1", "-g", "-fPIE", "-pie")
    lib_full = build_c(
        "lib.c", d / "libsymtest.so.full", "-O1", "-fPIC", "-shared", "-fno-toplevel-reorder"
    )
    out["lib_full"] = lib_full
    out["lib"] = d / "libsymtest.so"
    run("strip", "--strip-all", "-o", out["lib"], lib_full)
    # A stripped PIE plus its separate debug file.
    (d / "stripped").mkdir()
    stripped = build_c("inline.c", d / "stripped" / "prog", "-O1", "-g", "-fPIE", "-pie")
    split_debug(stripped, d / "prog.debug")
    out["stripped"] = stripped
    out["debug"] = d / "prog.debug"
    return out


def test_pie_inline_chain_with_file_and_line(built: dict[str, Path], tmp_path: Path) -> None:
    pie = built["pie"]
    ret_outer = return_address(pie, "outer_alloc", "malloc")
    ret_main = return_address(pie, "main", "outer_alloc")
    maps = mappings_for(pie, EXE_BASE)
    leaf = 0x1000  # outside every mapping
    prof = profile([[leaf, EXE_BASE + ret_outer, EXE_BASE + ret_main]], maps)

    result = symbolize(prof, opts(tmp_path))

    loc = result.profile.locations[EXE_BASE + ret_outer]
    assert loc.module == "inline_prog"
    assert loc.offset == ret_outer - 1  # return address minus one
    assert [(f.function, f.inlined) for f in loc.frames] == [
        ("inner_alloc", True),
        ("outer_alloc", False),
    ]
    assert loc.frames[0].file.endswith("inline.c")
    assert loc.frames[0].line == source_line("inline.c", "inner_malloc")
    assert loc.frames[1].line == source_line("inline.c", "outer_call")
    main = result.profile.locations[EXE_BASE + ret_main]
    assert [(f.function, f.line) for f in main.frames] == [
        ("main", source_line("inline.c", "main_call"))
    ]
    unknown = result.profile.locations[leaf]
    assert (unknown.module, unknown.frames, unknown.offset) == ("[unknown]", (), leaf)
    assert [str(d) for d in result.diagnostics] == [
        "info: [unknown]: 1 address in anonymous memory or outside every mapping is not named "
        "(no process id to find a perf map)"
    ]


def test_leaf_address_is_not_adjusted(built: dict[str, Path], tmp_path: Path) -> None:
    pie = built["pie"]
    start, _size = functions(pie)["outer_alloc"]
    prof = profile([[EXE_BASE + start]], mappings_for(pie, EXE_BASE))
    loc = symbolize(prof, opts(tmp_path)).profile.locations[EXE_BASE + start]
    assert loc.offset == start
    assert loc.frames[-1].function == "outer_alloc"


def test_static_function_in_stripped_library_gets_no_name(
    built: dict[str, Path], tmp_path: Path
) -> None:
    syms = functions(built["lib_full"])
    a, internal, b = (syms[n] for n in ("lib_public_a", "lib_internal_alloc", "lib_public_b"))
    assert a[0] < internal[0] < b[0], "the compiler reordered the fixture's functions"
    addrs = {name: LIB_BASE + start + 4 for name, (start, _) in syms.items()}
    maps = mappings_for(built["lib"], LIB_BASE)
    backend = CountingBackend()
    prof = profile(
        [[addrs[n]] for n in ("lib_public_a", "lib_internal_alloc", "lib_public_b")], maps
    )

    result = symbolize(prof, opts(tmp_path), backend=backend)

    locs = result.profile.locations
    assert locs[addrs["lib_public_a"]].frames[0].function == "lib_public_a"
    assert locs[addrs["lib_public_b"]].frames[0].function == "lib_public_b"
    hidden = locs[addrs["lib_internal_alloc"]]
    assert hidden.frames == ()
    assert hidden.fallback_name == f"libsymtest.so+{internal[0] + 4:#x}"
    assert backend.calls == []  # no DWARF: llvm-symbolizer is never started
    assert "info: libsymtest.so: no debug info (names from the symbol table only)" in [
        str(d) for d in result.diagnostics
    ]


class NearestSymbolBackend:
    """A fake backend that answers like nm/jeprof: the nearest exported symbol, no line."""

    def lookup(self, path: str, vaddrs: list[int]) -> list[list[RawFrame]]:
        return [[RawFrame("lib_public_a")] for _ in vaddrs]


def test_backend_name_without_line_needs_a_covering_symbol(
    built: dict[str, Path], tmp_path: Path
) -> None:
    # A DWARF-less answer naming a symbol that does not contain the address is dropped.
    d = tmp_path / "g"
    d.mkdir()
    lib = build_c(
        "lib.c", d / "libsymtest.so", "-O1", "-g0", "-fPIC", "-shared", "-fno-toplevel-reorder"
    )
    run("objcopy", "--strip-symbol=lib_internal_alloc", lib)
    # Give it a .debug_info section so the backend is consulted.
    fake_debug = d / "x.c"
    fake_debug.write_text("int unused_var;\n")
    run("gcc", "-g", "-c", "-o", d / "x.o", fake_debug)
    run("objcopy", f"--add-section=.debug_info={d / 'x.o'}", lib)
    assert ElfInfo.read(str(lib)).has_debug_info
    syms = functions(built["lib_full"])
    lib_syms = functions(lib)
    assert "lib_internal_alloc" not in lib_syms
    internal = LIB_BASE + syms["lib_internal_alloc"][0] + 4
    inside_b = LIB_BASE + lib_syms["lib_public_b"][0] + 4
    prof = profile([[internal], [inside_b]], mappings_for(lib, LIB_BASE))
    result = symbolize(prof, opts(tmp_path), backend=NearestSymbolBackend())
    assert result.profile.locations[internal].frames == ()
    # Not confirmed either, but a sized symbol does contain this one: use that.
    assert result.profile.locations[inside_b].frames[0].function == "lib_public_b"


def test_debug_file_from_debug_dir_build_id_tree(built: dict[str, Path], tmp_path: Path) -> None:
    stripped, debug = built["stripped"], built["debug"]
    info = ElfInfo.read(str(stripped))
    assert not info.has_debug_info and info.build_id
    tree = tmp_path / "dbg" / ".build-id" / info.build_id[:2]
    tree.mkdir(parents=True)
    shutil.copy(debug, tree / f"{info.build_id[2:]}.debug")
    ret = return_address(built["pie"], "outer_alloc", "malloc")
    prof = profile([[0x10, EXE_BASE + ret]], mappings_for(stripped, EXE_BASE))

    without = symbolize(prof, opts(tmp_path)).profile.locations[EXE_BASE + ret]
    assert without.frames == ()  # stripped PIE: no .symtab, nothing exported

    result = symbolize(prof, opts(tmp_path, debug_dirs=(str(tmp_path / "dbg"),)))
    loc = result.profile.locations[EXE_BASE + ret]
    assert [f.function for f in loc.frames] == ["inner_alloc", "outer_alloc"]
    assert loc.frames[0].line == source_line("inline.c", "inner_malloc")
    assert not [d for d in result.diagnostics if d.module == "prog"]


def test_debug_file_via_debuglink_next_to_binary(built: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "app"
    d.mkdir()
    shutil.copy(built["stripped"], d / "prog")
    shutil.copy(built["debug"], d / "prog.debug")
    start, _ = functions(built["pie"])["outer_alloc"]
    prof = profile([[EXE_BASE + start]], mappings_for(d / "prog", EXE_BASE))
    loc = symbolize(prof, opts(tmp_path)).profile.locations[EXE_BASE + start]
    assert loc.frames[-1].function == "outer_alloc"
    assert loc.frames[-1].line > 0


def test_sysroot_and_search_path(built: dict[str, Path], tmp_path: Path) -> None:
    pie = built["pie"]
    start, _ = functions(pie)["outer_alloc"]
    maps = mappings_for(pie, EXE_BASE, map_path="/opt/app/bin/inline_prog")
    prof = profile([[EXE_BASE + start]], maps)
    root = tmp_path / "root" / "opt" / "app" / "bin"
    root.mkdir(parents=True)
    shutil.copy(pie, root / "inline_prog")
    search = tmp_path / "search"
    search.mkdir()
    shutil.copy(pie, search / "inline_prog")

    for options in (
        opts(tmp_path, sysroot=str(tmp_path / "root")),
        opts(tmp_path, search_paths=(str(search),)),
        opts(tmp_path, binaries=(str(pie),)),
    ):
        result = symbolize(prof, options)
        assert result.profile.locations[EXE_BASE + start].frames[-1].function == "outer_alloc"
        assert not [d for d in result.diagnostics if d.level == "warning"]

    # A lone --binary with another name stands for the main executable.
    renamed = mappings_for(pie, EXE_BASE, map_path="/opt/app/bin/server")
    result = symbolize(profile([[EXE_BASE + start]], renamed), opts(tmp_path, binaries=(str(pie),)))
    assert result.profile.locations[EXE_BASE + start].frames[-1].function == "outer_alloc"


def test_path_with_spaces_and_deleted_flag(built: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "my app"
    d.mkdir()
    exe = d / "prog (v2)"
    shutil.copy(built["pie"], exe)
    start, _ = functions(built["pie"])["outer_alloc"]
    maps = [
        Mapping(m.start, m.limit, m.offset, m.path, m.perms, deleted=True)
        for m in mappings_for(exe, EXE_BASE)
    ]
    # Deleted while it ran: the file now at the path is not proven to be the one that ran.
    result = symbolize(profile([[EXE_BASE + start]], maps), opts(tmp_path))
    loc = result.profile.locations[EXE_BASE + start]
    assert (loc.module, loc.frames) == ("prog (v2)", ())
    assert any("was deleted or replaced while the process ran" in str(d)
               for d in result.diagnostics), result.diagnostics
    # --force-symbols uses it; a recorded build-id that matches proves it.
    forced = symbolize(profile([[EXE_BASE + start]], maps), opts(tmp_path, force=True))
    assert forced.profile.locations[EXE_BASE + start].frames[-1].function == "outer_alloc"
    proof = ElfInfo.read(str(exe)).build_id
    recorded = {str(exe): ModuleFacts(proof)}
    proven = symbolize(profile([[EXE_BASE + start]], maps), opts(tmp_path, recorded=recorded))
    assert proven.profile.locations[EXE_BASE + start].frames[-1].function == "outer_alloc"

    os.unlink(exe)
    result = symbolize(profile([[EXE_BASE + start]], maps), opts(tmp_path))
    assert [str(d) for d in result.diagnostics] == [
        f"warning: prog (v2): {exe} (deleted while the process ran) not found; "
        "pass --binary FILE, --search-path DIR or --sysroot DIR"
    ]


def test_binary_matched_by_build_id_under_another_name(
    built: dict[str, Path], tmp_path: Path
) -> None:
    pie = built["pie"]
    start, _ = functions(pie)["outer_alloc"]
    bid = ElfInfo.read(str(pie)).build_id
    maps = [
        Mapping(m.start, m.limit, m.offset, "/srv/libfoo.so", m.perms, build_id=bid)
        for m in mappings_for(pie, LIB_BASE)
    ]
    other = built["lib"]  # two --binary files: the build-id picks the right one
    result = symbolize(
        profile([[LIB_BASE + start]], maps), opts(tmp_path, binaries=(str(other), str(pie)))
    )
    assert result.profile.locations[LIB_BASE + start].frames[-1].function == "outer_alloc"
    assert not [d for d in result.diagnostics if d.level == "warning"]


def test_missing_binary_diagnostic(built: dict[str, Path], tmp_path: Path) -> None:
    maps = mappings_for(built["pie"], EXE_BASE, map_path="/opt/app/leaky")
    address = maps[1].start + 0x10
    result = symbolize(profile([[address]], maps), opts(tmp_path))
    assert [str(d) for d in result.diagnostics] == [
        "warning: leaky: /opt/app/leaky not found; "
        "pass --binary FILE, --search-path DIR or --sysroot DIR"
    ]
    loc = result.profile.locations[address]
    assert loc.frames == ()
    assert loc.fallback_name == f"leaky+{maps[1].offset + 0x10:#x}"


def test_build_id_mismatch_diagnostic(built: dict[str, Path], tmp_path: Path) -> None:
    pie = built["pie"]
    start, _ = functions(pie)["outer_alloc"]
    maps = [
        Mapping(m.start, m.limit, m.offset, m.path, m.perms, build_id="ab" * 20)
        for m in mappings_for(pie, EXE_BASE)
    ]
    result = symbolize(profile([[EXE_BASE + start]], maps), opts(tmp_path))
    found = ElfInfo.read(str(pie)).build_id
    text = [str(d) for d in result.diagnostics]
    assert (
        "warning: inline_prog: build-id differs from the one recorded when the dump was "
        "taken (expected abababababab…, "
        f"found {found[:12]}… in {pie}): rebuilt since; not used"
    ) in text
    assert result.profile.locations[EXE_BASE + start].frames == ()


def test_file_newer_than_dump_and_wrong_layout(built: dict[str, Path], tmp_path: Path) -> None:
    pie = built["pie"]
    dump = tmp_path / "x.heap"
    dump.write_text("")
    os.utime(dump, (1_000_000, 1_000_000))
    maps = mappings_for(pie, EXE_BASE)
    result = symbolize(profile([[maps[1].start]], maps, source=str(dump)), opts(tmp_path))
    assert any("is newer than the dump" in str(d) for d in result.diagnostics)

    shifted = [Mapping(m.start, m.limit, m.offset + 0x100000, m.path, m.perms) for m in maps]
    result = symbolize(profile([[maps[1].start]], shifted), opts(tmp_path))
    assert any("no executable segment at file offset" in str(d) for d in result.diagnostics)


def test_cpp_template_and_lambda_display_names(tmp_path: Path) -> None:
    need("g++", "llvm-symbolizer")
    exe = tmp_path / "templates"
    run(
        "g++",
        "-O0",
        "-g",
        "-fPIE",
        "-pie",
        "-o",
        exe,
        Path(__file__).parent.parent / "data" / "symbols" / "templates.cpp",
    )
    syms = functions(exe)
    from heapscope.symbols.demangle import demangle

    wanted = {
        "ns::make<long>",
        "ns::Widget::grow",
        "ns::Widget::operator<",
        "(anonymous namespace)::hidden",
        "main::{lambda(int)#1}::operator()",
        "run<main::{lambda(int)#1}>",
        "std::_Function_handler<void* (int), main::{lambda(int)#1}>::_M_invoke",
    }
    picked = {demangle(raw)[1]: (raw, start) for raw, (start, _) in syms.items()}
    missing = wanted - picked.keys()
    assert not missing, f"fixture lacks {missing}"
    stacks = [[EXE_BASE + picked[name][1] + 1] for name in sorted(wanted)]
    result = symbolize(profile(stacks, mappings_for(exe, EXE_BASE)), opts(tmp_path))
    for name in wanted:
        raw, start = picked[name]
        frame = result.profile.locations[EXE_BASE + start + 1].frames[-1]
        assert frame.function == name
        assert frame.system_name == raw
        assert name in frame.full_name


def test_missing_symbolizer_falls_back_to_the_symbol_table(
    built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEAPSCOPE_SYMBOLIZER", str(tmp_path / "no-such-llvm-symbolizer"))
    pie = built["pie"]
    twin = tmp_path / "twin_prog"  # a second module with DWARF: the warning comes once
    shutil.copy(pie, twin)
    start, _ = functions(pie)["outer_alloc"]
    maps = mappings_for(pie, EXE_BASE) + mappings_for(twin, LIB_BASE)
    result = symbolize(profile([[EXE_BASE + start], [LIB_BASE + start]], maps),
                       opts(tmp_path))
    assert result.profile.locations[LIB_BASE + start].frames[0].function == "outer_alloc"
    frames = result.profile.locations[EXE_BASE + start].frames
    assert [(f.function, f.file, f.line) for f in frames] == [("outer_alloc", "", 0)]
    warnings = [d for d in result.diagnostics if d.level == "warning"]
    assert len(warnings) == 1, warnings  # said once, not once per module
    assert "apt-get install llvm" in warnings[0].message
    assert "symbol table" in warnings[0].message


def test_deterministic_and_reports_progress(built: dict[str, Path], tmp_path: Path) -> None:
    pie, lib = built["pie"], built["lib"]
    maps = mappings_for(pie, EXE_BASE) + mappings_for(lib, LIB_BASE)
    stacks = [
        [m.start + k * 7, m.start + k * 13 + 1] for m in maps if m.executable for k in range(20)
    ]
    seen: list[tuple[str, int, int]] = []
    first = symbolize(profile(stacks, maps), opts(tmp_path), lambda *a: seen.append(a))
    second = symbolize(profile(stacks, maps), opts(tmp_path))
    assert first == second
    assert seen[-1][1] == seen[-1][2] == 2


def test_a_module_looked_up_in_several_runs_gets_the_same_names(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pie, lib = built["pie"], built["lib"]
    maps = mappings_for(pie, EXE_BASE) + mappings_for(lib, LIB_BASE)
    stacks = [[m.start + k * 3, m.start + k * 11 + 1] for m in maps if m.executable
              for k in range(60)]
    whole = symbolize(profile(stacks, maps), opts(tmp_path))
    backend = CountingBackend()
    monkeypatch.setattr("heapscope.symbols.resolve.CHUNK", 25)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # cores to spare for the parts
    parts = symbolize(profile(stacks, maps), opts(tmp_path), backend=backend)
    runs = [n for path, n in backend.calls if path == str(pie)]
    assert len(runs) >= 2 and sum(runs) > 50  # the program's lookup was split
    assert parts.profile.locations == whole.profile.locations
    assert parts.diagnostics == whole.diagnostics


def test_modules_sharing_one_symbolizer_run_get_their_own_answers(
        built: dict[str, Path], tmp_path: Path) -> None:
    pie, lib = built["pie"], built["lib_full"]
    quoted = tmp_path / 'a "quoted" name'
    shutil.copy(pie, quoted)
    broken = tmp_path / "not-elf"
    broken.write_text("hello\n")
    pie_addrs = sorted(start + 1 for start, _ in functions(pie).values())
    lib_addrs = sorted(start + 2 for start, _ in functions(lib).values())
    backend = LlvmSymbolizer()
    alone = [backend.lookup(str(pie), pie_addrs), backend.lookup(str(lib), lib_addrs)]
    backend.calls = 0
    got = backend.lookup_many([(str(pie), pie_addrs), (str(broken), [0x10]),
                               (str(lib), lib_addrs), (str(quoted), pie_addrs), (str(pie), [])])
    assert got[0] == alone[0] and got[2] == alone[1] and got[3] == alone[0] and got[4] == []
    assert isinstance(got[1], BackendError) and str(broken) in str(got[1])
    assert backend.calls == 2  # one shared run; the quoted path cannot be named on a line


def test_modules_looked_up_together_are_named_as_one_by_one(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one shared run for the small modules
    pie = built["pie"]
    other = build_c("inline.c", tmp_path / "libother.so", "-O1", "-g", "-fPIC", "-shared")
    maps = mappings_for(pie, EXE_BASE) + mappings_for(other, LIB_BASE)
    stacks = [[m.start + k * 5, m.start + k * 17 + 1] for m in maps if m.executable
              for k in range(40)]
    together = LlvmSymbolizer()
    shared = symbolize(profile(stacks, maps), opts(tmp_path), backend=together)
    alone = CountingBackend()  # no lookup_many: one run per module
    single = symbolize(profile(stacks, maps), opts(tmp_path), backend=alone)
    assert together.calls == 1 and len(alone.calls) == 2
    assert shared == single


class _RecordingSymbolizer(LlvmSymbolizer):
    """The real backend, recording which files each run looked up."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[list[str]] = []

    def lookup(self, path: str, vaddrs: Sequence[int]) -> list[list[RawFrame]]:
        self.runs.append([path])
        return super().lookup(path, vaddrs)

    def lookup_many(self, requests: Sequence[tuple[str, Sequence[int]]]
                    ) -> list[list[list[RawFrame]] | BackendError]:
        self.runs.append([path for path, _ in requests])
        return super().lookup_many(requests)


def _program_and_two_libs(built: dict[str, Path], tmp_path: Path, in_program: int
                          ) -> tuple[Path, list[Path], list[Mapping], list[list[int]]]:
    """The program, two small libraries built from inline.c, their mappings, and stacks of
    one address each: ``in_program`` in the program, 5 in each library."""
    pie = built["pie"]
    libs = [build_c("inline.c", tmp_path / f"lib{k}.so", "-O1", "-g", "-fPIC", "-shared")
            for k in range(2)]
    maps = mappings_for(pie, EXE_BASE) + [
        m for k, lib in enumerate(libs) for m in mappings_for(lib, LIB_BASE + k * 0x10000000)]
    code = [m for m in maps if m.executable]
    stacks = [[code[0].start + k * 7 + 1] for k in range(in_program)] + [
        [m.start + k * 13 + 1] for m in code[1:] for k in range(5)]
    return pie, libs, maps, stacks


def test_small_modules_share_the_core_the_big_one_leaves(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr("heapscope.symbols.resolve.SMALL", 30)
    # 40 addresses in the program (its own run), 5 in each library (one shared run).
    pie, libs, maps, stacks = _program_and_two_libs(built, tmp_path, 40)
    backend = _RecordingSymbolizer()
    shared = symbolize(profile(stacks, maps), opts(tmp_path), backend=backend)
    assert sorted(backend.runs) == sorted([[str(pie)], [str(lib) for lib in libs]])
    alone = symbolize(profile(stacks, maps), opts(tmp_path), backend=CountingBackend())
    assert shared == alone


def test_the_helper_library_of_a_finished_run_is_found_in_the_package() -> None:
    """A run's helper is loaded from a private folder that is removed when the run ends; its
    frames are named from the package's build of it (same build-id), with no warning."""
    from heapscope.capture.helper import LIBRARY_NAME, library
    from heapscope.symbols.locate import Locator, Module

    built = library()
    if built is None:
        pytest.skip("the helper library was not built (no C compiler at install time)")
    gone = f"/tmp/heapscope-ctl-gone-{os.getpid()}/{LIBRARY_NAME}"
    elf = ElfInfo.read(built)
    # Mapped as the loader maps it: its executable segment at that segment's file offset.
    code = next(seg for seg in elf.segments if seg.flags & 1)
    module = Module(gone, [Mapping(0x7F0000000000 + code.offset, 0x7F0000010000,
                                   code.offset, gone, "r-xp", elf.build_id)])
    module.build_id = module.mappings[0].build_id
    Locator(SymbolOptions(cache_dir=None), [module], "/usr/bin/true").locate(module)
    assert module.elf is not None and module.elf.path == built
    assert not module.diagnostics
    # A different library under the helper's name is still refused.
    other = Module(gone, [Mapping(0x7F0000000000 + code.offset, 0x7F0000010000, code.offset,
                                  gone, "r-xp", "ab" * 20)])
    other.build_id = "ab" * 20
    Locator(SymbolOptions(cache_dir=None), [other], "/usr/bin/true").locate(other)
    assert other.elf is None and other.diagnostics


@pytest.mark.parametrize(("cores", "pie_runs"), [(2, 1), (3, 2)])
def test_a_module_is_split_only_over_cores_no_other_run_holds(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        cores: int, pie_runs: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr("heapscope.symbols.resolve.SMALL", 30)
    monkeypatch.setattr("heapscope.symbols.resolve.CHUNK", 25)
    # 60 addresses in the program (two CHUNKs: at most two parts), 5 in each library (one
    # shared run, which holds a core of its own).
    pie, libs, maps, stacks = _program_and_two_libs(built, tmp_path, 60)
    backend = _RecordingSymbolizer()
    got = symbolize(profile(stacks, maps), opts(tmp_path), backend=backend)
    assert sorted(backend.runs) == sorted([[str(pie)]] * pie_runs
                                          + [[str(lib) for lib in libs]])
    assert got == symbolize(profile(stacks, maps), opts(tmp_path), backend=CountingBackend())


def test_a_lone_module_is_split_over_both_cores(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr("heapscope.symbols.resolve.SMALL", 30)
    monkeypatch.setattr("heapscope.symbols.resolve.CHUNK", 25)
    pie = built["pie"]
    maps = mappings_for(pie, EXE_BASE)
    (code,) = [m for m in maps if m.executable]
    stacks = [[code.start + k * 7 + 1] for k in range(80)]  # 3 CHUNKs, 2 cores
    backend = _RecordingSymbolizer()
    got = symbolize(profile(stacks, maps), opts(tmp_path), backend=backend)
    assert backend.runs == [[str(pie)], [str(pie)]]
    assert got == symbolize(profile(stacks, maps), opts(tmp_path), backend=CountingBackend())


def test_each_address_gets_the_code_mapping_that_holds_it(tmp_path: Path) -> None:
    # Two code mappings with a gap, of files that are not there (named by file offset).
    a = Mapping(0x1000, 0x2000, 0x0, str(tmp_path / "gone-a.so"), "r-xp")
    data = Mapping(0x2000, 0x2800, 0x1000, str(tmp_path / "gone-a.so"), "rw-p")
    b = Mapping(0x3000, 0x4000, 0x2000, str(tmp_path / "gone-b.so"), "r-xp")
    stacks = [[0x0FFF], [0x1000], [0x1FFF], [0x2000], [0x2500], [0x3000, 0x1500],
              [0x3FFF, 0x3001], [0x4000], [0x1800, 0x3000]]
    got = symbolize(profile(stacks, [a, data, b]), opts(tmp_path)).profile.locations
    # By hand: [start, limit) of code mappings only; a return address (0x1500, 0x3001,
    # 0x3000 below a leaf) is looked up one byte lower, so 0x3000 falls before b.
    where = {address: (loc.mapping.start if loc.mapping else None, loc.module, loc.offset)
             for address, loc in got.items()}
    assert where == {
        0x0FFF: (None, "[unknown]", 0x0FFF),
        0x1000: (0x1000, "gone-a.so", 0x0),
        0x1FFF: (0x1000, "gone-a.so", 0xFFF),
        0x2000: (None, "[unknown]", 0x2000),
        0x2500: (None, "[unknown]", 0x2500),
        0x3000: (None, "[unknown]", 0x2FFF),
        0x1500: (0x1000, "gone-a.so", 0x4FF),
        0x3FFF: (0x3000, "gone-b.so", 0x2FFF),
        0x3001: (0x3000, "gone-b.so", 0x2000),
        0x4000: (None, "[unknown]", 0x4000),
        0x1800: (0x1000, "gone-a.so", 0x800),
    }
