"""A bounded slice of the fuzz campaign (tests/fuzz/campaign.py) runs with the tests, and
every crash the campaign found stays a regression case.

The full campaign (millions of inputs, run outside CI) is recorded in the closing notes; this
slice feeds every reader 2,000 mutated inputs and every writer 40 from a fixed seed, so a
reader or writer that starts to crash or hang on a kind of input the campaign covers fails
the suite. Each input the campaign saved (shrunk, in tests/fuzz/findings/, named after the
target and the crash it caused) is fed to its target again; the tests below them pin down
what each fix promises.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from heapscope.analysis.leaks import json_numbers
from heapscope.analysis.unsample import scale_pair_v2, unsample
from heapscope.errors import InputError
from heapscope.files import open_regular
from heapscope.formats import symbolized
from heapscope.formats.load import load
from heapscope.formats.maps import parse_maps
from heapscope.formats.pprof import decode_profile
from heapscope.formats.scan import DumpCounts, unsampled
from heapscope.model import Frame, Location, Mapping, Profile, Sample, ThreadValues
from heapscope.render.callgrind import render_callgrind
from heapscope.render.pprof import PprofOptions, encode_profile
from heapscope.render.profile_json import render_profile_json
from heapscope.units import short_number
from tests.fuzz.campaign import TARGETS, run_worker
from tests.fuzz.targets import READERS
from tests.fuzz.writers import WRITERS, check_callgrind

FINDINGS = Path(__file__).resolve().parent.parent / "fuzz" / "findings"
NO_BUILD_IDS = PprofOptions(build_id=lambda m: "")


def test_every_reader_survives_a_slice_of_the_campaign() -> None:
    result = run_worker((20261123, 2000 * len(READERS), 5.0, tuple(t.name for t in READERS)))
    assert set(result.inputs) == {t.name for t in READERS}
    assert all(n == 2000 for n in result.inputs.values()), result.inputs
    assert result.crashes == {}, "\n\n".join(text for text, _ in result.crashes.values())
    assert result.hangs == {}, sorted(result.hangs)


def test_every_writer_survives_a_slice_of_the_campaign() -> None:
    # A few hundred inputs: a writer input is read, symbolized and written (about 1 ms).
    result = run_worker((20261126, 40 * len(WRITERS), 5.0, tuple(t.name for t in WRITERS)))
    assert set(result.inputs) == {t.name for t in WRITERS}
    assert all(n == 40 for n in result.inputs.values()), result.inputs
    assert result.crashes == {}, "\n\n".join(text for text, _ in result.crashes.values())
    assert result.hangs == {}, sorted(result.hangs)
    # the slice reaches the writers: some inputs of every target are read and written
    assert all(result.passed.get(t.name) for t in WRITERS), result.passed


@pytest.mark.parametrize("finding", sorted(p.name for p in FINDINGS.glob("*.bin")))
def test_campaign_finding_stays_fixed(finding: str, tmp_path: Path) -> None:
    """An input the campaign saved: its target answers with what it allows, or output."""
    target = next(t for t in TARGETS if t.name == finding.split("--")[0])
    try:
        target.run((FINDINGS / finding).read_bytes(), str(tmp_path / "input"))
    except target.allowed as e:
        assert "\n" not in str(e) and "Traceback" not in str(e)


def test_campaign_finding_corrupt_gzip_in_the_pprof_reader() -> None:
    """Found by the 7,000,000-input run: a gzip header with an unknown method made the
    profile.proto reader raise zlib.error; it is a ValueError like every other bad input."""
    for bad in (b"\x1f\x8b\x09\x00" + b"\x00" * 20, gzip.compress(b"\x08\x01" * 50)[:-9]):
        with pytest.raises(ValueError):
            decode_profile(bad)


# ---------------------------------------------------------------------------------------------
# What the writer campaign found, each fix pinned down

MAPS = "MAPPED_LIBRARIES:\n00400000-00401000 r-xp 00000000 00:00 0   /nonexistent/prog\n"


def _dump(tmp_path: Path, text: str, name: str = "jeprof.7.0.f.heap") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_unsampling_objects_far_below_the_period_is_no_division_by_zero() -> None:
    """1 - exp(-r) is 0.0 for r below 1e-16 (many objects of a byte, a huge period): every
    command that unsampled such a dump raised ZeroDivisionError. The estimate uses expm1,
    as the series scanner always did, and stays what the formula says."""
    count, size = scale_pair_v2(9999999999999999.0, 7.0, 88)
    assert math.isfinite(count) and count > 9999999999999999.0
    assert math.isclose(size, 7.0 / -math.expm1(-7.0 / 9999999999999999.0 / 88))
    # ordinary pairs are unchanged (to the last bits) by the rewrite
    assert math.isclose(scale_pair_v2(4, 4096, 524288)[1], 4096 / (1 - math.exp(-1024 / 524288)),
                        rel_tol=1e-12)


def test_an_unsampled_estimate_past_any_number_is_a_one_line_error() -> None:
    """Fractions of a byte per object (only a damaged heapscope profile holds them) gave
    estimates of inf bytes: Infinity in JSON, 'inf' in reports. Both unsampling passes say
    so in one line instead."""
    p = Profile((Sample((1,), (1e19, 1e-290, 0.0, 0.0)),), period=524288, source="bad.heap")
    with pytest.raises(InputError, match=r"^bad.heap: counts whose unsampled estimate"):
        unsample(p)
    d = DumpCounts("bad.heap", np.array([0]), np.array([1e19]), np.array([1e-290]), 524288,
                   "v2", False, ())
    with pytest.raises(InputError, match=r"^bad.heap: counts whose unsampled estimate"):
        unsampled(d)


def test_a_count_of_twenty_digits_is_refused_on_every_parsing_path(tmp_path: Path) -> None:
    """The per-thread line parser's fast path let a 20-digit count (1e20) through where the
    regex allows 19 digits; the heapscope profile written from it could not be read back."""
    path = _dump(tmp_path, "heap_v2/524288\n  t*: 1: 100000000000000000000 [0: 0]\n"
                           "@ 0x400100\n  t*: 1: 100000000000000000000 [0: 0]\n" + MAPS)
    with pytest.raises(InputError, match="number too large"):
        load(path, threads=True)


def test_memory_map_numbers_past_64_bits_are_not_mappings() -> None:
    """A mapping limit of 25 hex digits made pprof export raise ValueError, and an offset of
    4,810 digits made the symbolized copy's JSON raise (over 4,300 digits)."""
    lines = ["00400000-00401000 r-xp 00000000 00:00 0   /srv/ok",
             "7f0001000-7f00000000000000000000001 r-xp 0 00:00 0   /srv/wide-limit",
             "7f0002000-7f0003000 r-xp " + "9" * 4810 + " 00:00 0   /srv/wide-offset",
             "00500000-00501000 r-xp 00000000 00:00 0   /srv/ok2"]
    assert [m.path for m in parse_maps(lines)] == ["/srv/ok", "/srv/ok2"]


def _symbolized_profile(**changes: object) -> Profile:
    exe = Mapping(0x400000, 0x401000, 0, "/srv/app")
    loc = Location(0x400100, exe, "app", 0x100, (Frame("main", "main.c", 3),))
    p = Profile((Sample((0x400100,), (1.0, 64.0, 1.0, 64.0),
                        (ThreadValues(3, (1.0, 64.0, 1.0, 64.0)),)),),
                mappings=(exe,), period=1, sampling="none", unsampled=True, source="x.heap",
                locations=MappingProxyType({0x400100: loc}))
    return p.with_(**changes)


@pytest.mark.parametrize(("what", "changes", "problem"), [
    ("thread id", {"samples": (Sample((0x400100,), (1.0, 64.0, 1.0, 64.0),
                                      (ThreadValues(1 << 63, (1.0, 64.0, 1.0, 64.0)),)),)},
     "thread id 9223372036854775808 does not fit in pprof's 64-bit signed field"),
    ("period", {"period": 10 ** 19}, "sampling period 10000000000000000000 does not fit"),
    ("time", {"time": 1e20}, "time (ns) 1e+29 does not fit"),
    ("mapping", {"mappings": (Mapping(0x400000, 1 << 64, 0, "/srv/app"),)},
     "mapping limit 18446744073709551616 does not fit in pprof's 64-bit unsigned field"),
    ("line", {"locations": MappingProxyType({0x400100: Location(
        0x400100, None, "app", 0x100, (Frame("main", "main.c", 10 ** 40),))})},
     "line number 0x1d6329f1c35ca4bfabb9… (133 bits) does not fit"),
])
def test_pprof_fields_that_do_not_fit_are_one_line_errors(what: str, changes: dict[str, object],
                                                            problem: str) -> None:
    """Thread ids (19 digits pass the reader, 2^63 does not fit a label), a sampling period
    past 2^63, a time past 2262, a mapping past 64 bits, a line number of a heapscope
    profile: protobuf raised ValueError (or TypeError) with a traceback."""
    p = _symbolized_profile(**changes)
    with pytest.raises(InputError) as e:
        encode_profile([p], PprofOptions(thread_labels=True, build_id=lambda m: ""))
    assert str(e.value).startswith("x.heap: ") and problem in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_pprof_value_of_nan_or_inf_is_a_one_line_error() -> None:
    for v in (math.inf, math.nan, 1e19):
        p = _symbolized_profile(samples=(Sample((0x400100,), (1.0, v, 1.0, 64.0)),))
        with pytest.raises(InputError, match="does not fit in pprof's 64-bit signed values"):
            encode_profile([p], NO_BUILD_IDS)


def test_an_address_past_64_bits_is_one_line_in_every_file_written() -> None:
    """A stack address of 5,000 hex digits: JSON export and the session's symbolized copy
    raised ValueError (past 4,300 digits), pprof export printed all 5,000 digits."""
    wide = int("9" * 5000, 16)
    p = Profile((Sample((wide, 0x400100), (1.0, 64.0, 1.0, 64.0)),), source="wide.heap")
    for write in (lambda: encode_profile([p], NO_BUILD_IDS),
                  lambda: render_profile_json(io.StringIO(), [p]),
                  lambda: symbolized.encode(p)):
        with pytest.raises(InputError) as e:
            write()
        message = str(e.value)
        assert message.startswith("wide.heap: address 0x99999999999999999999… (20000 bits)")
        assert len(message) < 150


def test_short_number() -> None:
    assert short_number(12) == "12"
    assert short_number(1 << 64) == "18446744073709551616"
    assert short_number((1 << 80) - 1, hexadecimal=True) == "0x" + "f" * 20
    assert short_number(1 << 80) == "0x10000000000000000000… (81 bits)"
    assert short_number(1e29) == "1e+29"


@pytest.mark.parametrize(("field", "value"), [
    ("values", [1, 2]),  # two values where there are four sample types
    ("sample_types", [["inuse_space", "bytes"]]),
    ("time", "yesterday"), ("time", []), ("pid", "100"), ("pid", -1), ("seq", 1.5),
    ("thread", -4), ("address", -1), ("address", 1 << 64), ("mapping", 1 << 64),
])
def test_the_heapscope_profile_reader_refuses_what_writers_would_trip_on(
        field: str, value: object) -> None:
    """Found through the writers: a heapscope profile with two values per sample (IndexError
    while unsampling), a time that is a string or list (TypeError in pprof export), ... all
    read without complaint. (Sample types that are lists, a TypeError in JSON export, are
    now read as their text, as every other name of the file is.)"""
    doc = symbolized.encode(_symbolized_profile())
    if field == "values":
        doc["samples"][0][1] = value
    elif field == "sample_types":
        doc["meta"]["sample_types"] = value
    elif field in ("time", "pid", "seq"):
        doc["meta"][field] = value
    elif field == "thread":
        doc["samples"][0][2][0][0] = value
    elif field == "address":
        doc["samples"][0][0] = [value]
    else:
        doc["mappings"][0][1] = value
    with pytest.raises(InputError, match=r"^x.heap: damaged heapscope profile"):
        symbolized.decode(json.loads(json.dumps(doc)), "x.heap")


def test_callgrind_names_cannot_break_their_line() -> None:
    """A file name with a line break (a heapscope profile, DWARF) ended the fn= record and
    started one callgrind reads as a cost line; DEL and other controls went out raw."""
    exe = Mapping(0x400000, 0x401000, 0, "/srv/app\nx")
    loc = Location(0x400100, exe, "app", 0x100, (Frame("leak\x7f", "weird\nfile.c", 3),))
    p = _symbolized_profile(mappings=(exe,), locations=MappingProxyType({0x400100: loc}))
    out = io.StringIO()
    render_callgrind(out, [p, p.with_(source="two\nlines.heap")], 1, "inuse_space",
                     cmd="x.heap two\nlines.heap")
    check_callgrind(out.getvalue())
    assert "fn=(1) leak\\x7f" in out.getvalue() and "fl=(1) weird\\x0afile.c" in out.getvalue()


def test_leak_report_json_has_no_infinity() -> None:
    """Two dumps whose site grew by counts known exactly give a z of inf: `leaks --format
    json` and report.json held Infinity, which jq and strict readers refuse."""
    doc = json_numbers({"trend_z": math.inf, "nested": [{"p": math.nan}, 1.5], "n": 3})
    assert doc == {"trend_z": None, "nested": [{"p": None}, 1.5], "n": 3}


def test_a_nul_byte_in_a_mapped_path_is_a_missing_file(tmp_path: Path) -> None:
    """A memory map path holding a NUL byte (past the first 4 KiB of a dump, or in a
    heapscope profile) made os.open raise ValueError where the build-id lookup of pprof
    export and the frame classifier expect OSError."""
    with pytest.raises(FileNotFoundError):
        open_regular(str(tmp_path / "a\0b"))
    exe = Mapping(0x400000, 0x401000, 0, "/srv/a\0b")
    p = _symbolized_profile(mappings=(exe,))
    prof = decode_profile(encode_profile([p]))  # the file-reading build-id lookup
    assert prof["mapping"][0]["build_id"] == 0


def test_findings_are_named_after_their_targets() -> None:
    names = {t.name for t in TARGETS}
    found = sorted(FINDINGS.glob("*.bin"))
    assert found, FINDINGS
    assert all(p.name.split("--")[0] in names for p in found), [p.name for p in found]
    assert all(os.path.getsize(p) < 20_000 for p in found)
