"""The program's llvm-symbolizer started ahead: taken by the lookup of the same file only,
never changing an answer, never started for a warm cache or for files options choose."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from heapscope.cli.main import main
from heapscope.model import Mapping
from heapscope.symbols import ahead, llvm
from heapscope.symbols.llvm import LlvmSymbolizer, ahead_paths

from .test_symbols_support import (
    EXE_BASE,
    build_c,
    fresh_cache,
    functions,
    mappings_for,
    need,
    return_address,
    source_line,
    split_debug,
)


def maps_text(maps: Sequence[Mapping]) -> str:
    """``/proc/PID/maps`` lines for ``maps``, as jemalloc copies them into a dump."""
    return "".join(f"{m.start:012x}-{m.limit:012x} {m.perms} {m.offset:08x} fe:00 4242"
                   f"                       {m.path}\n" for m in maps)


def write_dump(path: Path, stacks: Sequence[Sequence[int]], maps: Sequence[Mapping]) -> Path:
    """A jemalloc heap_v2 dump (every allocation sampled) with one 100-byte object per stack."""
    body = [f"heap_v2/0\n  t*: {len(stacks)}: {100 * len(stacks)} [0: 0]\n"]
    for stack in stacks:
        body.append("@ " + " ".join(f"{a:#x}" for a in stack) + "\n  t*: 1: 100 [0: 0]\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(body) + "\nMAPPED_LIBRARIES:\n" + maps_text(maps))
    return path


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need("gcc", "llvm-symbolizer", "objdump")
    d = tmp_path_factory.mktemp("ahead") / "a folder with spaces"
    d.mkdir()
    return build_c("inline.c", d / "inline prog", "-O1", "-g", "-fPIE", "-pie")


@pytest.fixture
def dump(program: Path, tmp_path: Path) -> Path:
    """A dump of ``program``: malloc called from inner_alloc (inlined into outer_alloc),
    called from main."""
    ret_outer = return_address(program, "outer_alloc", "malloc")
    ret_main = return_address(program, "main", "outer_alloc")
    stack = [EXE_BASE + ret_outer, EXE_BASE + ret_main]
    return write_dump(tmp_path / "jeprof.77.0.f.heap", [stack], mappings_for(program, EXE_BASE))


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh symbol cache, no debuginfod; nothing left started after the test."""
    yield from fresh_cache(tmp_path, monkeypatch)


def top_rows(*args: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["top", "--format", "json", "-n", "0", "--lines", *args]) == 0
    rows: list[dict[str, Any]] = json.loads(out.getvalue())["rows"]
    return rows


def test_cold_top_uses_the_process_started_for_the_program(
        dump: Path, program: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    finish = llvm.Ahead.finish

    def spy(self: llvm.Ahead, lines: str) -> tuple[int, str, str] | None:
        taken.append(self.path)
        return finish(self, lines)

    monkeypatch.setattr(llvm.Ahead, "finish", spy)
    rows = top_rows(str(dump))
    assert taken == [str(program)]
    # The names and lines the source says, read from the process started ahead.
    line = {marker: source_line("inline.c", marker)
            for marker in ("inner_malloc", "outer_call", "main_call")}
    assert sorted((r["name"], r["line"], r["flat"], r["cum"]) for r in rows) == [
        ("inner_alloc", line["inner_malloc"], 100, 100),
        ("main", line["main_call"], 0, 100),
        ("outer_alloc", line["outer_call"], 0, 100)]
    assert ahead_paths() == []

    # The same table when nothing is started ahead (a fresh cache again).
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(dump.parent / "other-cache"))
    monkeypatch.setattr(ahead, "start_for_args", lambda args: None)
    assert top_rows(str(dump)) == rows
    assert taken == [str(program)]


def test_answers_after_the_priming_one_equal_a_fresh_run(dump: Path, program: Path) -> None:
    ahead.start_for_args([str(dump)])
    assert ahead_paths() == [str(program)]
    vaddrs = sorted(start + 1 for start, _ in functions(program).values())
    backend = LlvmSymbolizer()
    primed = backend.lookup(str(program), vaddrs)
    assert ahead_paths() == []
    fresh = backend.lookup(str(program), vaddrs)
    assert primed == fresh
    assert len(primed) == len(vaddrs)
    assert any(chain and chain[-1].function == "outer_alloc" for chain in primed)


def test_a_warm_cache_starts_nothing(dump: Path) -> None:
    top_rows(str(dump))
    ahead.start_for_args([str(dump)])
    assert ahead_paths() == []
    ahead.start_for_args(["--no-cache", str(dump)])  # no cache: every run is cold
    assert len(ahead_paths()) == 1


@pytest.mark.parametrize("args", [
    ["--binary", "{program}", "{dump}"],
    ["--search-path={dir}", "{dump}"],
    ["--sysroot", "/", "{dump}"],
    ["--debug-dir", "{dir}", "{dump}"],
    ["--force-symbols", "{dump}"],
    ["{dir}"],                       # a folder: its dumps are chosen by trust rules later
    ["{dump}.gz"],
    ["{dir}/no-such.heap"],
    ["--focus", "x"],
])
def test_nothing_started_when_options_or_inputs_decide_later(
        args: list[str], dump: Path, program: Path) -> None:
    gz = Path(f"{dump}.gz")
    shutil.copy(dump, gz)
    words = [a.format(program=program, dump=dump, dir=dump.parent) for a in args]
    ahead.start_for_args(words)
    assert ahead_paths() == []


def test_nothing_started_for_files_the_lookup_would_not_read(
        program: Path, tmp_path: Path) -> None:
    maps = mappings_for(program, EXE_BASE)
    start = EXE_BASE + min(s for s, _ in functions(program).values())
    no_map = tmp_path / "no-map.heap"
    no_map.write_text("heap_v2/0\n  t*: 1: 100 [0: 0]\n@ 0x1\n  t*: 1: 100 [0: 0]\n")
    deleted = write_dump(tmp_path / "deleted.heap", [[start]],
                         [m._replace(path=f"{m.path} (deleted)") for m in maps])
    other = write_dump(tmp_path / "other.heap", [[start]],  # a file without such segments
                       [m._replace(path="/bin/true", offset=m.offset + 0x40000000)
                        for m in maps])
    stripped = tmp_path / "stripped"
    shutil.copy(program, stripped)
    (tmp_path / "elsewhere").mkdir()
    split_debug(stripped, tmp_path / "elsewhere" / "stripped.debug")  # not where it is looked for
    bare = write_dump(tmp_path / "bare.heap", [[start]], mappings_for(stripped, EXE_BASE))
    garbage = tmp_path / "garbage.heap"
    garbage.write_bytes(b"\xff\x00" * 1000 + b"\nMAPPED_LIBRARIES:\n\xff\xfe garbage\n")
    for dump in (no_map, deleted, other, bare, garbage):
        ahead.start_for_args([str(dump)])
        assert ahead_paths() == [], dump.name
    # Beside the binary, the debug file is found (by .gnu_debuglink) and read ahead, as the
    # lookup will.
    shutil.move(tmp_path / "elsewhere" / "stripped.debug", tmp_path / "stripped.debug")
    ahead.start_for_args([str(bare)])
    assert ahead_paths() == [str(tmp_path / "stripped.debug")]


def test_a_process_nobody_takes_is_stopped(program: Path, tmp_path: Path) -> None:
    # The program is mapped but no stack passes through it: its lookup never comes.
    dump = write_dump(tmp_path / "jeprof.78.0.f.heap", [[0x1000]],
                      mappings_for(program, EXE_BASE))
    before = _children()
    ahead.start_for_args([str(dump)])
    assert len(_children()) == len(before) + 1
    rows = top_rows(str(dump))
    assert [r["flat"] for r in rows] == [100]
    assert ahead_paths() == []
    assert _children() == before


def _children() -> set[int]:
    """This process's live (not zombie) child processes."""
    out: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        # A thread of an earlier test may end between the listing and the open.
        with contextlib.suppress(FileNotFoundError), \
                open(f"/proc/self/task/{task}/children") as f:
            out.update(int(pid) for pid in f.read().split())
    live = set()
    for pid in out:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                live.add(pid)
    return live
