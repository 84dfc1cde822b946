"""``heapscope top`` on real programs run under Debian's jemalloc, checked against the truth
of each program and against jeprof on the same dumps."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e


def heapscope(*args: str, cache: Path | None = None, stdin: str | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=cache, stdin=stdin, check=check)


def top_json(dump: Path, *args: str, cache: Path | None = None) -> dict[str, Any]:
    out = heapscope("top", "--format", "json", "-n", "0", *args, str(dump), cache=cache)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def rows_by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in data["rows"]}


def test_every_leak_site_named_with_exact_bytes(leaky_c: Any, cache_dir: Path) -> None:
    rows = rows_by_name(top_json(leaky_c.dump, cache=cache_dir))
    for site in je.LEAKY_C_SITES:
        if not site.function:
            continue
        assert site.function in rows, f"{site.function} missing from {sorted(rows)}"
        assert rows[site.function]["flat"] == pytest.approx(site.bytes, rel=1e-6)
        assert rows[site.caller]["cum"] >= site.bytes


def test_static_function_in_stripped_library_is_not_misnamed(leaky_c: Any,
                                                             cache_dir: Path) -> None:
    site = next(s for s in je.LEAKY_C_SITES if s.module == "libhelper.so")
    rows = top_json(leaky_c.dump, cache=cache_dir)["rows"]
    helper = [r for r in rows if r["name"].startswith("libhelper.so+0x")]
    assert len(helper) == 1
    assert helper[0]["flat"] == pytest.approx(site.bytes, rel=1e-6)
    flat_named = {r["name"] for r in rows if r["flat"] > 0}
    assert not flat_named & set(je.LIBHELPER_EXPORTS)
    public_a = next(r for r in rows if r["name"] == "helper_public_a")
    assert public_a["cum"] == pytest.approx(site.bytes, rel=1e-6)


def test_allocator_frames_pruned(leaky_c: Any, cache_dir: Path) -> None:
    rows = top_json(leaky_c.dump, cache=cache_dir)["rows"]
    for r in rows:
        assert "jemalloc" not in r["module"], r
        assert not re.match(r"^(malloc|calloc|strdup|__GI___strdup|prof_|je_|imalloc)", r["name"])


def test_total_matches_truth(leaky_c: Any, cache_dir: Path) -> None:
    data = top_json(leaky_c.dump, cache=cache_dir)
    extra = data["total"] - je.LEAKY_C_INUSE_BYTES
    assert 0 <= extra <= je.RUNTIME_EXTRA_BYTES_MAX
    objs = top_json(leaky_c.dump, "--inuse-objects", cache=cache_dir)["total"]
    assert 0 <= objs - je.LEAKY_C_INUSE_OBJECTS <= je.RUNTIME_EXTRA_OBJECTS_MAX
    alloc = top_json(leaky_c.dump, "--alloc-space", cache=cache_dir)["total"]
    assert 0 <= alloc - je.LEAKY_C_ALLOC_BYTES <= je.RUNTIME_EXTRA_BYTES_MAX


def test_lines_and_inline_frames(leaky_c: Any, cache_dir: Path) -> None:
    rows = top_json(leaky_c.dump, "--lines", cache=cache_dir)["rows"]
    src = leaky_c.source
    for tag, fn in (("small", "leak_small"), ("inline", "inline_alloc"), ("big", "leak_big")):
        line = je.source_line(src, tag)
        hits = [r for r in rows if r["name"] == fn and r["flat"] > 0]
        assert hits, f"no flat row for {fn}"
        assert hits[0]["file"].endswith("leaky.c")
        assert hits[0]["line"] == line
    text = heapscope("top", "--lines", "-n", "0", str(leaky_c.dump), cache=cache_dir).stdout
    assert re.search(r"inline_alloc \(inline\) \S*leaky\.c:\d+", text)


@pytest.mark.parametrize("metric", je.JEPROF_METRICS)
def test_totals_equal_jeprofs(leaky_c_sampled: Any, jeprof: Path, metric: str,
                              cache_dir: Path) -> None:
    expected = _jeprof_totals(leaky_c_sampled)[metric]
    ours = top_json(leaky_c_sampled.dump, "--" + metric.replace("_", "-"),
                    cache=cache_dir)["total"]
    if metric.endswith("objects"):
        assert int(ours) == pytest.approx(expected, abs=1)
    else:
        assert ours == pytest.approx(expected, abs=1.0)


_JEPROF: dict[Path, dict[str, float]] = {}


def _jeprof_totals(prog: Any) -> dict[str, float]:
    if prog.dump not in _JEPROF:
        _JEPROF[prog.dump] = je.jeprof_totals(prog.binary, prog.dump)
    return _JEPROF[prog.dump]


def test_text_layout_matches_jeprof(leaky_c_sampled: Any, jeprof: Path, cache_dir: Path) -> None:
    ours = heapscope("top", "--show-bytes", str(leaky_c_sampled.dump), cache=cache_dir).stdout
    theirs = je.jeprof_text(leaky_c_sampled.binary, leaky_c_sampled.dump, ["--show_bytes"])
    assert ours.splitlines()[0] == next(x for x in theirs.splitlines() if x.startswith("Total"))
    row = re.compile(r"^ *-?\d+ +-?\d+\.\d% +-?\d+\.\d% +-?\d+ +-?\d+\.\d% \S")
    assert all(row.match(x) for x in ours.splitlines()[1:])


def test_thread_by_name(leaky_c: Any, cache_dir: Path) -> None:
    site = next(s for s in je.LEAKY_C_SITES if s.thread == "leaky-worker")
    data = top_json(leaky_c.dump, "--thread", "leaky-worker", cache=cache_dir)
    assert data["rows"][0]["name"] == site.function
    assert site.bytes <= data["total"] <= site.bytes + 1024
    bad = heapscope("top", "--thread", "nosuch", str(leaky_c.dump), cache=cache_dir,
                    check=False)
    assert bad.returncode == 2 and "leaky-worker" in bad.stderr


def test_base_diff_across_processes(leaky_c: Any, leaky_c_sampled: Any, cache_dir: Path) -> None:
    same = top_json(leaky_c.dump, "--base", str(leaky_c.dump), cache=cache_dir)
    assert same["total"] == 0 and same["rows"] == []
    new = top_json(leaky_c.dump, cache=cache_dir)["total"]
    base = top_json(leaky_c_sampled.dump, cache=cache_dir)["total"]
    diff = top_json(leaky_c.dump, "--base", str(leaky_c_sampled.dump), cache=cache_dir)
    assert diff["total"] == pytest.approx(new - base)
    assert not any(r["name"].startswith("0x") for r in diff["rows"])


def _rewrite_maps(dump: Path, old: str, new: str, out: Path) -> Path:
    text = dump.read_text()
    head, sep, maps = text.partition("MAPPED_LIBRARIES:")
    out.write_text(head + sep + maps.replace(old, new))
    return out


def test_missing_binary_then_search_path(leaky_c: Any, tmp_path: Path) -> None:
    moved = _rewrite_maps(leaky_c.dump, str(leaky_c.binary), "/nonexistent/app/leaky",
                          tmp_path / "jeprof.1.0.f.heap")
    p = heapscope("top", "--format", "json", "-n", "0", str(moved), cache=tmp_path / "c")
    assert "/nonexistent/app/leaky" in p.stderr and "not found" in p.stderr
    names = {r["name"] for r in json.loads(p.stdout)["rows"]}
    assert "leak_small" not in names
    assert any(n.startswith("leaky+0x") for n in names)
    found = heapscope("top", "--format", "json", "-n", "0", "--search-path",
                      str(leaky_c.binary.parent), str(moved), cache=tmp_path / "c")
    assert "leak_small" in {r["name"] for r in json.loads(found.stdout)["rows"]}
    sysroot = tmp_path / "root"
    (sysroot / "nonexistent/app").mkdir(parents=True)
    shutil.copy2(leaky_c.binary, sysroot / "nonexistent/app/leaky")
    viaroot = heapscope("top", "--format", "json", "-n", "0", "--sysroot", str(sysroot),
                        str(moved), cache=tmp_path / "c")
    assert "leak_small" in {r["name"] for r in json.loads(viaroot.stdout)["rows"]}


def test_stripped_binary_with_debug_dir(leaky_c: Any, tmp_path: Path) -> None:
    stripped = tmp_path / "bin" / "leaky"
    stripped.parent.mkdir()
    debug = tmp_path / "leaky.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(leaky_c.binary), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), str(leaky_c.binary)],
                   check=True)
    build_id = _build_id(stripped)
    tree = tmp_path / "debugroot" / ".build-id" / build_id[:2]
    tree.mkdir(parents=True)
    shutil.copy2(debug, tree / f"{build_id[2:]}.debug")
    dump = _rewrite_maps(leaky_c.dump, str(leaky_c.binary), str(stripped),
                         tmp_path / "jeprof.2.0.f.heap")
    bare = top_json(dump, cache=tmp_path / "c")
    assert "leak_small" not in {r["name"] for r in bare["rows"]}
    rows = top_json(dump, "--lines", "--debug-dir", str(tmp_path / "debugroot"),
                    cache=tmp_path / "c")["rows"]
    small = next(r for r in rows if r["name"] == "leak_small")
    assert small["line"] == je.source_line(leaky_c.source, "small")


def _build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    assert m
    return m.group(1)


def test_cpp_names(leaky_cpp: Any, cache_dir: Path) -> None:
    data = top_json(leaky_cpp.dump, cache=cache_dir)
    names = {r["name"] for r in data["rows"] if r["flat"] > 0}
    assert "app::Widget<int>::grow" in names
    assert "app::make_widgets" in names
    assert any("{lambda()#1}" in n for n in names), names
    assert not any(n.startswith("_Z") or n.startswith("operator new") for n in names), names
    extra = data["total"] - je.LEAKY_CPP_INUSE_BYTES
    assert 0 <= extra <= je.RUNTIME_EXTRA_BYTES_MAX


@pytest.mark.parametrize("variant", ["leaky_rust_legacy", "leaky_rust_v0"])
def test_rust_names(request: pytest.FixtureRequest, variant: str, cache_dir: Path) -> None:
    prog = request.getfixturevalue(variant)
    data = top_json(prog.dump, cache=cache_dir)
    names = [r["name"] for r in data["rows"]]
    assert any("app::cache::Store" in n and "insert" in n for n in names), names
    assert not any(n.startswith(("_ZN", "_R")) or "17h" in n for n in names), names
    flat = [r["name"] for r in data["rows"] if r["flat"] > 0]
    assert not any(n.startswith(("__rust_alloc", "alloc::", "<alloc::")) for n in flat), flat


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.heap"
    bad.write_bytes(b"\x7fELF\x02\x01garbage")
    for args in (["top", str(bad)], ["top", str(tmp_path / "missing.heap")],
                 ["top", str(tmp_path)]):
        p = heapscope(*args, check=False)
        assert p.returncode == 3
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("heapscope: error: "), p.stderr


def test_cache_makes_second_run_identical(leaky_cpp: Any, tmp_path: Path) -> None:
    cold = heapscope("top", "--lines", str(leaky_cpp.dump), cache=tmp_path)
    assert any(tmp_path.rglob("*.json"))
    warm = heapscope("top", "--lines", str(leaky_cpp.dump), cache=tmp_path)
    assert cold.stdout == warm.stdout


def test_interactive_shell(leaky_c: Any, cache_dir: Path) -> None:
    script = "top3 --cum\nfocus leak_\ntop\ninuse_objects\ntop --lines -main\nhelp\nquit\n"
    out = heapscope("shell", str(leaky_c.dump), stdin=script, cache=cache_dir).stdout
    blocks = out.split("Total:")
    assert len(blocks) == 4
    assert len(re.findall(r"^ +\S+ +\S+% ", blocks[1], re.M)) == 3
    assert "leak_big" in blocks[2] and "copy_names" not in blocks[2]
    assert "objects" in blocks[3]
    assert "Commands:" in out


def test_addresses_and_files_granularity(leaky_c: Any, cache_dir: Path) -> None:
    rows = top_json(leaky_c.dump, "--addresses", cache=cache_dir)["rows"]
    small = [r for r in rows if r["flat"] > 0 and r["name"].endswith(" leak_small")]
    assert len(small) == 1 and re.match(r"^leaky\+0x[0-9a-f]+ leak_small$", small[0]["name"])
    files = rows_by_name(top_json(leaky_c.dump, "--files", cache=cache_dir))
    leaky = next(r for n, r in files.items() if n.endswith("leaky.c"))
    helper = next(r for n, r in files.items() if n == "libhelper.so")
    assert helper["flat"] == pytest.approx(3_072_000, rel=1e-6)
    assert leaky["flat"] + helper["flat"] >= je.LEAKY_C_INUSE_BYTES


def test_several_dumps_reported_apart_unless_merged(leaky_c: Any, leaky_cpp: Any,
                                                     cache_dir: Path) -> None:
    apart = heapscope("top", "-n", "3", str(leaky_c.dump), str(leaky_cpp.dump),
                      cache=cache_dir).stdout
    assert apart.count("==> ") == 2 and apart.count("Total:") == 2
    data = json.loads(heapscope("top", "--format", "json", str(leaky_c.dump),
                                str(leaky_cpp.dump), cache=cache_dir).stdout)
    assert len(data["reports"]) == 2
    one = top_json(leaky_c.dump, cache=cache_dir)["total"]
    two = top_json(leaky_cpp.dump, cache=cache_dir)["total"]
    merged = top_json(leaky_c.dump, "--merge", str(leaky_cpp.dump), cache=cache_dir)
    assert merged["total"] == pytest.approx(one + two)
    names = {r["name"] for r in merged["rows"]}
    assert {"leak_small", "app::Widget<int>::grow"} <= names


def test_cum_order_and_row_limit(leaky_c: Any, cache_dir: Path) -> None:
    rows = heapscope("top", "--cum", "-n", "5", str(leaky_c.dump), cache=cache_dir).stdout
    lines = rows.splitlines()
    assert len(lines) == 6
    cums = [float(x.split()[3]) for x in lines[1:]]
    assert cums == sorted(cums, reverse=True)
    # main allocates a little itself (through printf): its row says what it called.
    assert any(re.search(r" main(?: via \S+)?$", x) for x in lines[1:]), lines


def test_diff_command_matches_sites_across_runs(leaky_c: Any, leaky_c_sampled: Any,
                                                 cache_dir: Path) -> None:
    out = heapscope("diff", "--format", "json", "-n", "0", str(leaky_c_sampled.dump),
                    str(leaky_c.dump), cache=cache_dir)
    data = json.loads(out.stdout)
    new = top_json(leaky_c.dump, cache=cache_dir)["total"]
    base = top_json(leaky_c_sampled.dump, cache=cache_dir)["total"]
    assert data["total"] == pytest.approx(new - base)
    assert not any(r["name"].startswith("0x") for r in data["rows"])
    same = heapscope("diff", str(leaky_c.dump), str(leaky_c.dump), cache=cache_dir).stdout
    lines = same.splitlines()
    # Both sides name the same dump with the same total; no change, so no rows and no shares.
    assert lines[0].split()[1] == lines[1].split()[1] == leaky_c.dump.name
    assert lines[0].split()[-2:] == lines[1].split()[-2:]
    assert lines[0].endswith(" MiB") and lines[2:] == [
        "change  0 B", "flat MiB  share    sum  cum MiB name"]
    grew = heapscope("diff", "-n", "0", str(leaky_c_sampled.dump), str(leaky_c.dump),
                     cache=cache_dir).stdout
    shares = [float(m) for m in re.findall(r"^ *\S+ +(\d+\.\d)% ", grew, re.M)]
    assert shares and max(shares) <= 100.0
    assert "MB" not in grew.replace("MiB", "")
