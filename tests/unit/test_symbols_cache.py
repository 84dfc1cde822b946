"""The on-disk frame cache and debuginfod downloads."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from heapscope.symbols import SymbolOptions, symbolize
from heapscope.symbols.cache import FORMAT, CacheEntry, SymbolCache
from heapscope.symbols.elf import ElfInfo
from heapscope.symbols.llvm import BackendError, LlvmSymbolizer, RawFrame

from .test_symbols_support import (
    EXE_BASE,
    CountingBackend,
    build_c,
    functions,
    mappings_for,
    need,
    profile,
    return_address,
    source_line,
    split_debug,
)


@pytest.fixture(scope="module")
def progs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need("gcc", "llvm-symbolizer", "objdump")
    d = tmp_path_factory.mktemp("cache")
    pie = build_c("inline.c", d / "inline_prog", "-O1", "-g", "-fPIE", "-pie")
    (d / "bin").mkdir()
    # Random (uuid) build-ids: these two must differ from each other and from inline_prog.
    flags = ("-O1", "-g", "-fPIE", "-pie", "-Wl,--build-id=uuid")
    served = build_c("inline.c", d / "bin" / "served", *flags)
    other = build_c("inline.c", d / "bin" / "unserved", *flags)
    split_debug(served, d / "served.debug")
    split_debug(other, d / "unserved.debug")
    return {
        "pie": pie,
        "stripped": served,
        "debug": d / "served.debug",
        "other": other,
        "other_debug": d / "unserved.debug",
    }


def options(tmp: Path, **kw: object) -> SymbolOptions:
    base: dict[str, object] = {
        "cache_dir": str(tmp / "cache"),
        "debuginfod_urls": (),
        "system_debug_dir": str(tmp / "no-system-debug"),
    }
    base.update(kw)
    return SymbolOptions(**base)  # type: ignore[arg-type]


def test_warm_run_starts_no_symbolizer(progs: dict[str, Path], tmp_path: Path) -> None:
    pie = progs["pie"]
    ret = return_address(pie, "outer_alloc", "malloc")
    starts = [EXE_BASE + s + 2 for s, _ in functions(pie).values()]
    prof = profile([[a, EXE_BASE + ret] for a in starts], mappings_for(pie, EXE_BASE))
    opts = options(tmp_path)

    cold_backend = CountingBackend()
    cold = symbolize(prof, opts, backend=cold_backend)
    assert len(cold_backend.calls) == 1  # one batch for the whole module
    assert cold.profile.locations[EXE_BASE + ret].frames[0].function == "inner_alloc"

    warm_backend = CountingBackend()
    warm = symbolize(prof, opts, backend=warm_backend)
    assert warm_backend.calls == []
    assert warm.profile.locations == cold.profile.locations

    key = SymbolCache.key(ElfInfo.read(str(pie)))
    entry_path = tmp_path / "cache" / "symbols" / key[:2] / f"{key[2:]}.json"
    assert json.loads(entry_path.read_text())["dwarf"] is True

    # A new address in the same module: only that one is looked up.
    more = profile([[EXE_BASE + ret + 3]], mappings_for(pie, EXE_BASE))
    symbolize(more, opts, backend=warm_backend)
    assert [n for _, n in warm_backend.calls] == [1]


def test_corrupt_cache_is_ignored_and_rewritten(progs: dict[str, Path], tmp_path: Path) -> None:
    pie = progs["pie"]
    start, _ = functions(pie)["outer_alloc"]
    prof = profile([[EXE_BASE + start]], mappings_for(pie, EXE_BASE))
    opts = options(tmp_path)
    symbolize(prof, opts)
    key = SymbolCache.key(ElfInfo.read(str(pie)))
    entry_path = tmp_path / "cache" / "symbols" / key[:2] / f"{key[2:]}.json"
    valid = entry_path.read_text()
    for garbage in (
        "{not json",
        valid.replace('"vaddrs":[', '"vaddrs":["zz",'),  # bad address
        valid.replace('"vaddrs":[', '"vaddrs":[-5,'),  # negative address, lists of unequal length
        valid.replace('"chain_of":[', '"chain_of":[-1,').replace('"vaddrs":[', '"vaddrs":[1,'),
        valid.replace('"chain_of":[', '"chain_of":[true,').replace('"vaddrs":[', '"vaddrs":[1,'),
        valid.replace('"format":3', '"format":2'),  # an entry of an older heapscope
        valid.replace('"strings":[', '"strings":[7,'),  # non-string in the string table
        valid.replace('"chains":[[', '"chains":[[99999,'),  # bad index, wrong length
        "[]",
        "",
    ):
        assert garbage != valid
        entry_path.write_text(garbage)
        backend = CountingBackend()
        result = symbolize(prof, opts, backend=backend)
        assert result.profile.locations[EXE_BASE + start].frames[-1].function == "outer_alloc"
        assert len(backend.calls) == 1
        assert json.loads(entry_path.read_text())["format"] == FORMAT
    assert not [p for p in entry_path.parent.iterdir() if p.name.startswith(".tmp")]


def test_cache_round_trip_and_disabled(tmp_path: Path) -> None:
    cache = SymbolCache(str(tmp_path))
    chain = (RawFrame("_Z1fv", "/a b/c.c", 7), RawFrame("main"))
    entry = CacheEntry(True, {0x1234: chain, 0x1235: chain, 0x2000: ()})
    cache.store("abcdef", entry)
    assert (tmp_path / "symbols" / "ab" / "cdef.json").is_file()
    assert cache.load("abcdef") == entry
    assert cache.load("000000") is None
    off = SymbolCache(None)
    off.store("abcdef", entry)
    assert off.load("abcdef") is None and not off.enabled


def test_cache_key_without_build_id(progs: dict[str, Path], tmp_path: Path) -> None:
    exe = build_c("inline.c", tmp_path / "nobid", "-O1", "-Wl,--build-id=none")
    elf = ElfInfo.read(str(exe))
    assert elf.build_id == ""
    key = SymbolCache.key(elf)
    assert key.startswith("nobuildid-")
    os.utime(exe, ns=(elf.mtime_ns + 10**9, elf.mtime_ns + 10**9))
    assert SymbolCache.key(ElfInfo.read(str(exe))) != key  # rebuilt file: new key


class _DebuginfodHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` (URL path -> body), 404 for anything else; logs request paths."""

    files: ClassVar[dict[str, bytes]] = {}
    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def debuginfod(progs: dict[str, Path]) -> Iterator[tuple[str, type[_DebuginfodHandler]]]:
    bid = ElfInfo.read(str(progs["stripped"])).build_id
    handler = type("Handler", (_DebuginfodHandler,), {})
    handler.files = {f"/buildid/{bid}/debuginfo": progs["debug"].read_bytes()}
    handler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", handler
    finally:
        server.shutdown()
        server.server_close()


def test_debuginfod_download(
    progs: dict[str, Path], tmp_path: Path, debuginfod: tuple[str, type[_DebuginfodHandler]]
) -> None:
    url, handler = debuginfod
    served, other = progs["stripped"], progs["other"]
    ret = return_address(progs["pie"], "outer_alloc", "malloc")
    other_main, _ = functions(progs["other_debug"])["main"]
    maps = mappings_for(served, EXE_BASE) + mappings_for(other, 0x600000000000)
    prof = profile([[0x10, EXE_BASE + ret], [0x600000000000 + other_main]], maps)
    opts = options(tmp_path, debuginfod_urls=(url,))

    result = symbolize(prof, opts)

    loc = result.profile.locations[EXE_BASE + ret]
    assert [f.function for f in loc.frames] == ["inner_alloc", "outer_alloc"]
    assert loc.frames[0].line == source_line("inline.c", "inner_malloc")
    bid = ElfInfo.read(str(served)).build_id
    stored = tmp_path / "cache" / "debuginfod" / bid / "debuginfo"
    assert stored.read_bytes() == progs["debug"].read_bytes()
    # the other binary is unknown to the server: 404, no names, and the miss is remembered
    assert result.profile.locations[0x600000000000 + other_main].frames == ()
    other_bid = ElfInfo.read(str(other)).build_id
    assert f"/buildid/{other_bid}/debuginfo" in handler.requests
    assert (tmp_path / "cache" / "debuginfod" / other_bid / ".miss").is_file()
    assert "info: unserved: no debug info (names from the symbol table only)" in [
        str(d) for d in result.diagnostics
    ]

    handler.requests.clear()
    again = symbolize(prof, opts)
    assert handler.requests == []  # download cached, miss remembered, frames cached
    assert again.profile.locations == result.profile.locations


def test_debuginfod_without_cache_dir(
    progs: dict[str, Path], tmp_path: Path, debuginfod: tuple[str, type[_DebuginfodHandler]]
) -> None:
    url, _ = debuginfod
    start, _ = functions(progs["pie"])["outer_alloc"]
    prof = profile([[EXE_BASE + start]], mappings_for(progs["stripped"], EXE_BASE))
    result = symbolize(prof, options(tmp_path, cache_dir=None, debuginfod_urls=(url,)))
    assert result.profile.locations[EXE_BASE + start].frames[-1].function == "outer_alloc"
    assert not (tmp_path / "cache").exists()


class FailingBackend:
    """A backend whose object file cannot be read."""

    def lookup(self, path: str, vaddrs: list[int]) -> list[list[RawFrame]]:
        raise BackendError(f"llvm-symbolizer cannot read {path}: corrupt DWARF")


def test_backend_failure_falls_back_to_symtab_and_is_not_cached(
    progs: dict[str, Path], tmp_path: Path
) -> None:
    pie = progs["pie"]
    start, _ = functions(pie)["outer_alloc"]
    prof = profile([[EXE_BASE + start]], mappings_for(pie, EXE_BASE))
    result = symbolize(prof, options(tmp_path), backend=FailingBackend())
    loc = result.profile.locations[EXE_BASE + start]
    assert [(f.function, f.line) for f in loc.frames] == [("outer_alloc", 0)]  # from .symtab
    assert any("corrupt DWARF; using the symbol table" in str(d) for d in result.diagnostics)
    assert not (tmp_path / "cache" / "symbols").exists()


def test_real_symbolizer_reports_unreadable_objects(tmp_path: Path) -> None:
    need("llvm-symbolizer")
    junk = tmp_path / "junk.so"
    junk.write_text("not an object file\n")
    with pytest.raises(BackendError, match="cannot read"):
        LlvmSymbolizer().lookup(str(junk), [0x1000, 0x2000])
