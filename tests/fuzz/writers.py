"""The writers the fuzz campaign feeds: a fuzzed dump read, prepared and written out.

Each target takes one mutated input (a jemalloc heap_v2 dump, a legacy/Go heap profile or a
heapscope profile in symbolized JSON, the dialects of the seeds), reads it as the commands do
(:func:`heapscope.prepare.prepare`: load, unsample, symbolize, prune, fold; or
:func:`heapscope.analysis.series.load_series` for the leak finder) and writes it with one of
heapscope's writers: the ``export`` formats, the ``top`` table as text and JSON, the leak
report (as ``leaks`` prints it and as ``run`` ends with it), the flame graph page, the call
graph's DOT text, a diff of two dumps, and round trips through the profile.proto and
symbolized-JSON files read back by heapscope's own readers. One target writes nothing: it
folds and tables the input with heapscope's compiled loops and without (the two must agree).

A target may answer with a one-line :class:`InputError` (a value a format cannot hold, a
damaged dump). Anything else is a crash, and so is output that is not well formed where that
is cheap to check: a profile.proto that does not decode or whose ids and string indexes point
nowhere, sample values that do not add up to the profile's, JSON that strict JSON readers
refuse (``NaN``, ``Infinity``), a control character in a text report, a DOT line with
unbalanced quotes or braces, a collapsed or callgrind line that breaks the format, a round
trip that does not give back what was written.

The symbolizer is replaced by :func:`fake_symbolize` while a target runs (never an external
tool per input): it names each address from its module and offset, with a function picked
from a fixed list (allocator entry points included, so pruning and folding run), a file, a
line and sometimes an inline chain; some addresses stay unnamed (``module+0xoffset``). Which
options a writer gets (sample type, granularity, frames, thread labels) follows a CRC of the
input, so a given input always takes the same path.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
import zlib
from argparse import Namespace
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import Any, TypeVar, cast

import heapscope.analysis.aggregate as aggregate_module
import heapscope.analysis.fold as fold_module
import heapscope.analysis.series as series_module
import heapscope.prepare as prepare_module
from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.fold import FramePolicy
from heapscope.analysis.graph import GraphOptions, build_graph
from heapscope.analysis.leaks import LeakReport, find_leaks
from heapscope.analysis.series import load_series
from heapscope.analysis.top import SAMPLE_INDEX, View, build_diff, build_table
from heapscope.analysis.tree import build_tree
from heapscope.capture.launch import RunResult
from heapscope.capture.runner import SessionResult
from heapscope.cli import export
from heapscope.errors import InputError
from heapscope.formats import symbolized
from heapscope.formats.load import load
from heapscope.formats.pprof import decode_profile
from heapscope.model import Frame, Location, Mapping, Profile
from heapscope.prepare import prepare
from heapscope.render.callgraph import to_dot
from heapscope.render.flamegraph import render_flamegraph
from heapscope.render.json import render_json, table_dict
from heapscope.render.leaks import render_leaks
from heapscope.render.pprof import PPROF_ORDER, PprofOptions, encode_profile
from heapscope.render.report import render_report
from heapscope.render.text import render_diff, render_table
from heapscope.symbols import Symbolized, SymbolOptions
from tests.fuzz.targets import Target, _dump_files, _one_line, _write

# ---------------------------------------------------------------------------------------------
# The stand-in symbolizer

# Functions the fake symbolizer names addresses with: allocator entry points and jemalloc
# internals (pruned), a wrapper, C++ and Rust names with templates and operators (folded,
# shortened, escaped), names with characters DOT, HTML and collapsed stacks treat specially.
NAMES = (
    "malloc", "je_prof_backtrace", "imalloc_body", "operator new", "calloc", "strdup",
    "xmalloc", "my_alloc_wrapper", "main", "worker_loop", "Cache::fill(int)",
    "std::vector<std::pair<int, std::string>>::_M_realloc_insert", "operator<<",
    "alloc::raw_vec::finish_grow", "<T as core::clone::Clone>::clone", "a;b c",
    'quote"back\\slash', "{record|label}", "</script><!--", "tab\tname", "\u202eevil",
    "palloc", "std::__new_allocator<char>::allocate", "", "caf\udce9_latin1",
    "lone\ud800surrogate", "\x1b[2Jclear", "nul\x00byte",
)
# (the undecodable bytes of a non-UTF-8 name are lone surrogates, U+DC80-U+DCFF)
FILES = ("", "/src/app/main.cc", "cache.h", "/usr/include/c++/12/bits/vector.tcc",
         "lib.rs", "weird\nfile.c", "/src/\udce9t\udce9.c")


def _frames_for(module: str, offset: int) -> tuple[Frame, ...]:
    """The frames the stand-in gives an address: none for one in eight, else a function
    with a file and line, sometimes under an inlined callee."""
    h = zlib.crc32(f"{module}+{offset}".encode("utf-8", "surrogateescape"))
    if h % 8 == 0:
        return ()
    name = NAMES[h % len(NAMES)]
    file = FILES[(h >> 8) % len(FILES)]
    frame = Frame(name, file, (h >> 12) % 5000 if file else 0, False, name + "()",
                  "_Z" + name.replace(" ", ""))
    if h % 5 == 0:
        inner = NAMES[(h >> 16) % len(NAMES)]
        return (Frame(inner, file, (h >> 20) % 900, True, inner, inner), frame)
    return (frame,)


def fake_symbolize(profile: Profile, options: SymbolOptions, progress: Any = None, *,
                   backend: Any = None) -> Symbolized:
    """:func:`heapscope.symbols.symbolize` without files or tools: every address gets its
    mapping, module and offset as the real symbolizer computes them, and made-up frames."""
    code = sorted((m for m in profile.mappings if m.executable), key=lambda m: m.start)
    callers = profile.caller_addresses()
    out: dict[int, Location] = {}
    for address in profile.addresses():
        lookup = address - 1 if address in callers and address > 0 else address
        mapping: Mapping | None = next((m for m in code if m.contains(lookup)), None)
        if mapping is None:
            out[address] = Location(address, None, "[unknown]", lookup)
        elif mapping.anonymous:
            out[address] = Location(address, mapping, mapping.name, lookup - mapping.start)
        else:
            offset = lookup - mapping.start + mapping.offset
            out[address] = Location(address, mapping, mapping.name, offset,
                                    _frames_for(mapping.name, offset))
    return Symbolized(profile.with_(locations=MappingProxyType(out)), (), ())


@contextlib.contextmanager
def fake_symbols() -> Iterator[None]:
    """Use :func:`fake_symbolize` in prepare() and load_series() meanwhile."""
    saved = prepare_module.symbolize, series_module.symbolize
    prepare_module.symbolize = fake_symbolize
    series_module.symbolize = fake_symbolize
    try:
        yield
    finally:
        prepare_module.symbolize, series_module.symbolize = saved


OPTIONS = SymbolOptions(cache_dir=None, debuginfod_urls=())
T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Reading a fuzzed input as the commands do

SAMPLES = tuple(SAMPLE_INDEX)
BASE_MARK = b"\n=====base=====\n"  # splits a diff input into the new dump and its base


class Knobs:
    """The options one input is written with, from a CRC of its bytes."""

    def __init__(self, data: bytes) -> None:
        h = zlib.crc32(data)
        self.sample = SAMPLES[h % 4]
        self.granularity = GRANULARITIES[(h >> 2) % len(GRANULARITIES)]
        self.site = (h >> 4) % 2 == 0  # frames folded to sites, or raw
        self.threads = (h >> 5) % 2 == 0  # per-thread values (pprof thread labels)
        self.cum = (h >> 6) % 2 == 0
        self.nodecount = (0, 5, 80)[(h >> 7) % 3]

    @property
    def frames(self) -> FramePolicy:
        """The frame policy: folded to sites or raw."""
        return FramePolicy(mode="site" if self.site else "raw")


def _dump_path(scratch: str, seq: int = 0) -> str:
    # Named as jemalloc names dumps, so pid, sequence and kind are read from the name.
    return f"{scratch}.4242.{seq}.m{seq}.heap"


def prepared(data: bytes, scratch: str, knobs: Knobs, *, seq: int = 0,
             fold: bool = True) -> Profile:
    """The input as the commands see it: loaded, unsampled, symbolized, pruned, folded."""
    path = _write(data, _dump_path(scratch, seq))
    frames = knobs.frames if fold else FramePolicy(mode="raw")
    try:
        with fake_symbols():
            return prepare(path, OPTIONS, threads=knobs.threads, frames=frames,
                           reuse=False).profile
    except InputError as e:
        _one_line(e)
        raise


def _written(run: Callable[[], T]) -> T:
    """Run a writer; its InputError must be one line."""
    try:
        return run()
    except InputError as e:
        _one_line(e)
        raise


# ---------------------------------------------------------------------------------------------
# Checks of what was written


class Malformed(AssertionError):
    """A writer wrote output that is not well formed."""


def _refuse_constant(name: str) -> float:
    raise Malformed(f"JSON holds {name}, which strict JSON readers refuse")


def strict_json(text: str) -> Any:
    """``text`` parsed as strict JSON (no NaN or Infinity)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as e:
        raise Malformed(f"not JSON: {e}") from None


# What terminal.clean() escapes, less the line break: a report printed on a terminal must
# hold none of them.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")
# What breaks a line-based file format (a name is one line, in one piece): C0 controls but
# the tab, and DEL.
_LINE_BREAKING = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def plain_text(text: str, what: str, control: re.Pattern[str] = _CONTROL) -> None:
    """A report for a terminal (or, with ``control`` _LINE_BREAKING, a line-based file):
    no control character but the line break."""
    m = control.search(text)
    if m is not None:
        raise Malformed(f"{what} holds a raw control character {m.group()!r}: "
                        f"{text[max(0, m.start() - 60):m.end() + 20]!r}")


def _check_ids(what: str, items: list[dict[str, Any]]) -> None:
    for k, item in enumerate(items, 1):
        if item["id"] != k:
            raise Malformed(f"pprof {what} #{k} has id {item['id']}")


def check_pprof(raw: bytes, profiles: list[Profile], thread_labels: bool) -> dict[str, Any]:
    """The profile.proto decodes, its references point somewhere, and its values add up
    to the profiles' (each sample rounds by at most one half)."""
    try:
        prof = decode_profile(raw)
    except ValueError as e:
        raise Malformed(f"pprof output does not decode: {e}") from None
    strings = prof["string_table"]
    if not strings or strings[0] != "":
        raise Malformed("pprof string_table[0] is not ''")

    def string(i: int) -> None:
        if not 0 <= i < len(strings):
            raise Malformed(f"pprof string index {i} of {len(strings)}")

    for what in ("mapping", "location", "function"):
        _check_ids(what, prof[what])
    for vt in prof["sample_type"]:
        string(vt["type"])
        string(vt["unit"])
    for m in prof["mapping"]:
        string(m["filename"])
        string(m["build_id"])
    for f in prof["function"]:
        for k in ("name", "system_name", "filename"):
            string(f[k])
    for c in prof["comment"]:
        string(c)
    string(prof["default_sample_type"])
    n_map, n_loc, n_fn = len(prof["mapping"]), len(prof["location"]), len(prof["function"])
    for loc in prof["location"]:
        if not 0 <= loc["mapping_id"] <= n_map:
            raise Malformed(f"pprof location {loc['id']}: mapping {loc['mapping_id']}")
        for line in loc["line"]:
            if not 1 <= line["function_id"] <= n_fn:
                raise Malformed(f"pprof location {loc['id']}: function {line['function_id']}")
    sums = [0] * 4
    for s in prof["sample"]:
        if len(s["value"]) != 4:
            raise Malformed(f"pprof sample with {len(s['value'])} values")
        if not all(1 <= i <= n_loc for i in s["location_id"]):
            raise Malformed(f"pprof sample locations {s['location_id']} of {n_loc}")
        for lab in s["label"]:
            string(lab["key"])
            string(lab["str"])
        for j, v in enumerate(s["value"]):
            sums[j] += v
    expected = [0.0] * 4
    parts = 0  # value rows summed into samples: each sample rounds by at most one half
    for p in profiles:
        for smp in p.samples:
            rows = [t.values for t in smp.threads] if thread_labels and smp.threads else \
                [smp.values]
            parts += len(rows)
            for values in rows:
                for j, k in enumerate(PPROF_ORDER):
                    expected[j] += values[k]
    for j in range(4):
        slack = 0.5 * parts + 1e-9 * abs(expected[j])
        if abs(sums[j] - expected[j]) > slack:
            raise Malformed(f"pprof {prof['sample_type'][j]} values add up to {sums[j]}, "
                            f"the profiles' to {expected[j]}")
    return prof


_COLLAPSED = re.compile(r"^[^\n;]+(;[^\n;]+)* -?[0-9]+$")


def check_collapsed(text: str) -> None:
    """One ``frame;frame;… value`` line per stack, no empty frame, no raw control
    character."""
    plain_text(text, "collapsed stacks", _LINE_BREAKING)
    for line in text.splitlines():
        if not _COLLAPSED.match(line):
            raise Malformed(f"collapsed line {line[:200]!r}")


_CALLGRIND = re.compile(
    r"^(# callgrind format|version: 1|creator: .*|pid: [0-9]+|cmd: .*|positions: line"
    r"|events: \w+|summary: -?[0-9]+|totals: -?[0-9]+|(c?(ob|fl|fn))=\([0-9]+\)( .*)?"
    r"|calls=[0-9]+ -?[0-9]+|-?[0-9]+ -?[0-9]+|)$")


def check_callgrind(text: str) -> None:
    """Every line is one the format knows, and summary equals totals."""
    plain_text(text, "callgrind", _LINE_BREAKING)
    summary = totals = None
    for line in text.split("\n")[:-1]:
        if not _CALLGRIND.match(line):
            raise Malformed(f"callgrind line {line[:200]!r}")
        if line.startswith("summary: "):
            summary = line.split()[1]
        elif line.startswith("totals: "):
            totals = line.split()[1]
    if summary != totals:
        raise Malformed(f"callgrind summary {summary} but totals {totals}")


def check_dot(text: str) -> None:
    """Every DOT line has balanced double quotes and brackets, the graph balanced braces,
    and no raw control character is left in it."""
    plain_text(text, "DOT", _LINE_BREAKING)
    depth = 0
    for line in text.splitlines():
        quoted = False
        brackets = 0
        k = 0
        while k < len(line):
            c = line[k]
            if quoted:
                if c == "\\":
                    k += 1
                elif c == '"':
                    quoted = False
            elif c == '"':
                quoted = True
            elif c == "[":
                brackets += 1
            elif c == "]":
                brackets -= 1
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            k += 1
        if quoted or brackets:
            raise Malformed(f"DOT line with unbalanced quotes or brackets: {line[:200]!r}")
    if depth != 0:
        raise Malformed(f"DOT braces do not balance ({depth})")


_DATA = re.compile(r'<script type="application/json" id="heapscope-data">(.*?)</script>', re.S)


def check_html(page: str) -> None:
    """The page is UTF-8, and its embedded data is strict JSON that no markup in it ends
    early."""
    try:
        page.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Malformed(f"flame graph page is not UTF-8: {e}") from None
    found = _DATA.findall(page)
    if len(found) != 1:
        raise Malformed(f"{len(found)} data elements in the flame graph page")
    data = strict_json(found[0])
    if not isinstance(data, dict) or data.get("format") != "heapscope-flamegraph":
        raise Malformed("the flame graph data is not heapscope-flamegraph")


# ---------------------------------------------------------------------------------------------
# Targets


def _export_args(knobs: Knobs) -> Namespace:
    # What `heapscope export` passes to render(); no binaries, no sysroot.
    return Namespace(sample=knobs.sample, thread_labels=knobs.threads, sysroot=None,
                     binary=[])


def _pprof(data: bytes, scratch: str) -> object:
    knobs = Knobs(data)
    profiles = [prepared(data, scratch, knobs)]
    raw = _written(lambda: export.render("pprof", profiles, _export_args(knobs)))
    return check_pprof(raw, profiles, knobs.threads)


def _text_export(fmt: str) -> Callable[[bytes, str], object]:
    def run(data: bytes, scratch: str) -> object:
        knobs = Knobs(data)
        profiles = [prepared(data, scratch, knobs)]
        out = _written(lambda: export.render(fmt, profiles, _export_args(knobs)))
        try:
            text = out.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Malformed(f"{fmt} export is not UTF-8: {e}") from None
        if fmt == "collapsed":
            check_collapsed(text)
        elif fmt == "callgrind":
            check_callgrind(text)
        else:
            doc = strict_json(text)
            if len(doc["samples"]) != len(profiles[0].samples):
                raise Malformed("the JSON export lost samples")
        return text

    return run


def _top(data: bytes, scratch: str) -> object:
    knobs = Knobs(data)
    profiles = [prepared(data, scratch, knobs)]
    view = View(knobs.sample, knobs.granularity, knobs.cum, knobs.nodecount)
    table, rows = _written(lambda: build_table(profiles, view))
    out = io.StringIO()
    render_table(out, table, rows, granularity=view.granularity, show_bytes=knobs.cum,
                 title="t1" if knobs.threads else "")
    plain_text(out.getvalue(), "top table")
    doc = io.StringIO()
    render_json(doc, table_dict(table, rows))
    strict_json(doc.getvalue())
    return out.getvalue()


def _leak_text(report: LeakReport) -> str:
    out = io.StringIO()
    render_leaks(out, report, top=10, color=False)
    text = out.getvalue()
    plain_text(text, "leak report")
    strict_json(json.dumps(report.as_dict()))
    return text


def _series_report(paths: list[str], knobs: Knobs) -> LeakReport:
    try:
        with fake_symbols():
            series = load_series(4242, paths, OPTIONS, keep_raw=knobs.threads,
                                 frames=knobs.frames)
    except InputError as e:
        _one_line(e)
        raise
    return find_leaks([series])


def _run_report(report: LeakReport, scratch: str) -> str:
    """What `heapscope run` prints at exit and writes as report.json, for ``report``."""
    result = RunResult(4242, -9, 0.0, 1.5, cast(Any, None))  # (the watcher is not read)
    res = SessionResult(scratch + ".session", ["./prog", "--flag"], result, report, [],
                        ["a note"], [])
    out = io.StringIO()
    render_report(out, res, top=5)
    plain_text(out.getvalue(), "run report")
    strict_json(json.dumps(res.report()))
    return out.getvalue()


def _leaks(data: bytes, scratch: str) -> object:
    knobs = Knobs(data)
    path = _write(data, _dump_path(scratch))
    report = _series_report([path], knobs)
    return _leak_text(report), _run_report(report, scratch)


def _flamegraph(data: bytes, scratch: str) -> object:
    knobs = Knobs(data)
    profiles = [prepared(data, scratch, knobs, fold=False)]
    tree = build_tree(profiles, frames=knobs.frames if knobs.site else None)
    page = render_flamegraph(tree, title=profiles[0].source, sources=[profiles[0].source],
                             sample=knobs.sample)
    check_html(page)
    return len(page)


def _graph(data: bytes, scratch: str) -> object:
    knobs = Knobs(data)
    profiles = [prepared(data, scratch, knobs, fold=False)]
    options = GraphOptions(knobs.sample, knobs.granularity, knobs.nodecount)
    graph = build_graph(profiles, options, frames=knobs.frames if knobs.site else None)
    text = to_dot(graph)
    check_dot(text)
    text.encode("utf-8", "backslashreplace")  # as write_graph writes it
    return text


def split_pair(data: bytes) -> tuple[bytes, bytes]:
    """A diff input as (base, new): split at BASE_MARK, else in the middle."""
    new, mark, base = data.partition(BASE_MARK)
    if not mark:
        half = len(data) // 2
        return data[:half], data[half:]
    return base, new


def _diff(data: bytes, scratch: str) -> object:
    knobs = Knobs(data)
    base_data, new_data = split_pair(data)
    base = [prepared(base_data, scratch, knobs, seq=0)]
    new = [prepared(new_data, scratch, knobs, seq=1)]
    # heapscope diff BASE NEW (top --base)
    view = View(knobs.sample, knobs.granularity, knobs.cum, knobs.nodecount)
    d = build_diff(new, view, base)
    table, rows = d.table, d.rows
    out = io.StringIO()
    render_diff(out, d, base, new, granularity=view.granularity)
    plain_text(out.getvalue(), "diff table")
    strict_json(json.dumps(table_dict(table, rows)))
    # the flame graph and call graph against a base
    raw_base = [prepared(base_data, scratch, knobs, seq=0, fold=False)]
    raw_new = [prepared(new_data, scratch, knobs, seq=1, fold=False)]
    tree = build_tree(raw_new, base=raw_base)
    check_html(render_flamegraph(tree, title="diff", sources=["new"], base_sources=["base"],
                                 sample=knobs.sample))
    graph = build_graph(raw_new, GraphOptions(knobs.sample, knobs.granularity), raw_base)
    check_dot(to_dot(graph))
    # export --merge of both, and the leak finder over the two as one process's series
    merged = _written(lambda: export.render("pprof", base + new, _export_args(knobs)))
    check_pprof(merged, base + new, knobs.threads)
    return _leak_text(_series_report([_dump_path(scratch, 0), _dump_path(scratch, 1)], knobs))


def _same(a: Profile, b: Profile) -> None:
    for name in ("samples", "mappings", "sample_types", "period", "sampling", "unsampled",
                 "header", "threads", "pid", "seq", "kind"):
        if getattr(a, name) != getattr(b, name):
            raise Malformed(f"round trip changed {name}: {str(getattr(a, name))[:200]} -> "
                            f"{str(getattr(b, name))[:200]}")
    if dict(a.locations) != dict(b.locations):
        raise Malformed("round trip changed the locations")


def _round_trip(data: bytes, scratch: str) -> object:
    """A session's symbolized copy (load_series(keep_raw) then symbolized.write, as
    `heapscope run` writes it) read back by load() and prepare(); and a profile.proto
    export read back by decode_profile."""
    knobs = Knobs(data)
    path = _write(data, _dump_path(scratch))
    try:
        with fake_symbols():
            series = load_series(4242, [path], OPTIONS, keep_raw=True, frames=knobs.frames)
    except InputError as e:
        _one_line(e)
        raise
    for raw in series.raw:
        copy = scratch + ".4242.0.m0.heap" + symbolized.SUFFIX
        _written(lambda: symbolized.write(raw, copy))  # noqa: B023 (called at once)
        try:
            back = load(copy)
            with fake_symbols():
                again = prepare(copy, OPTIONS, frames=knobs.frames, reuse=False).profile
        except InputError as e:
            raise Malformed(f"heapscope cannot read back its own symbolized copy: {e}") \
                from None
        _same(raw, back)
        if back.time != raw.time and raw.time is not None:
            raise Malformed(f"round trip changed the time {raw.time} -> {back.time}")
        options = PprofOptions(thread_labels=knobs.threads, build_id=lambda m: "")
        proto = _written(lambda: encode_profile([again], options))  # noqa: B023 (at once)
        prof = check_pprof(proto, [again], knobs.threads)
        if prof["period"] != again.period:
            raise Malformed(f"pprof period {prof['period']} for {again.period}")
        if again.time is not None and not math.isclose(prof["time_nanos"] / 1e9, again.time,
                                                       rel_tol=1e-9, abs_tol=1e-6):
            raise Malformed(f"pprof time {prof['time_nanos']} for {again.time}")
    return series


def _folded(pruned: Profile, knobs: Knobs) -> list[object]:
    """A pruned profile folded twice with one memo (the second fold reads every stack from
    it), which samples share a via tuple, the wrappers, and the top table."""
    memo: dict[Any, Any] = {}
    out: list[object] = []
    for again in (False, True):
        folded = fold_module.fold(pruned, None, memo)
        samples = folded.profile.samples
        first: dict[int, int] = {}
        out += [samples, dict(folded.profile.locations),
                [first.setdefault(id(s.via), n) for n, s in enumerate(samples)]]
        # Not again: with every stack in the memo the Python loop classifies fewer
        # addresses, so fewer named wrappers are met (the compiled one meets them all).
        out += [] if again else [folded.wrappers.as_list()]
        table = aggregate_module.aggregate([folded.profile], SAMPLE_INDEX[knobs.sample],
                                           knobs.granularity)
        out += [table.total, aggregate_module.sort_rows(table, knobs.cum)]
    return out


def _exactly_equal(a: object, b: object) -> bool:
    """Equal, or written out the same (a NaN is not equal to itself; huge integers need the
    limit of repr lifted)."""
    if a == b:
        return True
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return repr(a) == repr(b)
    finally:
        sys.set_int_max_str_digits(limit)


def _fold_compiled(data: bytes, scratch: str) -> object:
    """The compiled loops of the fold and the top table (heapscope._native) against the
    Python ones, on the same pruned profile: both must give the same."""
    knobs = Knobs(data)
    pruned = prepared(data, scratch, knobs, fold=False)
    compiled = _folded(pruned, knobs)
    saved = fold_module.core, aggregate_module.core
    fold_module.core = aggregate_module.core = None
    try:
        python = _folded(pruned, knobs)
    finally:
        fold_module.core, aggregate_module.core = saved
    if not _exactly_equal(compiled, python):
        raise AssertionError(f"compiled fold {compiled!r:.300} != Python {python!r:.300}")
    return compiled


def _dump_seeds() -> list[bytes]:
    return [p.read_bytes() for p in _dump_files()]


def _symbolized_seeds() -> list[bytes]:
    """heapscope profiles (symbolized JSON) of the seed dumps, with frames."""
    out = []
    for p in _dump_files():
        profile = load(str(p), threads=True)
        named = fake_symbolize(profile, OPTIONS).profile
        out.append(json.dumps(symbolized.encode(named)).encode())
    return out


def _seeds() -> list[bytes]:
    return _dump_seeds() + _symbolized_seeds()


def _pair_seeds() -> list[bytes]:
    seeds = _seeds()
    # Each seed against itself (a diff of nothing) and against its neighbour.
    return [a + BASE_MARK + b for a, b in zip(seeds, seeds[1:] + seeds[:1], strict=True)] + \
        [s + BASE_MARK + s for s in seeds]


_ALLOWED = (InputError,)

WRITERS = (
    Target("export-pprof", _pprof, _ALLOWED, _seeds),
    Target("export-collapsed", _text_export("collapsed"), _ALLOWED, _seeds),
    Target("export-callgrind", _text_export("callgrind"), _ALLOWED, _seeds),
    Target("export-json", _text_export("json"), _ALLOWED, _seeds),
    Target("top", _top, _ALLOWED, _seeds),
    Target("leaks", _leaks, _ALLOWED, _seeds),
    Target("flamegraph", _flamegraph, _ALLOWED, _seeds),
    Target("graph-dot", _graph, _ALLOWED, _seeds),
    Target("diff", _diff, _ALLOWED, _pair_seeds),
    Target("round-trip", _round_trip, _ALLOWED, _seeds),
    Target("fold-compiled", _fold_compiled, _ALLOWED, _seeds),
)
