"""Readers: every heap_v2 dialect, legacy headers, gzip, file names, and bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from heapscope.errors import InputError
from heapscope.formats.load import load, parse_dump_name
from heapscope.formats.maps import parse_maps_line

DATA = Path(__file__).parent.parent / "data" / "dumps"


def test_heap_v2_dialects() -> None:
    p = load(str(DATA / "dialects.heap"), threads=True)
    assert p.period == 524288
    assert p.sampling == "v2"
    assert p.header == (10, 5242880, 0, 0)
    assert [(t.id, t.name) for t in p.threads] == [(0, "main"), (1, "pool worker 7")]
    assert len(p.samples) == 3
    first, bare, third = p.samples
    assert first.stack == (0x7F0000001010, 0x555555555200, 0x555555555300)
    assert first.values == (6, 1048576, 0, 0)
    assert [t.thread for t in first.threads] == [0]
    assert bare.stack == ()
    assert bare.values == (1, 4096, 0, 0)
    assert third.threads[0].thread == 1


def test_maps_spaces_deleted_and_anonymous() -> None:
    p = load(str(DATA / "dialects.heap"))
    paths = [(m.path, m.deleted, m.executable) for m in p.mappings]
    assert ("/opt/my app/bin/server", False, True) in paths
    assert ("/usr/lib/libold.so.1", True, True) in paths
    anon = [m for m in p.mappings if m.anonymous and m.executable]
    assert len(anon) == 1 and anon[0].start == 0x7F0000010000


def test_threads_skipped_unless_asked() -> None:
    p = load(str(DATA / "dialects.heap"))
    assert all(s.threads == () for s in p.samples)


def test_macos_and_freebsd_map_lines() -> None:
    mac = parse_maps_line("0000000100000000-0000000100004000: /usr/local/bin/prog")
    assert mac is not None and mac.path == "/usr/local/bin/prog" and mac.executable
    bsd = parse_maps_line(
        "0x400000 0x401000 -1 1 0xfffff800 r-x 1 0 0x1000 COW NC vnode /bin/cat NCH -1"
    )
    assert bsd is not None and bsd.path == "/bin/cat" and bsd.start == 0x400000


@pytest.mark.parametrize(
    ("header", "sampling", "period"),
    [
        ("heap profile:    3:   3072 [    5:   5120] @ heap_v2/524288", "v2", 524288),
        ("heap profile:    3:   3072 [    5:   5120] @ heap/1048576", "v1", 524288),
        ("heap profile:    3:   3072 [    5:   5120] @ heapprofile", "none", 0),
        ("heap profile:    3:   3072 [    5:   5120] @ growth", "none", 0),
        ("heap profile:    3:   3072 [    3:   3072]", "v1", 131072),
        ("heap profile:    3:   3072 [    5:   5120]", "none", 0),
    ],
)
def test_legacy_headers(tmp_path: Path, header: str, sampling: str, period: int) -> None:
    body = (DATA / "legacy_v2.heap").read_text().splitlines()[1:]
    f = tmp_path / "x.heap"
    f.write_text("\n".join([header, *body]) + "\n")
    p = load(str(f))
    assert (p.sampling, p.period) == (sampling, period)
    assert p.samples[0].values == (2, 2048, 3, 3072)
    assert p.samples[0].stack == (0x400100, 0x400200)
    assert p.mappings[0].path == "/bin/legacy"


def test_gzip(tmp_path: Path) -> None:
    f = tmp_path / "jeprof.77.3.i12.heap.gz"
    f.write_bytes(gzip.compress((DATA / "dialects.heap").read_bytes()))
    p = load(str(f))
    assert len(p.samples) == 3
    assert (p.pid, p.seq, p.kind) == (77, 3, "i")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("jeprof.2613573.0.f.heap", (2613573, 0, "f", -1)),
        ("/run/x/jeprof.12.4.m10.heap", (12, 4, "m", 10)),
        ("pre.fix.4026531836.99.1.u3.heap", (99, 1, "u", 3)),
        ("jeprof.5.0.i9.heap.gz", (5, 0, "i", 9)),
    ],
)
def test_dump_names(name: str, expected: tuple[int, int, str, int]) -> None:
    d = parse_dump_name(name)
    assert d is not None
    assert (d.pid, d.seq, d.kind, d.index) == expected
    assert parse_dump_name("profile.heap") is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary data"),
        (b"hello world\n", "not a jemalloc heap profile"),
        (b"heap_v2/524288\n  t*: 1: 2 [0: 0]\n@ 0x1 0x2\n", "truncated"),
        (b"heap_v2/524288\n@ 0xzz\n", "bad address"),
        (b"heap_v2/524288\n  t*: one: 2 [0: 0]\n", "malformed count line"),
        (b"\x1f\x8b\x08\x00garbage", "gzip"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path: Path, content: bytes, problem: str) -> None:
    f = tmp_path / "bad.heap"
    f.write_bytes(content)
    with pytest.raises(InputError) as e:
        load(str(f))
    msg = str(e.value)
    assert msg.startswith(str(f) + ": ")
    assert problem in msg
    assert "\n" not in msg


def test_complete_records_without_a_memory_map_load(tmp_path: Path) -> None:
    f = tmp_path / "nomaps.heap"
    f.write_bytes(b"heap_v2/524288\n  t*: 1: 2 [0: 0]\n@ 0x1 0x2\n  t*: 1: 64 [0: 0]\n")
    p = load(str(f))
    assert p.mappings == () and [s.stack for s in p.samples] == [(1, 2)]


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load(str(tmp_path / "nope.heap"))
    with pytest.raises(InputError, match="is a directory"):
        load(str(tmp_path))


def test_extension_record_lines_are_skipped(tmp_path: Path) -> None:
    """Lines a patched jemalloc adds to a record (the proposed fragmentation profiler's
    ``f:``/``frag_util:``) neither break the per-thread parse nor change the counts."""
    f = tmp_path / "frag.heap"
    f.write_bytes(b"heap_v2/1\n  t*: 1: 64 [0: 0]\n  t0: 1: 64 [0: 0] main\n@ 0x1 0x2\n"
                  b"  t*: 1: 64 [0: 0]\n  f: 1: 4096 [0: 0]\n  frag_util: 0.5\n"
                  b"  t0: 1: 64 [0: 0]\n\nMAPPED_LIBRARIES:\n")
    p = load(str(f), threads=True)
    (s,) = p.samples
    assert s.values[:2] == (1.0, 64.0)
    assert [(t.thread, t.values[:2]) for t in s.threads] == [(0, (1.0, 64.0))]


def test_input_errors_cross_process_boundaries() -> None:
    """Parallel scans send a dump's error back from a worker process: it must unpickle."""
    import pickle

    e = pickle.loads(pickle.dumps(InputError("a.heap", "truncated")))
    assert (str(e), e.path, e.problem) == ("a.heap: truncated", "a.heap", "truncated")
