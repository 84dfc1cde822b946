"""Fail closed: when heapscope cannot look, it says so and the exit status says so too.

- no llvm-symbolizer: names come from the ELF symbol table (function, no line), one warning,
  and ``run --fail-on-leak`` still fails on the leak;
- dumps that cannot be read: the process is ``unreadable`` (exit 12), never ``clean``; a
  damaged dump in a series is left out with a note naming it; ``top`` on several dumps
  warns about the one it skipped.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

LEAK_EXIT, UNREADABLE_EXIT = 10, 12


def hs(*args: str, cache: Path, env: dict[str, str] | None = None,
       timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=cache, env=env, timeout=timeout, unprofiled=True)


@pytest.fixture(scope="module")
def slow_leak(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path) -> Path:
    if not shutil.which("gdb"):
        pytest.skip("gdb not installed: apt-get install gdb")
    prog = tmp_path_factory.mktemp("fail-closed") / "slow_leak"
    je.build([je.PROGRAMS_DIR / "slow_leak.c"], prog, ("-O1", "-g"))
    return prog


@pytest.fixture(scope="module")
def no_symbolizer_run(slow_leak: Path, tmp_path_factory: pytest.TempPathFactory
                      ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("nosym")
    s = root / "s"
    p = hs("run", "-o", str(s), "--sample", "4k", "--every", "0.25", "--fail-on-leak", "1M",
           "--", str(slow_leak), cache=root / "c",
           env={"HEAPSCOPE_SYMBOLIZER": str(root / "no-such-symbolizer")})
    return s, p


def test_missing_symbolizer_still_names_the_leak_and_fails(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    s, p = no_symbolizer_run
    assert p.returncode == LEAK_EXIT, p.stderr
    warnings = [ln for ln in p.stderr.splitlines() if "no-such-symbolizer" in ln]
    assert len(warnings) == 1 and "symbol table" in warnings[0], p.stderr
    first = json.loads((s / "report.json").read_text())["suspects"][0]
    # The function from the ELF symbol table; no line without DWARF.
    assert (first["function"], first["line"]) == ("slow_leak", 0), first
    assert first["verdict"] in ("leak", "growing"), first


def test_a_cache_entry_another_user_wrote_is_never_read(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]],
        tmp_path: Path) -> None:
    """Another local user plants entries in a shared cache folder: a symbol entry that
    renames the leak's function, and marshal files. None of them is read (a note says so);
    the names come from the binary again."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the planted files must belong to another user")
    s, _ = no_symbolizer_run
    dump = next((s / "dumps").glob("jeprof.*.f.heap"))
    cache = tmp_path / "c"
    first = hs("top", str(dump), cache=cache, timeout=120)
    assert first.returncode == 0 and "slow_leak" in first.stdout, first.stderr
    entries = [f for f in cache.rglob("*") if f.is_file()]
    symbols = [f for f in entries if f.suffix == ".json"]
    assert symbols, entries
    for f in entries:
        if f in symbols:
            f.write_text(f.read_text().replace("slow_leak", "cache_refill_expected"))
        os.chown(f, 65534, 65534)  # as if the user nobody had written them
    p = hs("top", str(dump), cache=cache, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "slow_leak" in p.stdout and "cache_refill_expected" not in p.stdout, p.stdout
    assert "note: ignored" in p.stderr and "another user" in p.stderr, p.stderr


def test_damaged_dumps_are_named_and_never_clean(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]],
        tmp_path: Path) -> None:
    s, _ = no_symbolizer_run
    folder = tmp_path / "dumps"
    shutil.copytree(s / "dumps", folder)
    series = sorted(folder.glob("jeprof.*.m*.heap"), key=lambda d: int(d.name.split(".")[2]))
    assert len(series) >= 4, series
    damaged = series[1]
    damaged.write_bytes(damaged.read_bytes()[:300])  # cut in the middle of a stack
    (folder / "jeprof.4242.0.f.heap").write_text("heap_v2/garbage\n")
    p = hs("leaks", "--format", "json", str(folder), cache=tmp_path / "c")
    assert p.returncode == UNREADABLE_EXIT, p.stderr
    assert "no dump of pid 4242 could be read" in p.stderr
    doc = json.loads(p.stdout)
    procs = {q["pid"]: q for q in doc["processes"]}
    assert procs[4242]["verdict"] == "unreadable", procs[4242]
    assert "bad first line" in procs[4242]["unreadable"]
    main = next(q for pid, q in procs.items() if pid != 4242)
    assert any(damaged.name in x for x in main["skipped_dumps"]), main
    assert any(damaged.name in n for n in doc["notes"]), doc["notes"]
    assert doc["suspects"][0]["function"] == "slow_leak"

    # top given several dumps: the damaged one is skipped with a warning naming it.
    top = hs("top", str(damaged), str(series[2]), cache=tmp_path / "c")
    assert top.returncode == 0, top.stderr
    assert f"skipped {damaged}" in top.stderr and "slow_leak" in top.stdout
    # ... and given only that one, it is a one-line error.
    alone = hs("top", str(damaged), cache=tmp_path / "c")
    assert alone.returncode == 3 and len(alone.stderr.strip().splitlines()) == 1, alone.stderr


def _build_variant(src: Path, out: Path, name: str) -> None:
    """slow_leak.c with its leaking function renamed: another build at the same path."""
    text = src.read_text().replace("slow_leak", name)
    variant = out.with_suffix(".c")
    variant.write_text(text)
    je.build([variant], out, ("-O1", "-g"))


def test_a_rebuilt_binary_never_names_an_old_dump(gcc: Path, libjemalloc: Path,
                                                  tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    je.build([je.PROGRAMS_DIR / "slow_leak.c"], prog, ("-O1", "-g"))
    s = tmp_path / "s"
    p = hs("run", "-o", str(s), "--sample", "4k", "--no-symbolize", "--", str(prog),
           cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    recorded = json.loads((s / "manifest.json").read_text())["modules"][str(prog)]
    assert set(recorded) == {"build_id", "size", "mtime_ns"} and recorded["build_id"]
    dump = next((s / "dumps").glob("jeprof.*.heap"))
    _build_variant(je.PROGRAMS_DIR / "slow_leak.c", prog, "renamed_leak")  # rebuilt since

    top = hs("top", "--format", "json", str(dump), cache=tmp_path / "c2")
    names = [r["name"] for r in json.loads(top.stdout)["rows"]]
    assert not any("renamed_leak" in n or "slow_leak" in n for n in names), names
    assert any(n.startswith("prog+0x") for n in names), names
    assert "build-id differs from the one recorded" in top.stderr, top.stderr
    forced = hs("top", "--format", "json", "--force-symbols", str(dump), cache=tmp_path / "c3")
    assert "renamed_leak" in [r["name"] for r in json.loads(forced.stdout)["rows"]]
    assert "used anyway (--force-symbols)" in forced.stderr


def _wait_running(exe: Path, timeout: float = 60) -> None:
    """Until a process runs ``exe`` (so replacing the file now replaces it under it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if os.readlink(d / "exe") == str(exe):
                        return
                except OSError:
                    continue
        time.sleep(0.02)
    raise AssertionError(f"{exe} did not start within {timeout} s")


def test_a_binary_replaced_while_running_is_not_trusted(gcc: Path, libjemalloc: Path,
                                                        tmp_path: Path) -> None:
    """The dump maps the program '(deleted)'; the file now at its path is another build and
    nothing recorded proves otherwise: its names are not used."""
    prog = tmp_path / "prog"
    je.build([je.PROGRAMS_DIR / "slow_leak.c"], prog, ("-O1", "-g"))
    other = tmp_path / "other"
    _build_variant(je.PROGRAMS_DIR / "slow_leak.c", other, "renamed_leak")
    s = tmp_path / "s"
    run = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "run", "-o", str(s), "--sample", "4k", "--no-symbolize", "--",
         str(prog)], env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_running(prog)  # the program runs about 3 s from then
    prog.unlink()
    shutil.copy(other, prog)  # replaced under the running process
    _, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    dump = next((s / "dumps").glob("jeprof.*.heap"))
    assert f"{prog} (deleted)" in dump.read_text(errors="replace")
    top = hs("top", "--format", "json", str(dump), cache=tmp_path / "c2")
    names = [r["name"] for r in json.loads(top.stdout)["rows"]]
    assert not any("renamed_leak" in n for n in names), names
    assert "was deleted or replaced while the process ran" in top.stderr, top.stderr


def _one_line_error(p: subprocess.CompletedProcess[str], path: Path, problem: str) -> None:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 3 and len(lines) == 1, p.stderr
    assert lines[0].startswith(f"heapscope: error: {path}: ") and problem in lines[0], lines


def test_hostile_numbers_are_one_line_errors(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]],
        tmp_path: Path) -> None:
    s, _ = no_symbolizer_run
    text = next((s / "dumps").glob("jeprof.*.f.heap")).read_text()
    cases = {
        "period": ("heap_v2/" + "9" * 5000 + "\n" + text.split("\n", 1)[1], "too large"),
        "thread": (text.replace("  t*:", "  t" + "7" * 5000 + ":", 1), "too large"),
        "count": (text.replace("  t*: ", "  t*: 1" + "0" * 400 + " ", 2), "too large"),
    }
    for name, (body, problem) in cases.items():
        path = tmp_path / f"{name}.heap"
        path.write_text(body)
        for cmd in (["top"], ["flamegraph", "-o", str(tmp_path / f"{name}.html")],
                    ["export", "--format", "pprof", "-o", str(tmp_path / f"{name}.pb.gz")]):
            _one_line_error(hs(cmd[0], str(path), *cmd[1:], cache=tmp_path / "c"), path,
                            problem)


def test_damaged_json_profiles_are_one_line_errors(tmp_path: Path) -> None:
    base = {"format": "heapscope-profile", "version": 1, "meta": {"period": 1},
            "mappings": [], "threads": [], "locations": [], "samples": []}
    bodies = {
        "types": json.dumps(dict(base, samples=[["x", "y", 3]])),
        "index": json.dumps(dict(base, locations=[[1, "m", 0, 5, [["f"]]]])),
        "nan": json.dumps(dict(base, samples=[[[1], ["NaN", 1, 1, 1], []]])),
        "deep": '{"format": "heapscope-profile", "samples": ' + "[" * 100000 + "]" * 100000
                + "}",
    }
    for name, body in bodies.items():
        path = tmp_path / f"{name}.heap.json.gz"
        path.write_bytes(gzip.compress(body.encode()))
        _one_line_error(hs("top", str(path), cache=tmp_path / "c"), path, "damaged")


def test_a_fifo_in_the_memory_map_does_not_hang(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]],
        tmp_path: Path) -> None:
    s, _ = no_symbolizer_run
    dump = next((s / "dumps").glob("jeprof.*.f.heap"))
    exe = next(ln.split()[-1] for ln in dump.read_text().splitlines() if ln.endswith("slow_leak"))
    fifo = tmp_path / "fifo_program"
    os.mkfifo(fifo)
    hostile = tmp_path / "fifo.heap"
    hostile.write_text(dump.read_text().replace(exe, str(fifo)))
    for cmd in (["top"], ["export", "--format", "pprof", "-o", str(tmp_path / "o.pb.gz")],
                ["flamegraph", "-o", str(tmp_path / "f.html")]):
        p = hs(cmd[0], str(hostile), *cmd[1:], cache=tmp_path / "c", timeout=60)
        assert p.returncode == 0, p.stderr
    # A FIFO given as the dump itself is refused at once, not waited on.
    p = hs("top", str(fifo), cache=tmp_path / "c", timeout=60)
    _one_line_error(p, fifo, "not a regular file")


def test_a_fifo_named_like_a_dump_hangs_no_command(tmp_path: Path) -> None:
    """A FIFO called x.heap: every command that reads dumps refuses it at once with one
    line (the symbolizer's early start used to open it before the guarded reader)."""
    fifo = tmp_path / "x.heap"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    for cmd in (["top", str(fifo)], ["leaks", str(fifo)], ["diff", str(fifo), str(fifo)],
                ["graph", str(fifo), "-o", str(out / "g.svg")],
                ["export", str(fifo), "--format", "pprof", "-o", str(out / "p.pb.gz")],
                ["flamegraph", str(fifo), "-o", str(out / "f.html")]):
        p = hs(*cmd, cache=tmp_path / "c", timeout=60)
        _one_line_error(p, fifo, "not a regular file")


def test_a_dump_with_nothing_in_it_is_not_a_silent_zero(tmp_path: Path) -> None:
    """A header line and nothing else (no total, no records, no memory map): top still
    answers, and warns that its total of 0 says nothing."""
    empty = tmp_path / "jeprof.1.0.f.heap"
    empty.write_text("heap_v2/524288\n")
    p = hs("top", str(empty), cache=tmp_path / "c", timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"warning: {empty}: the dump holds no records" in p.stderr, p.stderr


def test_pprof_export_of_numbers_that_do_not_fit_is_one_line(tmp_path: Path) -> None:
    """A 17-hex-digit address, and counts whose unsampled estimate passes 2^63: pprof's
    fields cannot hold them, and export says so in one line (it raised ValueError)."""
    maps = ("\nMAPPED_LIBRARIES:\n"
            "00400000-00401000 r-xp 00000000 00:00 0   /nonexistent/prog\n")
    cases = {
        "address": ("heap_v2/524288\n  t*: 1: 64 [0: 0]\n@ 0x1234567890abcdef1 0x400100\n"
                    "  t*: 1: 64 [0: 0]\n" + maps, "does not fit in pprof's 64 bits"),
        "value": ("heap_v2/524288\n  t*: 9999999999999999999: 9999999999999999999 [0: 0]\n"
                  "@ 0x400100\n  t*: 9999999999999999999: 9999999999999999999 [0: 0]\n"
                  + maps, "does not fit in pprof's 64-bit signed values"),
    }
    for name, (text, problem) in cases.items():
        dump = tmp_path / f"jeprof.1.0.{name}.heap"
        dump.write_text(text)
        out = tmp_path / f"{name}.pb.gz"
        p = hs("export", str(dump), "--format", "pprof", "-o", str(out), cache=tmp_path / "c",
               timeout=60)
        # (a warning may come first: the dump names a program that is not on this machine)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
        assert last.startswith(f"heapscope: error: {dump}: ") and problem in last, last
        assert not out.exists()


def test_escape_sequences_in_a_dump_never_reach_the_terminal(tmp_path: Path) -> None:
    """A memory map naming a file with a window-title sequence, a bell and a right-to-left
    override: the warning that names it shows them as escapes."""
    evil = "/nonexistent/\x1b]0;owned\x07\u202eprog"
    dump = tmp_path / "jeprof.1.0.f.heap"
    dump.write_text("heap_v2/524288\n  t*: 1: 64 [0: 0]\n@ 0x400100\n  t*: 1: 64 [0: 0]\n"
                    "\nMAPPED_LIBRARIES:\n"
                    f"00400000-00401000 r-xp 00000000 00:00 0   {evil}\n")
    p = hs("top", str(dump), cache=tmp_path / "c", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "\\x1b]0;owned\\x07\\u202eprog" in p.stderr, p.stderr
    raw = [c for c in p.stderr + p.stdout if c in "\x1b\x07\u202e"]
    assert not raw, repr(p.stderr)


def test_a_gzip_bomb_is_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.heap.gz"
    bomb.write_bytes(gzip.compress(b"heap_v2/524288\n" + b" " * (64 << 20)))
    p = hs("top", str(bomb), cache=tmp_path / "c", env={"HEAPSCOPE_MAX_INPUT": str(1 << 20)})
    _one_line_error(p, bomb, "HEAPSCOPE_MAX_INPUT")


def _peak_rss_mb(*args: str, env: dict[str, str] | None = None
                 ) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run heapscope in a fresh parent that reports its one child's peak RSS (MiB)."""
    wrapper = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "sys.stderr.write(p.stderr); sys.stdout.write(p.stdout)\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
               "sys.exit(p.returncode)\n")
    full = [sys.executable, "-c", wrapper, *je.HEAPSCOPE_CMD, *args]
    env_all = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    q = subprocess.run(full, env={**env_all, **(env or {})}, capture_output=True, text=True,
                       timeout=600)
    *rest, peak = q.stderr.strip().splitlines()
    q.stderr = "\n".join(rest)
    assert "Traceback" not in q.stderr, q.stderr
    return int(peak) / 1024, q


_RECORD = b"heap_v2/524288\n  t*: 1: 64 [0: 0]\n@ 0x400100\n  t*: 1: 64 [0: 0]\n"
_MAPS = b"\nMAPPED_LIBRARIES:\n00400000-00401000 r-xp 00000000 00:00 0 /bin/true\n"


def _gzip_of_newlines(path: Path, mib: int) -> None:
    """A gzip member: a dump's record, ``mib`` MiB of newlines, its memory map."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with path.open("wb") as f:
        f.write(c.compress(_RECORD))
        block = b"\n" * (1 << 20)
        for _ in range(mib):
            f.write(c.compress(block))
        f.write(c.compress(_MAPS) + c.flush())


def test_blank_lines_cost_no_memory(tmp_path: Path) -> None:
    """256 MiB of blank lines (a 256 KB gzip) inside a valid dump: read in bounded memory
    (it once took 9 bytes per input byte: 2.3 GB here) and reported as the one record."""
    dump = tmp_path / "blank.heap.gz"
    _gzip_of_newlines(dump, 256)
    peak, p = _peak_rss_mb("top", "--format", "json", "--show-bytes", str(dump),
                           env={"HEAPSCOPE_CACHE_DIR": str(tmp_path / "c")})
    assert p.returncode == 0, p.stderr
    assert float(json.loads(p.stdout)["total"]) == pytest.approx(64 / (1 - math.exp(-64 / 524288)))
    assert peak < 100, f"peak RSS {peak:.0f} MiB for 256 MiB of blank lines"


def test_a_gzip_past_the_default_limit_is_refused_early(tmp_path: Path) -> None:
    """600 MiB of newlines (a 600 KB gzip) expands past the default 512 MiB: refused with a
    one-line error before it is held (the limit was 4 GiB: a 3 MB gzip took 24 GB)."""
    dump = tmp_path / "big.heap.gz"
    _gzip_of_newlines(dump, 600)
    peak, p = _peak_rss_mb("top", str(dump), env={"HEAPSCOPE_CACHE_DIR": str(tmp_path / "c")})
    _one_line_error(p, dump, "expands to more than 536870912 bytes (HEAPSCOPE_MAX_INPUT")
    assert peak < 100, f"peak RSS {peak:.0f} MiB"


def test_line_numbers_after_blank_lines(tmp_path: Path) -> None:
    """A bad line after one blank line keeps its true number; after a run of blank lines
    the error says how it counts."""
    one = tmp_path / "one.heap"
    one.write_bytes(_RECORD + b"\n@ 0xzz\n")
    _one_line_error(hs("top", str(one), cache=tmp_path / "c"), one,
                    "line 6: bad address '0xzz' in stack")
    run = tmp_path / "run.heap"
    run.write_bytes(_RECORD + b"\n \n\t\n\n@ 0xzz\n")
    _one_line_error(hs("top", str(run), cache=tmp_path / "c"), run,
                    "line 6: bad address '0xzz' in stack (counting each run of blank lines "
                    "as one line)")


def _heapscope_total(path: Path, cache: Path) -> tuple[float, str]:
    p = hs("top", "--format", "json", "--show-bytes", str(path), cache=cache)
    assert p.returncode == 0, p.stderr
    return float(json.loads(p.stdout)["total"]), p.stderr


def _go_pprof_space(path: Path) -> float:
    """The space total ``go tool pprof -raw`` reads from a legacy heap profile."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found (go tool pprof is the reference): apt-get install golang-go")
    out = subprocess.run([go, "tool", "pprof", "-raw", str(path)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    samples = out.split("Samples:", 1)[1].split("Locations", 1)[0]
    return float(sum(int(m.group(1)) for m in re.finditer(r"^\s*\d+\s+(\d+):", samples,
                                                          re.M)))


def test_other_projects_files_read_like_jeprof_and_pprof(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]], jeprof: Path,
        tmp_path: Path) -> None:
    """Files jeprof or pprof read that heapscope used to refuse: totals equal theirs."""
    s, _ = no_symbolizer_run
    real = next((s / "dumps").glob("jeprof.*.f.heap")).read_text()
    # heap_v2 with no MAPPED_LIBRARIES section (as some projects keep their fixtures).
    no_maps = tmp_path / "no_maps.heap"
    no_maps.write_text(real.split("MAPPED_LIBRARIES:")[0])
    # gperftools' legacy header and records with spaces inside the brackets.
    spaced = tmp_path / "spaced.heap"
    spaced.write_text("heap profile:    3:  3072 [  3:  3072 ] @ heap_v2/524288\n"
                      "     2:  2048 [   2:  2048 ] @ 0x401000 0x401100\n"
                      "     1:  1024 [   1:  1024 ] @ 0x401200\n\nMAPPED_LIBRARIES:\n")
    ours, err = _heapscope_total(no_maps, tmp_path / "c")
    theirs = je.jeprof_totals("/bin/true", no_maps)["inuse_space"]
    assert ours == pytest.approx(theirs, rel=1e-6, abs=2), (ours, theirs)
    assert "no memory map" in err
    # jeprof reads nothing from the spaced brackets (it prints no total); pprof reads them.
    ours, _ = _heapscope_total(spaced, tmp_path / "c")
    assert ours == pytest.approx(_go_pprof_space(spaced), rel=1e-6, abs=2)


def test_a_pprof_given_as_a_dump_is_named(
        no_symbolizer_run: tuple[Path, subprocess.CompletedProcess[str]],
        tmp_path: Path) -> None:
    s, _ = no_symbolizer_run
    out = tmp_path / "heap.pb.gz"
    assert hs("export", str(s), "--format", "pprof", "-o", str(out),
              cache=tmp_path / "c").returncode == 0
    _one_line_error(hs("top", str(out), cache=tmp_path / "c"), out, "a pprof profile")


def test_a_go_heap_profile_reads_like_go_tool_pprof(tmp_path: Path) -> None:
    """Go's debug=1 heap profile: '#' frame lines name the code, Go's sampling is unsampled
    the way pprof does, and the total equals go tool pprof's on the same file."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found: apt-get install golang-go")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(je.PROGRAMS_DIR / "goheap.go", src / "main.go")
    (src / "go.mod").write_text("module goheap\n\ngo 1.19\n")
    env = dict(os.environ, GOCACHE=str(tmp_path / "gocache"), GOPATH=str(tmp_path / "gopath"),
               GOFLAGS="-mod=mod", CGO_ENABLED="0")
    subprocess.run([go, "build", "-o", str(tmp_path / "goheap"), "."], cwd=src, env=env,
                   check=True, timeout=600, capture_output=True)
    profile = tmp_path / "heap.txt"
    subprocess.run([str(tmp_path / "goheap"), str(profile)], check=True, timeout=60,
                   capture_output=True)
    assert "# runtime.MemStats" in profile.read_text()
    p = hs("top", "--format", "json", "--show-bytes", str(profile), cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    theirs = _go_pprof_space_v2(go, profile)
    # pprof rounds each sample to whole bytes: at most 1 B apart per sample.
    assert doc["total"] == pytest.approx(theirs, abs=64), (doc["total"], theirs)
    lines = hs("top", "--format", "json", "--lines", str(profile), cache=tmp_path / "c")
    first = max(json.loads(lines.stdout)["rows"], key=lambda r: r["flat"])
    assert (first["name"], first["line"]) == (
        "main.leak", je.source_line(je.PROGRAMS_DIR / "goheap.go", "go")), first
    assert first["file"] == str(src / "main.go"), first


def _go_pprof_space_v2(go: str, path: Path) -> float:
    """The in-use bytes ``go tool pprof -raw`` reads: its "inuse_space" column, or "space"
    when pprof folds the in-use and allocated pairs (equal in every record) into one."""
    out = subprocess.run([go, "tool", "pprof", "-raw", str(path)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    lines = out.split("Samples:", 1)[1].split("Locations", 1)[0].strip().splitlines()
    names = [n.split("/")[0] for n in lines[0].split()]
    col = names.index("inuse_space") if "inuse_space" in names else names.index("space")
    return float(sum(int(ln.split(":")[0].split()[col]) for ln in lines[1:]
                     if re.match(r"^\s*\d", ln)))


# ------------------------------------------------------------------------------------------
# A worker that drops privileges by itself (nginx, Apache, postfix, php-fpm)


@pytest.fixture(scope="module")
def dropuser(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root: the worker switches to the user nobody, as a daemon does")
    prog = tmp_path_factory.mktemp("dropuser") / "dropuser"
    je.build([je.PROGRAMS_DIR / "dropuser.c"], prog, ("-O1", "-g"))
    return prog


def _processes(session: Path) -> dict[int, dict[str, object]]:
    doc = json.loads((session / "report.json").read_text())
    return {p["pid"]: p for p in doc["processes"]}


def test_a_worker_that_switches_user_is_dumped_and_judged(dropuser: Path,
                                                          tmp_path: Path) -> None:
    """Run as root, the master forks a worker that becomes nobody and leaks 64 KiB every
    50 ms: it cannot write the session's dumps folder, yet it gets a series of its own
    (through a folder nobody owns) and its leak is found; nothing is left unexamined."""
    s = tmp_path / "s"
    # 64 KiB sampling: ~6 samples of the leak a dump. At the default 512 KiB it gets ~1.2,
    # below the power the verdicts state for 10 dumps (it read `growing` once in a while).
    p = hs("run", "-o", str(s), "--sample", "64k", "--every", "0.5", "--fail-on-leak", "--",
           str(dropuser), "5", cache=tmp_path / "c")
    assert p.returncode == LEAK_EXIT, p.stderr
    procs = _processes(s)
    assert len(procs) == 2 and all(pr["examined"] for pr in procs.values()), procs
    (worker,) = [pr for pr in procs.values() if pr["role"] == "child"]
    doc = json.loads((s / "report.json").read_text())
    why = {k: worker.get(k) for k in ("judged_dumps", "verdict", "rounds", "missed_rounds",
                                      "missed_why", "via")}
    assert worker["judged_dumps"] >= 4 and worker["verdict"] == "leaks", \
        (why, doc["suspects"][:2], p.stderr[-2000:])
    assert doc["suspects"][0]["function"] == "worker_leak", doc["suspects"][0]
    assert doc["suspects"][0]["pid"] == worker["pid"]
    # its dumps were copied into dumps/, root's and 0600 like the others
    mine = sorted((s / "dumps").glob(f"jeprof.{worker['pid']}.*.heap"))
    assert len(mine) >= 5 and all(d.stat().st_uid == 0 and d.stat().st_mode & 0o077 == 0
                                  for d in mine), mine


def test_a_worker_left_without_dumps_is_named_and_fails_the_gate(dropuser: Path,
                                                                 tmp_path: Path) -> None:
    """Without the helper (--no-helper) nothing gives the worker a folder it can write:
    the report says it was not examined, never "no leak found", and --fail-on-leak exits
    12 although the process that was examined is clean."""
    s = tmp_path / "s"
    p = hs("run", "-o", str(s), "--no-helper", "--every", "0.5", "--fail-on-leak", "--",
           str(dropuser), "3", cache=tmp_path / "c")
    assert p.returncode == UNREADABLE_EXIT, p.stderr
    procs = _processes(s)
    (worker,) = [pr for pr in procs.values() if pr["role"] == "child"]
    assert worker["examined"] is False and worker["dumps"] == 0, worker
    assert "could not write" in str(worker["why_no_dumps"]), worker
    assert "1 of 2 processes not examined" in p.stderr, p.stderr
    assert f"pid {worker['pid']}" in p.stderr and "\nno leak found" not in p.stderr, p.stderr
    assert "left no dump to examine" in p.stderr, p.stderr
