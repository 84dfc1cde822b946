"""``heapscope export`` on real programs run under Debian's jemalloc: the pprof file read by
``go tool pprof`` (same totals and top functions as ``heapscope top``), Parca's rules, build-ids
and addresses a backend can re-symbolize; callgrind read by ``callgrind_annotate``; collapsed
stacks that add up to the total; the JSON model."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jemalloc as je
import pytest

from heapscope.formats.pprof import decode_profile

pytestmark = pytest.mark.e2e

CMD = [sys.executable, "-m", "heapscope.cli.main"]
SAMPLES = ("inuse_space", "inuse_objects", "alloc_space", "alloc_objects")


def _unit_helpers() -> ModuleType:
    """tests/unit/test_export.py (the Parca validator lives there)."""
    path = Path(__file__).parent.parent / "unit" / "test_export.py"
    spec = importlib.util.spec_from_file_location("tests.unit.test_export", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tests.unit.test_export", mod)
    spec.loader.exec_module(mod)
    return mod


UNIT = _unit_helpers()


@pytest.fixture(scope="session")
def go() -> str:
    path = shutil.which("go")
    if path is None:
        pytest.skip("go not found (go tool pprof reads the pprof export): "
                    "apt-get install golang-go")
    return path


@pytest.fixture(scope="session")
def callgrind_annotate() -> str:
    path = shutil.which("callgrind_annotate")
    if path is None:
        pytest.skip("callgrind_annotate not found: apt-get install valgrind")
    return path


def heapscope(*args: str, cache: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=cache, check=check)


def export(dump: Path, out: Path, fmt: str, *args: str, cache: Path) -> Path:
    heapscope("export", "--format", fmt, "-o", str(out), *args, str(dump), cache=cache)
    return out


def top_json(dump: Path, sample: str, cache: Path) -> dict[str, Any]:
    # Exports keep whole stacks (pprof and the other readers attribute to the leaf): compare
    # with top's raw view, not its sites.
    out = heapscope("top", "--format", "json", "-n", "0", "--frames", "raw",
                    "--" + sample.replace("_", "-"), str(dump), cache=cache)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


_ROW = re.compile(r"^\s*(-?[\d.]+)B?\s+[\d.]+%\s+[\d.]+%\s+(-?[\d.]+)B?\s+[\d.]+%\s+(.+?)\s*$")


def pprof_top(go: str, path: Path, sample: str) -> tuple[float, dict[str, float]]:
    """``go tool pprof -top``: the total and the flat value per function name."""
    p = subprocess.run(
        [go, "tool", "pprof", "-top", "-unit=B", "-nodefraction=0", "-nodecount=0",
         "-symbolize=none", f"-sample_index={sample}", str(path)],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    m = re.search(r"of (-?[\d.]+)B? total", p.stdout)
    assert m, p.stdout
    total = float(m.group(1))
    flat: dict[str, float] = {}
    for line in p.stdout.splitlines():
        row = _ROW.match(line)
        if row:
            name = row.group(3).removesuffix(" (inline)")
            flat[name] = flat.get(name, 0.0) + float(row.group(1))
    return total, flat


PROGRAMS = ("leaky_c", "leaky_c_sampled", "leaky_cpp")


@pytest.mark.parametrize("program", PROGRAMS)
def test_go_tool_pprof_reads_it_with_our_totals_and_top(
    program: str, request: pytest.FixtureRequest, go: str, cache_dir: Path, tmp_path: Path
) -> None:
    prog = request.getfixturevalue(program)
    out = export(prog.dump, tmp_path / "heap.pb.gz", "pprof", cache=cache_dir)
    n_samples = len(decode_profile(out.read_bytes())["sample"])
    for sample in SAMPLES:
        ours = top_json(prog.dump, sample, cache_dir)
        total, flat = pprof_top(go, out, sample)
        # Values are rounded to integers per stack: at most 0.5 per sample apart.
        assert total == pytest.approx(ours["total"], abs=n_samples / 2 + 1), sample
        if not ours["total"]:
            continue
        named = [r for r in ours["rows"] if r["flat"] and "+0x" not in r["name"]]
        assert named
        for r in named:
            assert r["name"] in flat, f"{sample}: {r['name']} missing from {sorted(flat)}"
            assert flat[r["name"]] == pytest.approx(r["flat"], abs=n_samples / 2 + 1)
        top_ours = [r["name"] for r in named[:5]]
        top_theirs = sorted((n for n in flat if n in {r["name"] for r in named}),
                            key=lambda n: -flat[n])[:5]
        assert set(top_ours) == set(top_theirs), sample


def test_pprof_structure_build_ids_and_addresses(leaky_c: Any, cache_dir: Path,
                                                 tmp_path: Path) -> None:
    out = export(leaky_c.dump, tmp_path / "heap.pb.gz", "pprof", cache=cache_dir)
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    prof = decode_profile(raw)
    assert UNIT.parca_problems(prof) == []
    s = prof["string_table"]
    assert [s[v["type"]] for v in prof["sample_type"]] == [
        "alloc_objects", "alloc_space", "inuse_objects", "inuse_space"]
    assert prof["period"] == 1  # lg_prof_sample:0
    maps = prof["mapping"]
    assert s[maps[0]["filename"]] == str(leaky_c.binary)
    assert s[maps[0]["build_id"]] == _readelf_build_id(leaky_c.binary) != ""
    helper = next(m for m in maps if s[m["filename"]].endswith("libhelper.so"))
    assert not helper["has_functions"]  # its static function is left for a backend
    assert maps[0]["has_functions"]  # every address of the program is named (_start has
    # no line information, so has_filenames/has_line_numbers stay false there)

    # Every symbolized location's address, put through pprof's normalisation against the ELF
    # file, is the address heapscope symbolized (so a backend re-symbolizes the same code).
    js = export(leaky_c.dump, tmp_path / "heap.json", "json", cache=cache_dir)
    model = json.loads(js.read_text())
    offsets = {loc["address"]: loc for loc in model["locations"]}
    checked = 0
    loads: dict[str, list[tuple[int, int, int]]] = {}
    for loc in prof["location"]:
        if not loc["mapping_id"]:
            continue
        m = maps[loc["mapping_id"] - 1]
        path = s[m["filename"]]
        ours = offsets[loc["address"] + 1]
        assert m["memory_start"] <= loc["address"] < m["memory_limit"]
        if not ours["frames"]:
            continue
        # pprof's rule, with the program headers as readelf prints them: the address's file
        # offset, then the virtual address of the PT_LOAD segment that loads that offset.
        segs = loads.setdefault(path, _readelf_loads(path))
        file_offset = loc["address"] - m["memory_start"] + m["file_offset"]
        vaddr = next(v + file_offset - o for o, v, size in segs if o <= file_offset < o + size)
        assert vaddr == ours["offset"], path
        checked += 1
    assert checked > 10

    # Functions: inlined frames are several lines of one location, innermost first.
    fname = {f["id"]: s[f["name"]] for f in prof["function"]}
    chains = [[fname[ln["function_id"]] for ln in loc["line"]] for loc in prof["location"]]
    assert ["inline_alloc", "via_inline"] in chains


def _readelf_build_id(path: Path | str) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    return m.group(1) if m else ""


def _readelf_loads(path: str) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, file size) of each PT_LOAD, from ``readelf -lW``."""
    out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True,
                         check=True).stdout
    return [(int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))
            for m in re.finditer(r"^\s*LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+"
                                 r"0x([0-9a-f]+)", out, re.M)]


def test_pprof_thread_labels(leaky_c: Any, cache_dir: Path, tmp_path: Path) -> None:
    out = export(leaky_c.dump, tmp_path / "t.pb.gz", "pprof", "--thread-labels", cache=cache_dir)
    prof = decode_profile(out.read_bytes())
    assert UNIT.parca_problems(prof) == []
    s = prof["string_table"]
    names = {s[lb["str"]] for sm in prof["sample"] for lb in sm["label"]
             if s[lb["key"]] == "thread"}
    assert {"leaky-main", "leaky-worker"} <= names


def test_collapsed_sums_to_the_total(leaky_c_sampled: Any, cache_dir: Path,
                                     tmp_path: Path) -> None:
    for sample in ("inuse_space", "alloc_objects"):
        out = export(leaky_c_sampled.dump, tmp_path / f"{sample}.folded", "collapsed",
                     "--" + sample.replace("_", "-"), cache=cache_dir)
        lines = out.read_text().splitlines()
        assert lines == sorted(lines) and len(set(lines)) == len(lines)
        total = 0
        stacks = set()
        for line in lines:
            stack, _, value = line.rpartition(" ")
            total += int(value)
            assert stack not in stacks
            stacks.add(stack)
            assert "<" not in stack and "\t" not in stack
        expected = top_json(leaky_c_sampled.dump, sample, cache_dir)["total"]
        assert total == pytest.approx(expected, abs=len(lines) / 2 + 1)
    inuse = (tmp_path / "inuse_space.folded").read_text()
    assert re.search(r"^.*;main;via_inline;inline_alloc \d+$", inuse, re.M)
    assert re.search(r";helper_public_a;libhelper\.so\+0x[0-9a-f]+ \d+$", inuse, re.M)


def test_collapsed_to_stdout(leaky_cpp: Any, cache_dir: Path) -> None:
    p = heapscope("export", "--format", "collapsed", "-o", "-", str(leaky_cpp.dump),
                  cache=cache_dir)
    total = sum(int(line.rpartition(" ")[2]) for line in p.stdout.splitlines())
    assert total == pytest.approx(top_json(leaky_cpp.dump, "inuse_space", cache_dir)["total"],
                                  abs=len(p.stdout.splitlines()))


def test_callgrind_annotate_reads_it(leaky_cpp: Any, callgrind_annotate: str,
                                     cache_dir: Path, tmp_path: Path) -> None:
    out = export(leaky_cpp.dump, tmp_path / "callgrind.out.heap", "callgrind", cache=cache_dir)
    text = out.read_text()
    summary = int(re.search(r"^summary: (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    expected = top_json(leaky_cpp.dump, "inuse_space", cache_dir)["total"]
    assert summary == pytest.approx(expected, abs=100)
    p = subprocess.run([callgrind_annotate, "--inclusive=yes", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    m = re.search(r"^\s*([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", p.stdout, re.M)
    assert m, p.stdout
    assert int(m.group(1).replace(",", "")) == summary
    assert re.search(r"\bmain \[", p.stdout), p.stdout


def test_json_model(leaky_c: Any, cache_dir: Path, tmp_path: Path) -> None:
    out = export(leaky_c.dump, tmp_path / "p.json", "json", cache=cache_dir)
    d = json.loads(out.read_text())
    assert d["meta"]["format"] == "heapscope-profile"
    total = sum(s["values"]["inuse_space"] for s in d["samples"])
    assert total == pytest.approx(top_json(leaky_c.dump, "inuse_space", cache_dir)["total"])
    assert any(s["stack"][:2] == ["inline_alloc", "via_inline"] for s in d["samples"])
    names = {t["name"]: t["id"] for t in d["meta"]["threads"]}
    worker = names["leaky-worker"]
    per_thread = sum(t["values"]["inuse_space"] for s in d["samples"]
                     for t in s.get("threads", ()) if t["id"] == worker)
    site = next(s for s in je.LEAKY_C_SITES if s.function == "worker_alloc")
    assert per_thread == pytest.approx(site.bytes, rel=0.01)


def test_errors_are_one_line(leaky_c: Any, cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.pb.gz"
    out.write_bytes(b"precious")
    p = heapscope("export", "-o", str(out), str(leaky_c.dump), cache=cache_dir, check=False)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and "--force" in p.stderr
    assert out.read_bytes() == b"precious"
    heapscope("export", "-o", str(out), "--force", str(leaky_c.dump), cache=cache_dir)
    assert decode_profile(out.read_bytes())["sample"]
    p = heapscope("export", "--format", "dot", "-o", str(tmp_path / "y"), str(leaky_c.dump),
                  cache=cache_dir, check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown format" in p.stderr
    p = heapscope("export", "-o", str(tmp_path / "z.pb.gz"), str(leaky_c.dump),
                  str(leaky_c.dump), cache=cache_dir, check=False)
    assert p.returncode == 2 and "--merge" in p.stderr
