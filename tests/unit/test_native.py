"""The compiled loops (heapscope._native) give exactly what the Python loops give.

The Python code of each pass is the reference; these tests run both on the same inputs:
mutated and generated dumps for the parser, generated symbolized profiles for unsample,
prune, fold and the top table.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heapscope import native
from heapscope.analysis import aggregate, fold, prune, tree, unsample
from heapscope.analysis.aggregate import sort_rows
from heapscope.errors import InputError
from heapscope.formats import cache, jemalloc, scan
from heapscope.formats.jemalloc import parse_heap_v2, parse_heap_v2_text
from heapscope.model import Profile, Sample, ViaFrame
from tests.unit.builders import Builder

DATA = Path(__file__).parent.parent / "data" / "dumps"
CORPUS = Path(__file__).parent.parent / "fuzz" / "corpus"
SEEDS = [(DATA / "dialects.heap").read_text(), (CORPUS / "jemalloc-5.3.m0.heap").read_text(),
         (CORPUS / "cpp-all-sampled.f.heap").read_text()]
PASSES = (native, jemalloc, cache, unsample, prune, fold, aggregate, tree)
core = native.core


def test_the_compiled_loops_are_built() -> None:
    # setup.sh installs gcc and Python's headers, so the extension must be there: without it
    # every dump loads several times slower.
    assert core is not None, native.describe()


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in PASSES:
        monkeypatch.setattr(module, "core", None)


def _parsed(text: str) -> object:
    """What reading ``text`` gives: the profile's parts, or the one-line error."""
    try:
        p = parse_heap_v2_text("t.heap", text)
    except InputError as e:
        return str(e)
    return (p.samples, p.mappings, p.header, p.threads, p.period)


def _reference(text: str) -> object:
    try:
        p = parse_heap_v2("t.heap", text.splitlines())
    except InputError as e:
        return str(e)
    return (p.samples, p.mappings, p.header, p.threads, p.period)


def test_a_real_dump_is_read_by_the_compiled_loop() -> None:
    assert core is not None
    for text in SEEDS[1:]:
        first, maps_at = text.find("\n@"), text.find("\nMAPPED_LIBRARIES:")
        got = core.parse_records(text, first + 1, maps_at + 1, Sample)
        assert got is not None and len(got) == text.count("\n@")
        assert _parsed(text) == _reference(text)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.integers(min_value=0, max_value=10**6),
       st.integers(min_value=0, max_value=40),
       st.sampled_from(["", " ", "\t", "\r", "\n", "\n\n", "0x", "@", "@ 0x10\n", "t*: 1: 2",
                        "  t*: 1: 2 [3: 4]\n", "  t7: 1: 2 [3: 4]\n", "[", "]", ":", "g",
                        "12345678901234567890", "0x12345678901234567", "\x0b", "\x1c",
                        "\x85", "é", "<jemalloc>: x\n", "  f: 1\n", "-0x1", "0x_1"]))
def test_mutated_dumps_read_the_same(seed: str, at: int, drop: int, insert: str) -> None:
    at %= len(seed) + 1
    text = seed[:at] + insert + seed[at + drop:]
    assert _parsed(text) == _reference(text)


def test_a_record_after_a_lone_line_break_in_the_header() -> None:
    """A thread line ended by a lone carriage return (or another break Python's splitlines
    knows) followed by the first record: every path reads that record (the compiled one
    once took it as part of the header and lost it; hypothesis found the case)."""
    for brk in ("\r", "\x0b", "\x85"):
        text = ("heap_v2/524288\n  t*: 10: 5242880 [0: 0]\n  t1: 4: 4194304 [0: 0]" + brk
                + "@ 0x7f0000001010 0x555555555200\n  t*: 6: 1048576 [0: 0]\n"
                "@ 0x7f0000002020\n  t*: 4: 4194304 [0: 0]\n\nMAPPED_LIBRARIES:\n")
        got = _parsed(text)
        assert got == _reference(text), brk
        assert not isinstance(got, str) and [s.values[0] for s in got[0]] == [6.0, 4.0], brk


def _dump(rng: random.Random) -> str:
    """A well-formed dump in the shapes jemalloc writes, with the variations it allows."""
    addrs = [rng.choice(["0x", ""]) + f"{rng.getrandbits(rng.choice([12, 47, 64])):x}"
             for _ in range(40)]
    out = ["heap_v2/524288", "  t*: 5: 640 [0: 0]", "  t0: 5: 640 [0: 0] main thread"]
    for _ in range(rng.randrange(1, 60)):
        stack = " ".join(rng.choice(addrs) for _ in range(rng.randrange(0, 25)))
        out.append(f"@ {stack}" if stack else "@")
        nums = [rng.choice([0, 1, 7, 2**40, 10**19 - 1]) for _ in range(4)]
        sep = rng.choice([" ", "  ", "\t"])
        out.append(f"  t*:{sep}{nums[0]}:{sep}{nums[1]} [{nums[2]}:{sep}{nums[3]}]")
        for t in range(rng.randrange(0, 3)):
            out.append(f"  t{t}: 1: 2 [3: 4]")
        if rng.random() < 0.1:
            out.append("")
    out += ["", "MAPPED_LIBRARIES:", "55d0a0000000-55d0a0010000 r-xp 00000000 08:01 1 /srv/a"]
    return "\n".join(out) + "\n"


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_generated_dumps_read_the_same_by_the_compiled_loop(seed: int) -> None:
    assert core is not None
    text = _dump(random.Random(seed))
    first, maps_at = text.find("\n@"), text.find("\nMAPPED_LIBRARIES:")
    assert core.parse_records(text, first + 1, maps_at + 1, Sample) is not None
    assert _parsed(text) == _reference(text)


# ---- the passes over a symbolized profile, and the flame graph's tree ----

NAMES = ["je:je_malloc_default", "je:imalloc_body", "libc:malloc", "libc:strdup",
         "operator new", "xmalloc@util.c:10", "std::vector<int>::_M_realloc@/usr/include/c++/12/"
         "bits/vector.tcc:5", "xml:xmlStrndup", "xml:xmlParse", "?exe", "?exe2",
         "Java_Foo_bar", "pg:palloc", "pg:ExecInit", "wrap@w.c:3", "parse@p.c:40",
         "inl@p.c:41;outer@p.c:50", "handle@h.c:9", "main@m.c:1", "helper@m.c:20",
         "alloc::raw_vec::finish_grow", "app::run@src/main.rs:7"]


def _profile(rng: random.Random) -> Profile:
    b = Builder()
    samples = []
    for _ in range(rng.randrange(1, 80)):
        depth = rng.randrange(0, 12)
        stack = [rng.choice(NAMES) for _ in range(depth)]
        values = tuple(float(rng.choice([0, 1, 3, 64, 4096, 10**6])) for _ in range(4))
        samples.append(b.sample(*stack, values=values))
    # Callers of a thin wrapper from several places, so the profile shows one.
    for caller in ("parse@p.c:40", "handle@h.c:9", "helper@m.c:20"):
        samples.append(b.sample("libc:malloc", "wrap@w.c:3", caller, "main@m.c:1"))
    return b.profile(*samples)


def _passes(p: Profile) -> Iterator[object]:
    raw = p.with_(unsampled=False, sampling="v2", period=524288)
    yield unsample.unsample(raw).samples
    pruned = prune.prune(p)
    yield pruned.samples, dict(pruned.locations)
    folded = fold.fold(pruned)
    yield folded.profile.samples, dict(folded.profile.locations), folded.wrappers.as_list()
    for granularity in ("functions", "lines"):
        for index in range(4):
            table = aggregate.aggregate([folded.profile], index, granularity)
            yield table.total, sort_rows(table)
    yield folded.profile.addresses(), folded.profile.caller_addresses()
    for invert in (False, True):
        yield tree.build_tree([p], invert=invert, frames=fold.FramePolicy()).to_json()
        yield tree.build_tree([folded.profile, p], invert=invert, base=[pruned]).to_json()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32))
def test_passes_give_the_same_with_and_without_the_compiled_loops(seed: int) -> None:
    p = _profile(random.Random(seed))
    compiled = list(_passes(p))
    with pytest.MonkeyPatch.context() as mp:
        _python_only(mp)
        reference = list(_passes(_profile(random.Random(seed))))
    assert compiled == reference


def _via_sharing(samples: tuple[Sample, ...]) -> list[int]:
    """Per sample, the index of the first sample holding the same via tuple (reports count
    chains by identity, so which samples share one is part of a fold's answer)."""
    first: dict[int, int] = {}
    return [first.setdefault(id(s.via), n) for n, s in enumerate(samples)]


def _folds(p: Profile) -> Iterator[object]:
    """Folding twice with one memo (the second fold reads every stack from it), which samples
    share via tuples, and the top table's rows with the sample whose chain each row shows
    (the chain most of its value went through, summed per chain by identity)."""
    memo: dict[tuple[int, ...], tuple[tuple[int, ...], int, tuple[ViaFrame, ...]]] = {}
    pruned = prune.prune(p)
    for _ in range(2):
        folded = fold.fold(pruned, None, memo)
        samples = folded.profile.samples
        yield samples, dict(folded.profile.locations), _via_sharing(samples)
        holder = {id(s.via): n for n, s in reversed(list(enumerate(samples)))}
        for granularity in ("functions", "lines"):
            for index in range(4):
                rows = sort_rows(aggregate.aggregate([folded.profile], index, granularity))
                yield [(r, holder.get(id(r.via), -1) if r.via else -1) for r in rows]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32))
def test_the_compiled_cut_and_via_sums_give_what_python_gives(seed: int) -> None:
    compiled = list(_folds(_profile(random.Random(seed))))
    with pytest.MonkeyPatch.context() as mp:
        _python_only(mp)
        reference = list(_folds(_profile(random.Random(seed))))
    assert compiled == reference


def test_a_thin_wrapper_is_cut_off_with_one_chain_per_leaf_and_caller() -> None:
    # wrap (one call site, three callers) is a wrapper: each stack is cut to its caller, the
    # chain is wrap's frame; stacks with the same leaf and caller share one chain tuple.
    b = Builder()
    samples = [b.sample("wrap@w.c:3", caller, "main@m.c:1", values=(1, v, 1, v))
               for caller, v in (("parse@p.c:40", 10), ("handle@h.c:9", 20),
                                 ("helper@m.c:20", 40), ("parse@p.c:40", 80))]
    samples[3] = b.sample("wrap@w.c:3", "parse@p.c:40", "main@m.c:2", values=(1, 80, 1, 80))
    p = b.profile(*samples)
    folded = fold.fold(p)
    got = folded.profile.samples
    assert [s.stack for s in got] == [tuple(s.stack[1:]) for s in samples]
    assert all([f.function for f in s.via] == ["wrap"] for s in got)
    # Leaf and caller alike (samples 0 and 3): one tuple; the others each their own.
    assert _via_sharing(got) == [0, 1, 2, 0]
    assert folded.wrappers.found == {"wrap": 3}
    table = aggregate.KeyTable()
    aggregate._accumulate(folded.profile, 1, "functions", table)
    parse = table.ids[aggregate.Key("parse", "p.c", 0, "app")]
    # parse's flat value through its one chain: 10 + 80 by hand.
    assert list(table.via[parse].values()) == [90.0]
    assert table.heaviest_via(parse) is got[0].via


# ------------------------------------------------------------------- ELF symbol tables


def _symbol_entry(rng: random.Random, elf64: bool, endian: str, strings: bytes) -> bytes:
    """One raw symbol-table entry: mostly functions, with the cases the filter must tell
    apart (other types, undefined, size 0, unnamed or out-of-range names, huge values)."""
    kind = rng.choice([2, 2, 2, 10, 1, 0, 3, 4])  # FUNC, GNU_IFUNC, OBJECT, NOTYPE, …
    info = rng.choice([0, 1, 2, 10, 15]) << 4 | kind
    shndx = rng.choice([0, 1, 14, 0xFFF1])
    size = rng.choice([0, 1, 16, rng.randrange(1 << 20)])
    top = (1 << 64) if elf64 else (1 << 32)
    value = rng.randrange(1 << 24)
    if rng.random() < 0.004:  # near the top: in ELF64 the end may pass 64 bits
        value = rng.choice([top - 1, top - size // 2 - 1, rng.randrange(top)])
    name = rng.choice([0, 1, len(strings) - 1, len(strings), len(strings) + 7,
                       rng.randrange(max(1, len(strings)))])
    if elf64:
        return struct.pack(endian + "IBBHQQ", name, info, 0, shndx, value, size)
    return struct.pack(endian + "IIIBBH", name, value, size, info, 0, shndx)


@pytest.mark.parametrize("seed", range(60))
def test_symbol_tables_are_filtered_and_sorted_the_same(seed: int) -> None:
    from heapscope.symbols import symtab

    rng = random.Random(seed)
    elf64, little = rng.random() < 0.7, rng.random() < 0.8
    strings = b"\0" + b"\0".join(rng.choice([b"f", b"", b"main", b"_Z3foov"])
                                 for _ in range(rng.randrange(1, 40))) + b"\0"
    entries = [_symbol_entry(rng, elf64, "<" if little else ">", strings)
               for _ in range(rng.randrange(0, 300))]
    data = b"".join(entries) + bytes(rng.randrange(3))  # a torn last entry is ignored

    class Elf:  # what _function_rows reads of the headers
        pass

    elf = Elf()
    elf.elf64, elf.little, elf.endian = elf64, little, "<" if little else ">"  # type: ignore[attr-defined]
    reference = symtab._function_rows(elf, (data, strings), named=True)[0]  # type: ignore[arg-type]
    assert core is not None
    columns = core.function_columns(data, strings, elf64, little)
    if columns is None:
        # an end does not fit in 64 bits: Python does it
        assert any(end >= 1 << 64 for _, end, _, _ in reference)
        return
    rows = sorted(reference)
    assert list(zip(*columns[:4], strict=True)) == rows
    assert columns[4] == list(itertools.accumulate((end for _, end, _, _ in rows), max))


# ---- the counts of a series' dumps (heapscope.formats.scan) ----


def _counts(paths: list[str], compiled: bool, jobs: int = 1) -> list[object]:
    """What a fresh Scanner reads of ``paths``: per dump its stacks (as addresses), counts,
    bytes and the facts around them, or the one-line error; with or without the compiled
    loop (the Python regular expression is the reference)."""
    saved = scan.core
    scan.core = core if compiled else None
    try:
        scanner = scan.Scanner()
        got = scanner.read_all(paths, jobs=jobs)
    finally:
        scan.core = saved
    out: list[object] = []
    for d in got:
        if isinstance(d, InputError):
            out.append(str(d))
            continue
        out.append((d.path, [scanner.table.stacks[i] for i in d.ids.tolist()],
                    d.counts.tolist(), d.nbytes.tolist(), d.period, d.sampling, d.unsampled,
                    d.mappings, d.kind, d.time, d.locations))
    return out


def _scanned_compiled(data: bytes) -> bool:
    """Whether the compiled loop reads ``data`` itself (rather than leaving it to Python)."""
    ids: dict[int, int] = {}
    texts: list[bytes] = []
    return scan._scan_bytes(data, ids, texts) is not None


def test_real_dumps_are_counted_by_the_compiled_scan(tmp_path: Path) -> None:
    assert core is not None
    paths = []
    for i, text in enumerate(SEEDS[1:]):
        path = tmp_path / f"jeprof.1.{i}.m{i}.heap"
        path.write_text(text)
        paths.append(str(path))
        assert _scanned_compiled(text.encode())
    got = _counts(paths, compiled=True)
    assert got == _counts(paths, compiled=False)
    # Hand count of the first real dump: its records and the sum of their t* counts.
    text = SEEDS[1]
    counts = [int(line.split(":")[1]) for line in text.splitlines()
              if line.lstrip().startswith("t*:") and "\n@" in text]
    first = got[0]
    assert not isinstance(first, str)
    assert len(first[1]) == text.count("\n@")
    assert sum(first[2]) == sum(counts[1:])  # the first t* line is the header's total


def test_the_compiled_scan_finds_what_a_hand_count_says(tmp_path: Path) -> None:
    text = ("heap_v2/524288\n  t*: 9: 900 [0: 0]\n  t0: 9: 900 [0: 0] main\n"
            "@ 0x10 0x20\n  t*: 2: 200 [0: 0]\n  t0: 2: 200 [0: 0]\n"
            "@ 0x30\n\tt*:\t3:\t300\t[0: 0]\n"
            "@ 0x10 0x20\n  t*: 4: 400 [0: 0]\n"
            "@\n  t*: 0: 0 [0: 0]\n"
            "\nMAPPED_LIBRARIES:\n55d0a0000000-55d0a0010000 r-xp 00000000 08:01 1 /srv/a\n")
    path = tmp_path / "jeprof.7.0.i0.heap"
    path.write_text(text)
    assert _scanned_compiled(text.encode())
    got = _counts([str(path)], compiled=True)
    assert got == _counts([str(path)], compiled=False)
    (_, stacks, counts, nbytes, period, _, _, mappings, kind, _, _), = got  # type: ignore[misc]
    assert stacks == [(0x10, 0x20), (0x30,), (0x10, 0x20), ()]
    assert counts == [2.0, 3.0, 4.0, 0.0]
    assert nbytes == [200.0, 300.0, 400.0, 0.0]
    assert (period, kind, len(mappings)) == (524288, "i", 1)


@pytest.mark.parametrize("odd", [
    "  t*: 1: 2 [0: 0]\n<jemalloc>: a message\n",  # jemalloc's message among the records
    "  t*: 1: 2\r\n",  # carriage returns
    "  t*: 12345678901234567890: 2 [0: 0]\n",  # 20 digits
    "\n",  # a record without its counts line
    "  t*: 1: 2 [0: 0]\n  t0: 1: 2 [0: 0] thread é\n",  # not ASCII
])
def test_unusual_records_are_left_to_python(tmp_path: Path, odd: str) -> None:
    text = ("heap_v2/8\n  t*: 1: 2 [0: 0]\n@ 0x10\n  t*: 1: 2 [0: 0]\n@ 0x20\n" + odd
            + "\nMAPPED_LIBRARIES:\n")
    assert not _scanned_compiled(text.encode())
    path = tmp_path / "jeprof.7.0.i0.heap"
    path.write_bytes(text.encode())
    assert _counts([str(path)], compiled=True) == _counts([str(path)], compiled=False)


def test_a_refused_dump_leaves_no_stack_behind() -> None:
    assert core is not None
    numbered: list[str] = []
    texts = scan.ByteTexts(lambda t: numbered.append(t) or len(numbered) - 1)
    good = b"heap_v2/8\n@ 0x10\n  t*: 1: 2 [0: 0]\n\nMAPPED_LIBRARIES:\n"
    bad = b"heap_v2/8\n@ 0x10\n  t*: 1: 2 [0: 0]\n@ 0x30\n\nMAPPED_LIBRARIES:\n"
    assert texts.scan(bad) is None
    assert (texts.ids, texts.texts, numbered) == ({}, [], [])
    got = texts.scan(good)
    assert got is not None and got[0].tolist() == [0] and texts.texts == [b"0x10"]
    # A stack the numbering refuses (not hex) takes the dump's new stacks back with it.
    strict = scan.ByteTexts(lambda t: [int(a, 16) for a in t.split()] and 0)
    assert strict.scan(good.replace(b"0x10", b"0x10 zz")) is None
    assert (strict.ids, strict.texts) == ({}, [])


_MUTATIONS = ["", " ", "\t", "\r", "\n", "\n\n", "\n \n", "0x", "@", "@ 0x10\n", "t*: 1: 2",
              "  t*: 1: 2 [3: 4]\n", "  t7: 1: 2 [3: 4]\n", "[", "]", ":", "g",
              "12345678901234567890", "0x12345678901234567", "\x0b", "\x1c", "\x85", "é",
              "<jemalloc>: x\n", "  f: 1\n", "-0x1", "0x_1", "MAPPED_LIBRARIES:\n",
              "\nMAPPED_LIBRARIES:", "heap_v2/1\n", "\x00"]


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(SEEDS), st.integers(min_value=0, max_value=10**6),
       st.integers(min_value=0, max_value=40), st.sampled_from(_MUTATIONS),
       st.sampled_from(["utf-8", "latin-1"]))
def test_mutated_dumps_count_the_same(tmp_path: Path, seed: str, at: int, drop: int,
                                      insert: str, encoding: str) -> None:
    at %= len(seed) + 1
    path = tmp_path / "jeprof.3.1.m1.heap"
    path.write_bytes((seed[:at] + insert + seed[at + drop:]).encode(encoding))
    assert _counts([str(path)], compiled=True) == _counts([str(path)], compiled=False)


def test_parallel_scans_count_the_same(tmp_path: Path) -> None:
    """A series long enough to scan in parallel (threads with the compiled loop, worker
    processes without it), a few odd dumps among its plain ones."""
    rng = random.Random(5)
    paths = []
    for i in range(scan.PARALLEL_MIN + 8):
        text = _dump(rng)
        if i % 7 == 3:
            text = text.replace("\n@", "\n<jemalloc>: odd\n@", 1)
        if i % 11 == 5:
            text = text.replace("@", "@ 0xzz", 1)  # not an address: the dump is refused
        path = tmp_path / f"jeprof.9.{i}.m{i}.heap"
        path.write_text(text)
        paths.append(str(path))
    got = _counts(paths, compiled=True, jobs=2)
    assert got == _counts(paths, compiled=False, jobs=2)
    assert got == _counts(paths, compiled=False, jobs=1)
    assert [i for i, d in enumerate(got) if isinstance(d, str)] == [5, 16]
