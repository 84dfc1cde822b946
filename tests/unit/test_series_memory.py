"""A long series held once: each dump's counts go back to the system as its row of the
matrices is written, the matrices come out as the column-by-column sums they always were,
and the scan cache reads a series' dumps into pages that can be given back a group at a time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heapscope.analysis import series as series_module
from heapscope.analysis.series import _matrices
from heapscope.formats import scancache
from heapscope.formats.scan import DumpCounts, unsampled
from heapscope.formats.scancache import ScanCache
from heapscope.memory import give_back, returnable
from heapscope.model import Mapping

APP = Mapping(0x400000, 0x401000, 0, "/opt/app", "r-xp", "", True)


def dump(ids: list[int], counts: list[float], nbytes: list[float]) -> DumpCounts:
    """A dump already unsampled (estimates are its own numbers: nothing to scale by hand)."""
    return DumpCounts("d", np.asarray(ids, dtype=np.int64), np.asarray(counts),
                      np.asarray(nbytes), 0, "", False, (APP,))


def three_dumps() -> list[DumpCounts]:
    return [dump([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]),
            dump([], [], []),
            dump([2, 0], [1.0, 5.0], [7.0, 0.0])]


# Stacks 0..3 -> sites 0, 1, 1 and none (an empty stack).
SITE_OF = np.asarray([0, 1, 1, -1], dtype=np.int64)


@pytest.mark.parametrize("release", [False, True])
def test_matrices_are_the_sums_per_site_and_dump(release: bool) -> None:
    dumps = three_dumps()
    values, objects, samples = _matrices(dumps, SITE_OF, 2, release)
    # By hand: dump 0 puts stack 0 in site 0 and stacks 1 and 2 together in site 1 (stack 3
    # has no site); dump 1 is empty; dump 2's stack 0 holds no bytes and is left out.
    assert values.tolist() == [[10.0, 0.0, 0.0], [50.0, 0.0, 7.0]]
    assert objects.tolist() == [[1.0, 0.0, 0.0], [5.0, 0.0, 1.0]]
    assert samples.tolist() == [[1.0, 0.0, 0.0], [5.0, 0.0, 1.0]]
    for m in (values, objects, samples):
        assert m.flags.c_contiguous  # the judge's sums run along rows in memory order
    if release:
        assert all(d.ids.size == d.counts.size == d.nbytes.size == 0 for d in dumps)
    else:
        assert [d.ids.tolist() for d in dumps] == [[0, 1, 2, 3], [], [2, 0]]


def test_matrices_of_a_process_with_no_site() -> None:
    values, objects, samples = _matrices([dump([3], [1.0], [8.0])], SITE_OF, 0, True)
    assert values.shape == objects.shape == samples.shape == (0, 1)


def test_released_matrices_match_kept_ones_bit_for_bit(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Many dumps and sites of random counts: the same bits whether dumps are released (and
    memory given back every few dumps) or not, and as a column-by-column reference."""
    monkeypatch.setattr(series_module, "GIVE_BACK_EVERY", 3)
    rng = np.random.default_rng(5)
    stacks, sites, n = 300, 120, 40
    site_of = rng.integers(-1, sites, stacks)

    def make() -> list[DumpCounts]:
        r = np.random.default_rng(6)
        out = []
        for _ in range(n):
            ids = r.choice(stacks, size=int(r.integers(0, stacks)), replace=False)
            counts = r.integers(0, 50, ids.size).astype(np.float64)
            nbytes = (counts * r.integers(0, 4, ids.size) * 16.0).astype(np.float64)
            out.append(DumpCounts("d", ids.astype(np.int64), counts, nbytes, 4096, "v2",
                                  False, (APP,)))
        return out

    kept = _matrices(make(), site_of, sites, False)
    released = _matrices(make(), site_of, sites, True)
    reference = [np.zeros((sites, n)) for _ in range(3)]
    for j, d in enumerate(make()):
        for m, w in zip(reference, unsampled(d), strict=True):
            for stack, value, b in zip(d.ids, w, d.nbytes, strict=True):
                if site_of[stack] >= 0 and b > 0:
                    m[site_of[stack], j] += value
    for a, b, ref in zip(kept, released, reference, strict=True):
        assert np.array_equal(a.view(np.int64), b.view(np.int64))
        assert np.allclose(a, ref, rtol=1e-12, atol=0)


def test_returnable_memory_is_zeros_and_goes_back_when_dropped() -> None:
    a = returnable((64, 1 << 17), np.dtype(np.float64))  # 64 MiB
    assert a.shape == (64, 1 << 17) and a.dtype == np.float64 and not a.any()
    assert returnable((0, 5), np.dtype(np.int64)).shape == (0, 5)
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc to read the process's size from")
    page = os.sysconf("SC_PAGE_SIZE")

    def resident() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * page

    before = resident()
    a[:] = 1.0
    held = resident()
    del a
    give_back()
    after = resident()
    assert held - before >= 60 << 20
    assert held - after >= 60 << 20


def pages(a: np.ndarray[Any, Any]) -> object:
    """What an array's memory belongs to, past every view."""
    base: object = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


def test_the_cache_reads_the_series_in_its_order_and_lets_go_on_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir()
    # Numbered past 9 so that the order of the file names is not the order of the series.
    paths = []
    for k in (2, 9, 10, 11):
        p = folder / f"jeprof.77.{k}.m{k}.heap"
        p.write_text(f"dump {k}\n")
        paths.append(str(p))
    memory = ScanCache(str(tmp_path / "cache"), 77, paths)
    for k, path in enumerate(paths):
        memory.put(path, DumpCounts(path, np.asarray([k, k + 1], dtype=np.int64),
                                    np.asarray([1.0, float(k)]), np.asarray([8.0, 16.0 * k]),
                                    4096, "v2", False, (APP,), "m", float(k)))
        memory.table.id_of_stack((0x401000 + k,))
    memory.table.id_of_stack((0x402000,))
    memory.save()
    assert memory.entries == {} and memory.get(paths[0]) is None  # the reader's now

    # Two dumps (48 bytes of arrays each) a group: the series' first two share pages, the
    # last two others.
    monkeypatch.setattr(scancache, "GROUP", 64)
    again = ScanCache(str(tmp_path / "cache"), 77, paths)
    got = [again.get(p) for p in paths]
    assert all(d is not None for d in got)
    dumps = [d for d in got if d is not None]
    assert [d.ids.tolist() for d in dumps] == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert [d.nbytes.tolist() for d in dumps] == [[8.0, 0.0], [8.0, 16.0], [8.0, 32.0],
                                                  [8.0, 48.0]]
    assert [d.time for d in dumps] == [0.0, 1.0, 2.0, 3.0]
    assert pages(dumps[0].ids) is pages(dumps[1].nbytes)
    assert pages(dumps[2].counts) is pages(dumps[3].ids)
    assert pages(dumps[1].nbytes) is not pages(dumps[2].ids)
    assert not any(d.ids.flags.writeable or d.counts.flags.writeable for d in dumps)
