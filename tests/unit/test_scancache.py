"""The scan cache: a series' scanned dumps written and read back as they were, and any file
that is not what it wrote (cut short, grown, another format, ids past its table) ignored."""

from __future__ import annotations

import hashlib
import marshal
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from heapscope.formats.scan import DumpCounts
from heapscope.formats.scancache import ScanCache
from heapscope.model import Mapping

LIBC = Mapping(0x7F0000000000, 0x7F0000200000, 0, "/usr/lib/libc.so.6", "r-xp", "ab12")
APP = Mapping(0x400000, 0x401000, 0, "/opt/app", "r-xp", "", True)


@pytest.fixture()
def dumps(tmp_path: Path) -> list[str]:
    folder = tmp_path / "dumps"
    folder.mkdir()
    paths = []
    for k in range(3):
        p = folder / f"jeprof.77.{k}.m{k}.heap"
        p.write_text(f"dump {k}\n")
        paths.append(str(p))
    return paths


def remembered(cache: Path, paths: list[str]) -> ScanCache:
    """A cache that scanned ``paths``: two stacks, then a third from the second dump on."""
    memory = ScanCache(str(cache), 77, paths)
    a = memory.table.id_of_text("0x401000 0x7f0000001000")
    b = memory.table.id_of_text("0x401010")
    c = memory.table.id_of_text("0x401020 0x401000")
    rows = [([a, b], [1.0, 3.0], [4096.0, 96.0], (APP,), None),
            ([a, b, c], [2.0, 3.0, 1.0], [8192.0, 96.0, 5000.0], (APP, LIBC), 10.5),
            ([c, a], [7.0, 2.0], [35000.0, 8192.0], (APP, LIBC), 11.25)]
    for path, (ids, counts, nbytes, maps, time) in zip(paths, rows, strict=True):
        memory.put(path, DumpCounts(path, np.asarray(ids, dtype=np.int64),
                                    np.asarray(counts), np.asarray(nbytes), 524288, "v2",
                                    False, maps, "m", time))
    return memory


def the_file(cache: Path) -> Path:
    (entry,) = (cache / "series").iterdir()
    return entry


def test_a_series_is_read_back_as_it_was_scanned(tmp_path: Path, dumps: list[str]) -> None:
    cache = tmp_path / "cache"
    remembered(cache, dumps).save()
    again = ScanCache(str(cache), 77, dumps)
    assert again.table.stacks == [(0x401000, 0x7F0000001000), (0x401010,), (0x401020, 0x401000)]
    assert again.table.ids["0x401010"] == 1
    got = [again.get(p) for p in dumps]
    assert all(d is not None for d in got)
    first, second, third = (d for d in got if d is not None)
    assert first.ids.tolist() == [0, 1] and first.counts.tolist() == [1.0, 3.0]
    assert first.nbytes.tolist() == [4096.0, 96.0]
    assert first.mappings == (APP,) and first.time is None
    assert second.ids.tolist() == [0, 1, 2] and second.nbytes.tolist() == [8192.0, 96.0, 5000.0]
    assert second.mappings == (APP, LIBC) and second.time == 10.5
    assert third.ids.tolist() == [2, 0] and third.counts.tolist() == [7.0, 2.0]
    assert (third.period, third.sampling, third.unsampled, third.kind) == (524288, "v2", False,
                                                                          "m")
    assert third.path == dumps[2]
    # What was scanned is shared by every reader of the series: nobody may change it.
    assert not third.ids.flags.writeable and not third.counts.flags.writeable


def test_the_arrays_follow_the_head_as_raw_bytes(tmp_path: Path, dumps: list[str]) -> None:
    """Every dump's ids, then every dump's counts, then every dump's bytes, each eight bytes
    a value, after the head's length, its 16-byte BLAKE2b digest and the head (7 values of
    each kind: 2 + 3 + 2)."""
    cache = tmp_path / "cache"
    remembered(cache, dumps).save()
    data = the_file(cache).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    head = data[24:24 + length]
    assert data[8:24] == hashlib.blake2b(head, digest_size=16).digest()
    start = 24 + length + (-(24 + length) % 8)
    assert len(data) - start == 3 * 7 * 8
    ids, counts, nbytes = (np.frombuffer(data, dtype, 7, start + 56 * k)
                           for k, dtype in enumerate((np.int64, np.float64, np.float64)))
    assert ids.tolist() == [0, 1, 0, 1, 2, 2, 0]
    assert counts.tolist() == [1.0, 3.0, 2.0, 3.0, 1.0, 7.0, 2.0]
    assert nbytes.tolist() == [4096.0, 96.0, 8192.0, 96.0, 5000.0, 35000.0, 8192.0]


def test_dumps_no_longer_asked_for_are_dropped(tmp_path: Path, dumps: list[str]) -> None:
    cache = tmp_path / "cache"
    remembered(cache, dumps).save()
    later = ScanCache(str(cache), 77, dumps)
    assert later.get(dumps[1]) is not None
    os.unlink(dumps[2])
    Path(dumps[0]).write_text("dump 0, written again\n")  # another size: scanned again
    extra = str(Path(dumps[0]).with_name("jeprof.77.3.m3.heap"))
    Path(extra).write_text("dump 3\n")
    later.put(extra, DumpCounts(extra, np.asarray([1]), np.asarray([4.0]),
                                np.asarray([128.0]), 524288, "v2", False, (APP,), "m", 12.0))
    later.save()
    last = ScanCache(str(cache), 77, dumps)
    assert last.get(dumps[0]) is None
    kept = last.get(dumps[1])
    assert kept is not None and kept.counts.tolist() == [2.0, 3.0, 1.0]
    new = last.get(extra)
    assert new is not None and new.ids.tolist() == [1] and new.nbytes.tolist() == [128.0]


@pytest.mark.parametrize("damage", ["cut", "grown", "head", "format", "flipped", "unequal",
                                    "beyond", "negative"])
def test_a_file_it_did_not_write_is_ignored(tmp_path: Path, dumps: list[str],
                                            damage: str) -> None:
    cache = tmp_path / "cache"
    remembered(cache, dumps).save()
    entry = the_file(cache)
    data = bytearray(entry.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    ids_at = 24 + length + (-(24 + length) % 8)
    if damage == "cut":
        data = data[:-5]
    elif damage == "grown":
        data += b"\0" * 8
    elif damage == "head":
        data[:8] = struct.pack("<Q", len(data) + 1)
    elif damage == "format":
        data[24:24 + length] = bytes(length)
    elif damage == "flipped":  # one bit of the head: its digest no longer matches
        data[24 + length // 2] ^= 0x10
    elif damage == "unequal":
        # A head written with its digest, whose first dump has one id fewer than counts and
        # the second one more: the file's size still adds up.
        fmt, stacks, texts, maps, rows = marshal.loads(bytes(data[24:24 + length]))
        rows = [list(r) for r in rows]
        (a0, b0, c0), (a1, b1, c1) = rows[0][1], rows[1][1]
        rows[0][1], rows[1][1] = (a0 - 1, b0, c0), (a1 + 1, b1, c1)
        head = marshal.dumps((fmt, stacks, texts, maps, [tuple(r) for r in rows]))
        assert len(head) == length
        data[8:24] = hashlib.blake2b(head, digest_size=16).digest()
        data[24:24 + length] = head
    elif damage == "beyond":
        data[ids_at:ids_at + 8] = struct.pack("<q", 3)  # the table holds stacks 0..2
    else:
        data[ids_at:ids_at + 8] = struct.pack("<q", -1)
    entry.write_bytes(bytes(data))
    again = ScanCache(str(cache), 77, dumps)
    assert again.entries == {} and again.table.stacks == []
    assert all(again.get(p) is None for p in dumps)
