"""The agent's window (analysis/window.py): each round the series ``leaks`` would read.

A simulated process (tests/leaksim.py dumps) with sites that come and go is judged through a
window sliding over its dumps; every position must give the report ``load_series`` +
``find_leaks`` give for the same dumps, while naming only what is new.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import heapscope.analysis.window as window_mod
from heapscope.analysis.leaks import find_leaks
from heapscope.analysis.series import group_by_pid, load_series
from heapscope.analysis.window import Window
from heapscope.errors import InputError
from heapscope.symbols import SymbolOptions
from tests import leaksim as ls

# Sampled objects per dump of five one-frame stacks (code offsets); 0 = absent from that dump.
SERIES = {
    0x100: [10, 14, 18, 21, 25, 30, 34, 37, 41, 46, 50, 54, 58, 61],  # leak
    0x200: [0, 0, 0, 40, 80, 120, 119, 121, 120, 118, 122, 120, 119, 121],  # late cache
    0x300: [50, 10, 0, 20, 60, 5, 90, 0, 70, 15, 85, 25, 0, 33],  # churn, sometimes empty
    0x400: [100] * 14,  # a table
    0x500: [0] * 9 + [3, 6, 9, 12, 15],  # a late leak
    0x600: [4, 4, 4] + [0] * 11,  # freed early: leaves the window
    0x700: [2] + [0] * 10 + [2, 2, 2],  # leaves the window, and comes back
}
SIZE = 5


def _write(folder: Path) -> list[str]:
    return ls.write_counts(folder, 4242, SERIES)


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.9g}")  # sums over sites in another order differ in the last bits
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def _report(series: Any) -> str:
    """The report's JSON, suspects in a fixed order: a window numbers its stacks in the order
    it first met them, ``load_series`` in the order of its dumps, so rows (and suspects of
    equal rank) may come in another order."""
    doc = find_leaks([series], root=series.pid).as_dict()
    doc["suspects"].sort(key=lambda f: (f["function"], f["stack"], f.get("rollup", "")))
    return json.dumps(_rounded(doc), sort_keys=True, default=str)


def _rows(series: Any) -> dict[Any, tuple[list[float], list[float]]]:
    return {k: (series.values[i].tolist(), series.samples[i].tolist())
            for i, k in enumerate(series.sites)}


@pytest.fixture
def dumps(tmp_path: Path) -> list[str]:
    (pid, group), = group_by_pid(_write(tmp_path / "dumps")).items()
    assert pid == 4242 and len(group) == 14
    return group


def test_every_position_judges_as_leaks_does(dumps: list[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    options = SymbolOptions(cache_dir=None)
    named: list[int] = []  # addresses handed to the symbolizer, round by round
    real = window_mod.symbolize

    def counting(profile: Any, opts: SymbolOptions) -> Any:
        named.append(len(profile.addresses()))
        return real(profile, opts)

    monkeypatch.setattr(window_mod, "symbolize", counting)
    w = Window(4242, SIZE, options)
    for k, path in enumerate(dumps, 1):
        w.add(path)
        got = w.series()
        want = load_series(4242, dumps[max(0, k - SIZE):k], options)
        assert got.paths == want.paths
        assert _rows(got) == _rows(want)
        assert _report(got) == _report(want), f"window ending at dump {k}"
    # Each of the five addresses was named once, when its stack first came.
    assert sum(named) == len(SERIES)
    # The sites are named again only when the window's set of stacks changed. Counted by
    # hand from SERIES (0x300 is in every window of five): at dump 1 (the first), 4 (0x200
    # joins), 6 (0x700 leaves), 8 (0x600 leaves), 10 (0x500 joins), 12 (0x700 is back).
    assert w.renamed == 6


def test_a_bad_dump_changes_nothing(dumps: list[str], tmp_path: Path) -> None:
    w = Window(4242, SIZE, SymbolOptions(cache_dir=None))
    for path in dumps[:3]:
        w.add(path)
    before = _report(w.series())
    bad = tmp_path / "jeprof.4242.99.m99.heap"
    bad.write_text("heap_v2/4096\n  t*: nonsense\n")
    with pytest.raises(InputError):
        w.add(str(bad))
    assert w.paths == dumps[:3]
    assert _report(w.series()) == before
    assert w.gave_up(str(bad))
    # A dump that was still being written: once it has grown, it is read again.
    bad.write_text(Path(dumps[3]).read_text())
    assert not w.gave_up(str(bad))
    w.add(str(bad))
    assert w.paths == [*dumps[:3], str(bad)] and not w.refused


def test_drop_forgets_a_deleted_dump(dumps: list[str]) -> None:
    options = SymbolOptions(cache_dir=None)
    w = Window(4242, SIZE, options)
    for path in dumps[:4]:
        w.add(path)
    w.drop(dumps[1])
    assert w.paths == [dumps[0], dumps[2], dumps[3]]
    want = load_series(4242, [dumps[0], dumps[2], dumps[3]], options)
    assert _report(w.series()) == _report(want)


def test_stacks_that_come_and_go_do_not_pile_up(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose stacks change all the time (each lives three dumps): the window's
    table of stacks is rebuilt once it holds four times what the window uses, and every
    position still judges as ``leaks`` does."""
    monkeypatch.setattr(window_mod, "COMPACT_MIN", 0)
    n = 40
    sites = {}
    for k in range(n):  # stack 0x10*k+0x1000 holds 5 samples at dumps k, k+1, k+2 only
        counts = np.zeros((1, n))
        counts[0, k:k + 3] = 5
        sites[0x1000 + 0x10 * k] = ls.Series(counts, 4096, 4096, False)
    sites[0x100] = ls.Series(np.asarray([[10.0 + 3 * t for t in range(n)]]), 4096, 4096, False)
    (pid, dumps), = group_by_pid([str(p) for p in ls.write_series(tmp_path, 77, sites, 0)]
                                 ).items()
    options = SymbolOptions(cache_dir=None)
    w = Window(pid, 4, options)
    for k, path in enumerate(dumps, 1):
        w.add(path)
        got = w.series()
        used = len(got.sites)
        assert len(w.scanner.table.stacks) <= window_mod.COMPACT * used, k
        if k % 5 == 0 or k == len(dumps):
            want = load_series(pid, dumps[max(0, k - 4):k], options)
            assert _rows(got) == _rows(want) and _report(got) == _report(want), k
    # One new stack a dump, 6-7 in use at a time: without a rebuild the table would hold
    # all 41 by the end, past four times what is used.
    assert w.compacted >= 1
