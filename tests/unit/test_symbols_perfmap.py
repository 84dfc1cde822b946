"""perf-<pid>.map parsing and JIT locations."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from heapscope.model import Mapping
from heapscope.symbols import SymbolOptions, symbolize
from heapscope.symbols.perfmap import PerfMap, find_perf_map, parse_line

from .test_symbols_support import profile

XSS = "<img src=x onerror=alert(1)>"


def test_parse_lines() -> None:
    assert parse_line("123f7ab0a6ae 42 JS:~ /tmp/jit/hot.js:1:1") == (
        0x123F7AB0A6AE,
        0x42,
        "JS:~ /tmp/jit/hot.js:1:1",
    )
    assert parse_line("0x00007f1618ec7620 0x0000000000000338 long Hot.work(long)") == (
        0x7F1618EC7620,
        0x338,
        "long Hot.work(long)",
    )
    assert parse_line(f"1000 10 {XSS}") == (0x1000, 0x10, XSS)
    assert parse_line("18c4000 300 Builtin:DeoptimizationEntry_Eager\r") == (
        0x18C4000,
        0x300,
        "Builtin:DeoptimizationEntry_Eager",
    )
    for bad in ("", "1000", "1000 10", "zz 10 f", "1000 -5 f", "1000 0 f", "1_0 10 f", "+5 1 f"):
        assert parse_line(bad) is None, bad


def test_later_lines_win_on_overlap() -> None:
    text = "1000 100 old\n1080 10 new\n2000 10 moved\n2000 10 moved again\n"
    perf = PerfMap.parse(text)
    assert perf.lookup(0x1000) == ("old", 0x1000)
    assert perf.lookup(0x1085) == ("new", 0x1080)
    assert perf.lookup(0x1095) == ("old", 0x1000)  # the old entry still owns the rest
    assert perf.lookup(0x2005) == ("moved again", 0x2000)
    assert perf.lookup(0x1100) is None
    assert perf.lookup(0xFFF) is None


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "perf-7.map"
    path.write_text("1000 10 complete\n2000 1")  # the writer was cut mid-line
    perf = PerfMap.read(str(path))
    assert len(perf) == 1
    assert perf.lookup(0x2000) is None
    assert find_perf_map(7, [str(tmp_path / "nope"), str(tmp_path)]) == str(path)
    assert find_perf_map(None, [str(tmp_path)]) is None


def test_jit_locations_from_perf_map(tmp_path: Path) -> None:
    maps_dir = tmp_path / "maps"
    maps_dir.mkdir()
    (maps_dir / "perf-4242.map").write_text(
        f"7f0000001000 40 {XSS}\n"
        "7f0000001040 40 JS:*work /app/hot.js:3:7\n"
        "0x7f0000002000 0x20 long Hot.work(long)\n"
    )
    anon = Mapping(0x7F0000000000, 0x7F0000010000, 0, "", "rwxp")
    stack = [0x7F0000001010, 0x7F0000001051, 0x7F0000002001, 0x7F0000009000, 0x42]
    prof = profile([stack], [anon], pid=4242)
    options = SymbolOptions(cache_dir=None, debuginfod_urls=(), perf_map_dirs=(str(maps_dir),))
    locs = symbolize(prof, options).profile.locations
    xss = locs[0x7F0000001010]
    assert (xss.module, xss.frames[0].function, xss.offset) == ("[jit]", XSS, 0x10)
    assert locs[0x7F0000001051].frames[0].function == "JS:*work /app/hot.js:3:7"
    # a return address: looked up at address-1, which is still the JVM method
    assert locs[0x7F0000002001].frames[0].function == "long Hot.work(long)"
    assert locs[0x7F0000009000].module == "[unknown]"
    assert locs[0x7F0000009000].frames == ()
    assert locs[0x42].module == "[unknown]"


def test_perf_map_next_to_the_dump(tmp_path: Path) -> None:
    (tmp_path / "perf-77.map").write_text("7f0000001000 40 jitted\n")
    dump = tmp_path / "prof.77.0.f.heap"
    dump.write_text("")
    anon = Mapping(0x7F0000000000, 0x7F0000010000, 0, "", "r-xp")
    prof = profile([[0x7F0000001004]], [anon], source=str(dump), pid=77)
    locs = symbolize(prof, SymbolOptions(cache_dir=None, debuginfod_urls=())).profile.locations
    assert locs[0x7F0000001004].frames[0].function == "jitted"


def test_only_maps_of_the_process_user_or_root_and_not_writable_by_others(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from heapscope.symbols.perfmap import untrusted

    m = tmp_path / "perf-42.map"
    m.write_text("1000 10 f\n")
    m.chmod(0o644)
    me = os.geteuid()
    assert untrusted(str(m), {me}) == ""
    m.chmod(0o666)
    assert untrusted(str(m), {me}) == "writable by other users"
    m.chmod(0o644)
    if me == 0:  # root can give the file away: a map planted by another user
        os.chown(m, 65534, 65534)
        assert untrusted(str(m), {1000}).startswith("owned by uid 65534")
        assert untrusted(str(m), {65534}) == ""
    link = tmp_path / "perf-43.map"
    link.symlink_to(m)
    assert untrusted(str(link), {me, 65534}) == "not a regular file"


def test_reading_is_bounded_by_the_entries(tmp_path: Path) -> None:
    """64 MiB of blank lines, a line longer than any name and a last line still being
    written: the two whole entries are read, in a few MB (a read of the whole text and
    its split into lines once took 10 bytes per blank line)."""
    path = tmp_path / "perf-1.map"
    with path.open("wb") as f:
        f.write(b"1000 10 first\n")
        f.write(b"\n" * (64 << 20))
        f.write(b"3000 10 " + b"x" * (1 << 20) + b"\n")
        f.write(b"2000 10 second\n")
        f.write(b"4000 10 half-writ")
    tracemalloc.start()
    try:
        perf = PerfMap.read(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert perf.lookup(0x1004) == ("first", 0x1000)
    assert perf.lookup(0x2004) == ("second", 0x2000)
    assert perf.lookup(0x3004) is None and perf.lookup(0x4004) is None
    assert peak < 8 << 20, f"peak {peak >> 20} MiB"
