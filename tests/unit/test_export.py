"""``heapscope export``: pprof (encoder, round trip, Parca's rules), collapsed, callgrind, JSON
and the command's options and errors."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from heapscope.cli import export
from heapscope.formats import symbolized
from heapscope.formats.pprof import decode_profile
from heapscope.formats.proto import profile_pb2
from heapscope.model import INUSE_SPACE, Mapping, Profile, Sample, Thread, ThreadValues
from heapscope.render.callgrind import render_callgrind
from heapscope.render.collapsed import collapse, render_collapsed
from heapscope.render.pprof import PprofOptions, encode_profile, render_pprof
from heapscope.render.profile_json import profile_dict

from .builders import EXE, LIBC, Builder

# ---------------------------------------------------------------------------------------------
# Helpers shared with tests/e2e/test_export.py


def parca_problems(prof: dict[str, Any]) -> list[str]:
    """What Parca's ValidatePprofProfile (pkg/normalizer/validate.go) would reject, and the
    rest of the structural rules pprof relies on."""
    out: list[str] = []
    strings = prof["string_table"]
    n_str = len(strings)
    if not strings or strings[0] != "":
        out.append("string_table[0] is not the empty string")

    def check_str(what: str, i: int) -> None:
        if not 0 <= i < n_str:
            out.append(f"{what}: string index {i} out of range ({n_str} strings)")

    for kind in ("mapping", "location", "function"):
        for k, item in enumerate(prof[kind], 1):
            if item["id"] != k:
                out.append(f"{kind} #{k} has id {item['id']} (ids must be 1..N in order)")
    n_map, n_loc, n_fn = len(prof["mapping"]), len(prof["location"]), len(prof["function"])
    for vt in [*prof["sample_type"], *([prof["period_type"]] if prof["period_type"] else [])]:
        check_str("value type", vt["type"])
        check_str("value type unit", vt["unit"])
    for m in prof["mapping"]:
        check_str("mapping filename", m["filename"])
        check_str("mapping build_id", m["build_id"])
    for loc in prof["location"]:
        if not 0 <= loc["mapping_id"] <= n_map:
            out.append(f"location {loc['id']}: mapping {loc['mapping_id']} out of range")
        for line in loc["line"]:
            if not 1 <= line["function_id"] <= n_fn:
                out.append(f"location {loc['id']}: function {line['function_id']} out of range")
    for fn in prof["function"]:
        for f in ("name", "system_name", "filename"):
            check_str(f"function {fn['id']} {f}", fn[f])
    n_types = len(prof["sample_type"])
    for k, s in enumerate(prof["sample"]):
        if len(s["value"]) != n_types:
            out.append(f"sample {k}: {len(s['value'])} values for {n_types} sample types")
        for lid in s["location_id"]:
            if lid == 0:
                out.append(f"sample {k}: location id 0")
            elif lid > n_loc:
                out.append(f"sample {k}: location id {lid} out of range")
        for label in s["label"]:
            if label["key"] == 0:
                out.append(f"sample {k}: label with key 0")
            check_str("label key", label["key"])
            check_str("label str", label["str"])
    check_str("default_sample_type", prof["default_sample_type"])
    for c in prof["comment"]:
        check_str("comment", c)
    return out


def resolved(prof: dict[str, Any]) -> list[tuple[list[list[str]], dict[str, int]]]:
    """Samples as (frame names per location, leaf first; values by sample type)."""
    s = prof["string_table"]
    fns = {f["id"]: s[f["name"]] for f in prof["function"]}
    locs = {loc["id"]: [fns[ln["function_id"]] for ln in loc["line"]]
            for loc in prof["location"]}
    types = [s[vt["type"]] for vt in prof["sample_type"]]
    return [([locs[i] for i in sm["location_id"]], dict(zip(types, sm["value"], strict=True)))
            for sm in prof["sample"]]


# ---------------------------------------------------------------------------------------------
# Fixtures


def sample_profile() -> Profile:
    """Two sites with an inlined helper, a libc caller, an unsymbolized frame, recursion."""
    b = Builder()
    return b.profile(
        b.sample("make_buf@buf.c:12", "load@cfg.c:40", "main@main.c:7", "libc:__libc_start_main",
                 values=(2, 2048.4, 3, 3072)),
        b.sample("intern@str.h:5;parse@cfg.c:22", "load@cfg.c:40", "main@main.c:7",
                 "libc:__libc_start_main", values=(1, 100.6, 1, 100)),
        b.sample("?exe", "main@main.c:7", values=(4, 4000, 4, 4000)),
        b.sample("walk@tree.c:9", "walk@tree.c:11", "main@main.c:7", values=(1, 64, 1, 64)),
        # Same stack again: merged in collapsed/callgrind, summed in pprof.
        b.sample("make_buf@buf.c:12", "load@cfg.c:40", "main@main.c:7",
                 "libc:__libc_start_main", values=(1, 1024, 1, 1024)),
        b.sample("cold@cold.c:1", "main@main.c:7", values=(0, 0, 5, 500)),
        pid=4242, period=524288,
    )


BUILD_IDS = {EXE.path: "ab" * 20, LIBC.path: "cd" * 20}


def pprof_options(**kw: Any) -> PprofOptions:
    return PprofOptions(build_id=lambda m: BUILD_IDS.get(m.path, ""), **kw)


# ---------------------------------------------------------------------------------------------
# Wire format


@pytest.mark.parametrize(
    ("n", "encoded"),
    [(0, b""), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (150, b"\x96\x01"),
     (300, b"\xac\x02"), (16384, b"\x80\x80\x01"), (2**63 - 1, b"\xff" * 8 + b"\x7f"),
     (-1, b"\xff" * 9 + b"\x01")],
)
def test_wire_varints(n: int, encoded: bytes) -> None:
    """Profile.period (field 12, an int64 varint) as the protobuf wire format spells it."""
    wire = b"\x60" + encoded if n else b""  # a zero scalar is not written
    assert decode_profile(wire)["period"] == n
    assert profile_pb2.Profile(period=n).SerializeToString() == wire


def test_truncated_messages_are_refused() -> None:
    for data in (b"\x0a\x05ab", b"\x08\x80", b"\x1f\x8b\x08junk"):
        with pytest.raises(ValueError):
            decode_profile(data)


# ---------------------------------------------------------------------------------------------
# pprof


def test_pprof_header_and_types() -> None:
    raw = render_pprof([sample_profile()], pprof_options(comments=("hello",)))
    assert raw[:2] == b"\x1f\x8b"
    prof = decode_profile(raw)
    s = prof["string_table"]
    assert s[0] == ""
    assert [(s[v["type"]], s[v["unit"]]) for v in prof["sample_type"]] == [
        ("alloc_objects", "count"), ("alloc_space", "bytes"),
        ("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert (s[prof["period_type"]["type"]], s[prof["period_type"]["unit"]]) == ("space", "bytes")
    assert prof["period"] == 524288
    assert prof["time_nanos"] == 0  # built profiles have no time
    timed = decode_profile(render_pprof([sample_profile().with_(time=1700000000.5)],
                                        pprof_options()))
    assert timed["time_nanos"] == 1_700_000_000_500_000_000
    assert s[prof["default_sample_type"]] == "inuse_space"
    assert [s[c] for c in prof["comment"]] == ["hello"]
    assert parca_problems(prof) == []


def test_pprof_default_sample_type_option() -> None:
    prof = decode_profile(render_pprof([sample_profile()],
                                       pprof_options(default_sample_type="alloc_space")))
    assert prof["string_table"][prof["default_sample_type"]] == "alloc_space"


def test_pprof_samples_round_trip() -> None:
    p = sample_profile()
    prof = decode_profile(encode_profile([p], pprof_options()))
    got = {tuple(";".join(names) for names in stack): v for stack, v in resolved(prof)}
    assert got[("make_buf", "load", "main", "__libc_start_main")] == {
        "alloc_objects": 4, "alloc_space": 4096, "inuse_objects": 3, "inuse_space": 3072}
    # Inlined frames: one location, several lines, innermost first.
    assert got[("intern;parse", "load", "main", "__libc_start_main")]["inuse_space"] == 101
    # Unsymbolized location: no lines.
    assert got[("", "main")]["inuse_space"] == 4000
    assert got[("walk", "walk", "main")]["inuse_space"] == 64
    # alloc-only sample kept with zero in-use values.
    assert got[("cold", "main")] == {"alloc_objects": 5, "alloc_space": 500,
                                     "inuse_objects": 0, "inuse_space": 0}
    assert len(prof["sample"]) == 5
    totals = [sum(sm["value"][k] for sm in prof["sample"]) for k in range(4)]
    assert totals == [round(p.total(2)), round(p.total(3)), round(p.total(0)), round(p.total(1))]


def test_pprof_locations_functions_mappings() -> None:
    p = sample_profile()
    prof = decode_profile(encode_profile([p], pprof_options()))
    s = prof["string_table"]
    maps = prof["mapping"]
    # Main binary first, every executable file mapping once, build-ids from the files.
    assert s[maps[0]["filename"]] == EXE.path
    assert s[maps[0]["build_id"]] == "ab" * 20
    assert {s[m["filename"]] for m in maps} == {m.path for m in p.mappings}
    by_path = {s[m["filename"]]: m for m in maps}
    libc = by_path[LIBC.path]
    assert (libc["memory_start"], libc["memory_limit"], libc["file_offset"]) == (
        LIBC.start, LIBC.limit, LIBC.offset)
    assert s[libc["build_id"]] == "cd" * 20
    # __libc_start_main is named (symbol table) but has no file or line.
    assert libc["has_functions"]
    assert not (libc["has_filenames"] or libc["has_line_numbers"] or libc["has_inline_frames"])
    # The executable holds an unsymbolized address: a backend may still symbolize it.
    exe = by_path[EXE.path]
    assert not exe["has_functions"]
    unused = by_path["/usr/lib/postgresql/15/bin/postgres"]
    assert not unused["has_functions"]
    # Locations: the call instruction (address - 1) in the mapping, one per address.
    addrs = {loc["address"] + 1 for loc in prof["location"]}
    assert addrs == {a for a in p.addresses()}
    for loc in prof["location"]:
        m = maps[loc["mapping_id"] - 1]
        assert m["memory_start"] <= loc["address"] < m["memory_limit"]
    inl = next(loc for loc in prof["location"] if len(loc["line"]) == 2)
    names = [s[prof["function"][ln["function_id"] - 1]["name"]] for ln in inl["line"]]
    assert names == ["intern", "parse"]
    assert [ln["line"] for ln in inl["line"]] == [5, 22]
    fn = {s[f["name"]]: f for f in prof["function"]}
    assert s[fn["intern"]["filename"]] == "str.h"
    assert len(fn) == len(prof["function"])  # one Function per name/file here


def test_pprof_drops_all_zero_samples_and_keeps_ids_dense() -> None:
    b = Builder()
    p = b.profile(b.sample("a", "main", values=(0, 0, 0, 0)),
                  b.sample("b", "main", values=(0, 0.2, 0, 0)),
                  b.sample("c", "main", values=(1, 8, 1, 8)))
    prof = decode_profile(encode_profile([p], pprof_options()))
    assert [names for names, _ in resolved(prof)] == [[["c"], ["main"]]]
    assert parca_problems(prof) == []


def test_pprof_merge_of_two_processes() -> None:
    p = sample_profile()
    q = p.with_(pid=4343, source="other.heap")
    one = decode_profile(encode_profile([p], pprof_options()))
    two = decode_profile(encode_profile([p, q], pprof_options()))
    # Same mappings and addresses: shared mappings and locations, values summed.
    assert len(two["mapping"]) == len(one["mapping"])
    assert len(two["location"]) == len(one["location"])
    # Estimates are summed per stack before rounding.
    assert two["sample"][0]["value"] == [8, 8192, 6, round(2 * 3072.4)]
    assert sum(sm["value"][3] for sm in two["sample"]) == pytest.approx(
        2 * p.total(INUSE_SPACE), abs=len(two["sample"]) / 2)
    assert parca_problems(two) == []


def test_pprof_thread_labels() -> None:
    b = Builder()
    p = b.profile(
        Sample((b.loc("a"), b.loc("main")), (3, 300, 0, 0),
               (ThreadValues(0, (1, 100, 0, 0)), ThreadValues(7, (2, 200, 0, 0)))),
        threads=(Thread(0, "main"), Thread(7, "")),
    )
    prof = decode_profile(encode_profile([p], pprof_options(thread_labels=True)))
    s = prof["string_table"]
    assert parca_problems(prof) == []
    got = []
    for sm in prof["sample"]:
        labels = {s[lb["key"]]: (s[lb["str"]] if lb["str"] else lb["num"]) for lb in sm["label"]}
        got.append((labels, sm["value"][3]))
    assert sorted(got, key=lambda x: x[1]) == [({"thread_id": 0, "thread": "main"}, 100),
                                               ({"thread_id": 7}, 200)]
    plain = decode_profile(encode_profile([p], pprof_options()))
    assert [sm["label"] for sm in plain["sample"]] == [[]]


def test_parca_validator_catches_problems() -> None:
    prof = decode_profile(encode_profile([sample_profile()], pprof_options()))
    prof["location"][1]["id"] = 7
    prof["sample"][0]["location_id"].append(0)
    prof["sample"][1]["value"].pop()
    prof["sample"][2]["label"].append({"key": 0, "str": 0, "num": 1, "num_unit": 0})
    prof["function"][0]["name"] = 10**6
    problems = parca_problems(prof)
    assert len(problems) == 5, problems


def test_pprof_real_address_without_mapping_and_fallback_names() -> None:
    b = Builder()
    p = b.profile(b.sample("?exe", "main"))
    jit = Mapping(0x7E0000000000, 0x7E0000100000, 0, "", "rwxp")
    from heapscope.model import Frame, Location

    loc = Location(0x7E0000000040, jit, "[jit]", 0x40, (Frame("Interpreter"),))
    locs = dict(p.locations)
    locs[loc.address] = loc
    from types import MappingProxyType

    p = p.with_(samples=(Sample((loc.address, b.loc("main")), (1, 10, 1, 10)),),
                locations=MappingProxyType(locs))
    prof = decode_profile(encode_profile([p], pprof_options()))
    assert parca_problems(prof) == []
    jl = next(x for x in prof["location"] if x["address"] == 0x7E000000003F)
    assert jl["mapping_id"] == 0
    assert resolved(prof)[0][0] == [["Interpreter"], ["main"]]


# ---------------------------------------------------------------------------------------------
# collapsed, callgrind, json


def test_collapsed_golden(golden: Any) -> None:
    buf = io.StringIO()
    render_collapsed(buf, [sample_profile()], INUSE_SPACE)
    golden("export_collapsed.txt", buf.getvalue())


def test_collapsed_merges_by_name_and_sums() -> None:
    p = sample_profile()
    folded = collapse([p, p], INUSE_SPACE)
    assert folded["__libc_start_main;main;load;make_buf"] == 2 * (2048.4 + 1024)
    assert folded["__libc_start_main;main;load;parse;intern"] == pytest.approx(201.2)
    unnamed = next(loc for loc in p.locations.values() if not loc.frames)
    assert f"main;app+{unnamed.offset:#x}" in folded
    assert sum(folded.values()) == pytest.approx(2 * p.total(INUSE_SPACE))
    buf = io.StringIO()
    render_collapsed(buf, [p], INUSE_SPACE)
    lines = buf.getvalue().splitlines()
    assert lines == sorted(lines)
    for line in lines:
        stack, _, value = line.rpartition(" ")
        assert int(value) > 0 and stack and "<" not in stack


def test_collapsed_cleans_separators() -> None:
    b = Builder()
    p = b.profile(b.sample("weird;name", "main"))
    buf = io.StringIO()
    render_collapsed(buf, [p], INUSE_SPACE)
    # The Builder splits on ';' (inlined frames), so this is two frames already; a real
    # name with ';' is cleaned:
    from heapscope.render.collapsed import clean_name

    assert clean_name("a;b\nc") == "a:b c"
    assert buf.getvalue().count("\n") == 1
    # A name from a hostile binary: a window-title sequence, bell, backspace and a
    # right-to-left override are written as visible escapes, never as themselves.
    hostile = clean_name("f\x1b]0;owned\x07\x08\u202eevil")
    assert hostile == "f\\x1b]0:owned\\x07\\x08\\u202eevil", hostile
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c == "\u202e" for c in hostile)


def test_callgrind_golden(golden: Any) -> None:
    buf = io.StringIO()
    render_callgrind(buf, [sample_profile()], INUSE_SPACE, "inuse_space", cmd="built.heap")
    golden("export_callgrind.txt", buf.getvalue())


def test_callgrind_self_and_inclusive_costs() -> None:
    buf = io.StringIO()
    render_callgrind(buf, [sample_profile()], INUSE_SPACE, "inuse_space")
    text = buf.getvalue()
    assert "events: inuse_space\n" in text
    total = round(2048.4 + 1024) + round(100.6) + 4000 + 64
    assert f"summary: {total}\n" in text and text.endswith(f"totals: {total}\n")
    self_total = 0
    in_call = False
    for line in text.splitlines():
        if line.startswith("calls="):
            in_call = True
            continue
        if line[:1].isdigit():
            if not in_call:
                self_total += int(line.split()[1])
            in_call = False
    assert self_total == total


def test_profile_json() -> None:
    p = sample_profile()
    d = profile_dict([p])
    json.dumps(d)
    assert d["meta"]["format"] == "heapscope-profile"
    assert d["meta"]["pids"] == [4242]
    assert [m["id"] for m in d["mappings"]] == list(range(1, len(d["mappings"]) + 1))
    first = d["samples"][0]
    assert first["stack"] == ["make_buf", "load", "main", "__libc_start_main"]
    assert first["values"]["inuse_space"] == 2048.4
    locs = {loc["id"]: loc for loc in d["locations"]}
    assert locs[first["locations"][0]]["frames"][0]["file"] == "buf.c"
    inl = d["samples"][1]
    assert inl["stack"][:2] == ["intern", "parse"]


# ---------------------------------------------------------------------------------------------
# The command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heapscope")
    sub = p.add_subparsers(dest="command")
    export.register(sub)
    return p


def _run(argv: list[str]) -> int:
    from heapscope.errors import HeapscopeError

    args = _parser().parse_args(["export", *argv])
    try:
        rc: int = args.func(args)
    except HeapscopeError as e:
        print(f"heapscope: error: {e}")
        return e.exit_code
    return rc


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A self-contained (symbolized) dump of a profile with allocator frames on top."""
    b = Builder()
    p = b.profile(
        b.sample("je:prof_backtrace", "je:malloc", "make_buf@buf.c:12", "main@main.c:7",
                 values=(2, 2048, 2, 2048)),
        b.sample("je:malloc", "parse@cfg.c:22", "main@main.c:7", values=(1, 100, 1, 100)),
    )
    path = tmp_path / ("app.heap" + symbolized.SUFFIX)
    symbolized.write(p, str(path))
    return path


def test_cli_formats(dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.pb.gz"
    assert _run([str(dump), "-o", str(out), "--no-cache"]) == 0
    prof = decode_profile(out.read_bytes())
    assert parca_problems(prof) == []
    stacks = sorted(tuple(n[0] for n in names) for names, _ in resolved(prof))
    assert stacks == [("make_buf", "main"), ("parse", "main")]  # allocator frames pruned
    assert _run([str(dump), "--format", "collapsed", "-o", "-", "--no-cache"]) == 0
    assert capsys.readouterr().out == "main;make_buf 2048\nmain;parse 100\n"
    assert _run([str(dump), "--format", "collapsed", "--inuse-objects", "-o", "-",
                 "--ignore", "parse", "--no-cache"]) == 0
    assert capsys.readouterr().out == "main;make_buf 2\n"
    cg = tmp_path / "callgrind.out"
    assert _run([str(dump), "--format", "callgrind", "-o", str(cg), "--no-cache"]) == 0
    assert "summary: 2148\n" in cg.read_text()
    js = tmp_path / "p.json"
    assert _run([str(dump), "--format", "json", "-o", str(js), "--focus", "make_buf",
                 "--no-cache"]) == 0
    assert [s["stack"] for s in json.loads(js.read_text())["samples"]] == [["make_buf", "main"]]


def test_cli_errors(dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "exists.folded"
    out.write_text("keep me")
    assert _run([str(dump), "--format", "collapsed", "-o", str(out), "--no-cache"]) == 3
    assert "exists: add --force to replace it" in capsys.readouterr().out
    assert out.read_text() == "keep me"
    assert _run([str(dump), "--format", "collapsed", "-o", str(out), "--force",
                 "--no-cache"]) == 0
    assert out.read_text() == "main;make_buf 2048\nmain;parse 100\n"
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".heapscope-export-")]

    assert _run([str(dump), "--format", "svg", "-o", str(tmp_path / "x")]) == 2
    msg = capsys.readouterr().out
    assert "unknown format 'svg'" in msg and msg.count("\n") == 1

    assert _run([str(dump), "-o", str(tmp_path / "no" / "such" / "x.pb.gz")]) == 3
    assert "cannot write" in capsys.readouterr().out

    assert _run([str(dump), str(dump), "-o", str(tmp_path / "two.pb.gz"), "--no-cache"]) == 2
    assert "--merge" in capsys.readouterr().out
    assert _run([str(dump), str(dump), "--merge", "-o", "-", "--format", "collapsed",
                 "--no-cache"]) == 0
    assert capsys.readouterr().out == "main;make_buf 4096\nmain;parse 200\n"

    assert _run([str(dump), "--thread-labels", "--format", "json", "-o", "-"]) == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_cli_unwritable_folder(dump: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert _run([str(dump), "-o", str(ro / "x.pb.gz"), "--no-cache"]) == 3
        assert "permission denied" in capsys.readouterr().out
    finally:
        ro.chmod(0o700)


def test_cli_write_failure_is_one_line(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # /proc passes the early checks (even for root) but refuses new files.
    assert _run([str(dump), "--format", "collapsed", "-o", "/proc/heapscope-export-test",
                 "--no-cache"]) == 3
    msg = capsys.readouterr().out
    assert msg.startswith("heapscope: error: /proc/heapscope-export-test: cannot write")
    assert msg.count("\n") == 1


def test_pprof_gzip_is_deterministic() -> None:
    p = sample_profile()
    a = render_pprof([p], pprof_options())
    assert a == render_pprof([p], pprof_options())
    assert gzip.decompress(a) == encode_profile([p], pprof_options())


def test_generated_profile_code_matches_its_proto(tmp_path: Path) -> None:
    """formats/proto/profile_pb2.py(i) are what protoc makes of profile.proto (the command
    in profile.proto's header): regenerated here and compared."""
    grpc_tools = pytest.importorskip("grpc_tools.protoc", reason="pip install grpcio-tools")
    proto_dir = Path(profile_pb2.__file__).parent
    rc = grpc_tools.main(["protoc", f"-I{proto_dir}", f"--python_out={tmp_path}",
                          f"--pyi_out={tmp_path}", str(proto_dir / "profile.proto")])
    assert rc == 0
    for name in ("profile_pb2.py", "profile_pb2.pyi"):
        assert (tmp_path / name).read_bytes() == (proto_dir / name).read_bytes(), name
