"""The prepared-profile cache: a second look at a dump reads the stored result, and only
while every file its names came from, or were looked for, is as it was."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import heapscope.prepare
from heapscope import reuse
from heapscope.analysis.fold import FramePolicy, Wrappers
from heapscope.model import Frame, Location, Mapping, Profile, Sample, ThreadValues, ViaFrame
from heapscope.native import core
from heapscope.prepare import prepare
from heapscope.symbols import SymbolOptions
from heapscope.symbols.options import Diagnostic

from .test_symbols_ahead import top_rows, write_dump
from .test_symbols_support import (
    EXE_BASE,
    build_c,
    fresh_cache,
    mappings_for,
    need,
    return_address,
    source_line,
    split_debug,
)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need("gcc", "llvm-symbolizer", "objdump")
    return build_c("inline.c", tmp_path_factory.mktemp("reuse") / "prog", "-O1", "-g",
                   "-fPIE", "-pie")


def stack_of(binary: Path) -> list[int]:
    """malloc called from inner_alloc (inlined into outer_alloc), called from main."""
    return [EXE_BASE + return_address(binary, "outer_alloc", "malloc"),
            EXE_BASE + return_address(binary, "main", "outer_alloc")]


@pytest.fixture
def dump(program: Path, tmp_path: Path) -> Path:
    return write_dump(tmp_path / "jeprof.77.0.f.heap", [stack_of(program)],
                      mappings_for(program, EXE_BASE))


class Counted:
    """Counts how often the dump is read and symbolized (the work a stored result saves)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads = 0
        self.symbolizes = 0
        load, symbolize = heapscope.prepare.load_cached, heapscope.prepare.symbolize

        def counting_load(*a: Any, **k: Any) -> Any:
            self.loads += 1
            return load(*a, **k)

        def counting_symbolize(*a: Any, **k: Any) -> Any:
            self.symbolizes += 1
            return symbolize(*a, **k)

        monkeypatch.setattr(heapscope.prepare, "load_cached", counting_load)
        monkeypatch.setattr(heapscope.prepare, "symbolize", counting_symbolize)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from fresh_cache(tmp_path, monkeypatch)


def entries(cache: Path) -> list[Path]:
    folder = cache / reuse.FOLDER
    return sorted(folder.iterdir()) if folder.is_dir() else []


def names(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted((r["name"], r["line"]) for r in rows)


def expected_names() -> list[tuple[str, int]]:
    """What the source marks (inline.c)."""
    return sorted([("inner_alloc", source_line("inline.c", "inner_malloc")),
                   ("main", source_line("inline.c", "main_call")),
                   ("outer_alloc", source_line("inline.c", "outer_call"))])


def test_a_second_look_reads_the_stored_result(
        dump: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = Counted(monkeypatch)
    first = top_rows(str(dump))
    assert names(first) == expected_names()
    assert (work.loads, work.symbolizes) == (1, 1)
    assert len(entries(cache)) == 1
    assert top_rows(str(dump)) == first
    assert (work.loads, work.symbolizes) == (1, 1)  # neither read nor symbolized again
    # Without the cache every run does the work, and gets the same table.
    assert top_rows("--no-cache", str(dump)) == first
    assert (work.loads, work.symbolizes) == (2, 2)


def test_the_result_read_back_equals_the_computed_one(dump: Path, cache: Path) -> None:
    options = SymbolOptions()
    stored = prepare(str(dump), options)
    again = prepare(str(dump), options)
    computed = prepare(str(dump), options, reuse=False)
    assert again.profile == computed.profile == stored.profile
    assert again.profile is not stored.profile  # really read back
    assert again.diagnostics == computed.diagnostics
    assert again.wrappers.as_list() == computed.wrappers.as_list()


def test_a_changed_binary_is_read_again(
        dump: Path, program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "copy"
    shutil.copy(program, binary)
    here = write_dump(tmp_path / "jeprof.78.0.f.heap", [stack_of(binary)],
                      mappings_for(binary, EXE_BASE))
    work = Counted(monkeypatch)
    top_rows(str(here))
    os.utime(binary, ns=(1, 1))  # same bytes, another mtime: it may be another build
    top_rows(str(here))
    assert work.symbolizes == 2
    top_rows(str(here))
    assert work.symbolizes == 2


def test_a_debug_file_that_turns_up_gives_lines(
        program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stripped = tmp_path / "stripped"
    shutil.copy(program, stripped)
    (tmp_path / "elsewhere").mkdir()
    split_debug(stripped, tmp_path / "elsewhere" / "stripped.debug")
    here = write_dump(tmp_path / "jeprof.79.0.f.heap", [stack_of(program)],
                      mappings_for(stripped, EXE_BASE))
    before = top_rows(str(here))
    assert {r["line"] for r in before} == {0}  # symbol table only: functions, no lines
    assert names(top_rows(str(here))) == names(before)
    # Beside the binary, where .gnu_debuglink says: now the names and lines of DWARF.
    shutil.move(tmp_path / "elsewhere" / "stripped.debug", tmp_path / "stripped.debug")
    assert names(top_rows(str(here))) == expected_names()


def test_a_perf_map_that_turns_up_names_jit_code(tmp_path: Path) -> None:
    anon = Mapping(0x7F0000000000, 0x7F0000010000, 0, "", "r-xp")
    here = write_dump(tmp_path / "jeprof.80.0.f.heap", [[0x7F0000001004]], [anon])
    assert [r["name"] for r in top_rows(str(here))] == ["[unknown]+0x7f0000001004"]
    (tmp_path / "perf-80.map").write_text("7f0000001000 40 jitted_handler\n")
    assert [r["name"] for r in top_rows(str(here))] == ["jitted_handler"]


def test_results_that_may_change_by_themselves_are_not_stored(
        dump: Path, program: Path, cache: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No llvm-symbolizer: names from the symbol table, and a later run may have it.
    monkeypatch.setenv("HEAPSCOPE_SYMBOLIZER", str(tmp_path / "no-such-symbolizer"))
    assert {r["line"] for r in top_rows(str(dump))} == {0}
    assert entries(cache) == []
    monkeypatch.delenv("HEAPSCOPE_SYMBOLIZER")
    # A debuginfod server asked for debug info it did not have may have it next time.
    stripped = tmp_path / "stripped"
    shutil.copy(program, stripped)
    split_debug(stripped, tmp_path / "gone.debug")
    os.unlink(tmp_path / "gone.debug")
    here = write_dump(tmp_path / "jeprof.81.0.f.heap", [stack_of(program)],
                      mappings_for(stripped, EXE_BASE))
    monkeypatch.setenv("DEBUGINFOD_URLS", "http://127.0.0.1:9")  # refused at once
    top_rows(str(here))
    assert entries(cache) == []
    monkeypatch.delenv("DEBUGINFOD_URLS")
    top_rows(str(here))
    assert len(entries(cache)) == 1


def test_options_views_and_paths_get_their_own_results(
        dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = top_rows(str(dump))
    raw = top_rows("--frames", "raw", str(dump))
    own = top_rows("--own", "^main$", str(dump))
    for args, rows in ((("--frames", "raw"), raw), (("--own", "^main$"), own), ((), site)):
        assert top_rows("--no-cache", *args, str(dump)) == rows
    # The same dump under another name is reported under that name.
    link = tmp_path / "other-name.heap"
    link.symlink_to(dump)
    capsys.readouterr()
    from heapscope.cli.main import main

    assert main(["top", str(dump), str(link)]) == 0
    out = capsys.readouterr().out
    assert f"==> {dump} (pid 77) <==" in out
    assert f"==> {link} <==" in out


def test_an_entry_others_may_write_or_a_damaged_one_is_not_used(
        dump: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = top_rows(str(dump))
    (entry,) = entries(cache)
    work = Counted(monkeypatch)
    entry.chmod(0o664)  # group-writable: someone else could have written it
    assert top_rows(str(dump)) == first
    assert work.symbolizes == 1
    (entry,) = entries(cache)
    assert entry.stat().st_mode & 0o022 == 0  # written again, for this user alone
    data = entry.read_bytes()
    for damaged in (data[: len(data) // 2], data[:40] + b"\x00" * 64 + data[104:], b""):
        entry.write_bytes(damaged)
        assert top_rows(str(dump)) == first
    assert work.symbolizes == 4
    assert top_rows(str(dump)) == first
    assert work.symbolizes == 4


def test_only_the_newest_entries_are_kept(
        program: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reuse, "KEEP", 3)
    for k in range(5):
        here = write_dump(tmp_path / f"jeprof.{90 + k}.0.f.heap", [stack_of(program)],
                          mappings_for(program, EXE_BASE))
        prepare(str(here), SymbolOptions())
    assert len(entries(cache)) == 3


def odd_profile() -> Profile:
    """Per-thread values, via frames, a location without a mapping, shared frames."""
    m = Mapping(0x1000, 0x2000, 0, "/bin/x", "r-xp", "ab12", False)
    f = (Frame("f", "f.c", 3, True, "f(int)", "_Z1fi"), Frame("g", "g.c", 9))
    samples = (
        Sample((0x1004, 0x1008), (2.0, 64.0, 2.0, 64.0),
               (ThreadValues(1, (2.0, 64.0, 2.0, 64.0)),),
               (ViaFrame("std::vector", "v.h", 7, "libstdc++.so.6", "library"),)),
        Sample((0x1008,), (1.0, 8.0, 1.0, 8.0)),
        Sample((), (1.0, 1.0, 1.0, 1.0)),
    )
    locations = {0x1004: Location(0x1004, m, "x", 4, f), 0x1008: Location(0x1008, m, "x", 8, f),
                 0x9: Location(0x9, None, "[unknown]", 9)}
    from types import MappingProxyType

    return Profile(samples, (m,), period=1 << 19, unsampled=True, header=(1.0, 2.0),
                   locations=MappingProxyType(locations), pid=7, seq=3, kind="f",
                   source="some.heap", time=12.5)


@pytest.mark.parametrize("compiled", [True, False])
def test_threads_via_frames_and_odd_locations_round_trip(
        compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if compiled and core is None:
        pytest.fail("heapscope._native is not built (setup builds it)")
    if not compiled:
        monkeypatch.setattr(reuse, "core", None)
    p = odd_profile()
    wrappers = Wrappers()
    wrappers.named.add("xmalloc")
    wrappers.found["my_alloc"] = 4
    diags = (Diagnostic("x", "info", "no debug info"),)
    import marshal

    got, got_diags, got_wrappers = reuse._decode(marshal.loads(marshal.dumps(
        reuse._encode(p, diags, wrappers))))
    assert got == p
    assert got_diags == diags
    assert got_wrappers.as_list() == wrappers.as_list()
    assert type(got.samples[0].threads[0]) is ThreadValues
    assert type(got.samples[0].via[0]) is ViaFrame
    assert type(got.locations[0x1004].frames[0]) is Frame


def test_packed_stacks_refuse_damage() -> None:
    if core is None:
        pytest.fail("heapscope._native is not built (setup builds it)")
    samples = [Sample((10, 20), (1.0,)), Sample((), (2.0,)), Sample((20,), (3.0,), (), ())]
    table = (10, 20)
    data, odd = core.pack_stacks(samples, {10: 0, 20: 1})
    assert odd == []
    assert core.unpack_samples(data, table, [(1.0,), (2.0,), (3.0,)], Sample) == samples
    for bad, values in ((data[:-1], [(1.0,)] * 3), (data + b"\0" * 4, [(1.0,)] * 3),
                        (data, [(1.0,)] * 2), (data.replace(b"\x01\0\0\0", b"\x07\0\0\0"),
                                               [(1.0,)] * 3)):
        with pytest.raises(ValueError):
            core.unpack_samples(bad, table, values, Sample)
    with pytest.raises(KeyError):
        core.pack_stacks(samples, {10: 0})
    assert core.pack_stacks([Sample((10,), (1.0,), (ThreadValues(1, (1.0,)),))],
                            {10: 0})[1] == [0]


def test_frame_policy_is_part_of_the_identity(dump: Path) -> None:
    options = SymbolOptions()
    assert reuse.identity(str(dump), options, False, None) != reuse.identity(
        str(dump), options, False, FramePolicy(mode="raw"))
    assert reuse.identity(str(dump), options, False, None) != reuse.identity(
        str(dump), options, True, None)
    assert reuse.identity("-", options, False, None) is None
    assert reuse.identity(str(dump), SymbolOptions(cache_dir=None), False, None) is None
