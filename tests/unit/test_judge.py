"""Judging a whole process: exit dumps set aside, the family-wide control of leak verdicts,
and roll-ups that catch many small stacks leaking through one function.

Processes are built from tests/leaksim.py's object-level simulation (one site per plan).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from heapscope.analysis import judge, trend
from heapscope.analysis.judge import distinct_rows, judge_process, value_lists
from heapscope.analysis.series import ProcessSeries, SiteKey
from tests import leaksim as ls

R = 64 * 1024


def process(sites: dict[SiteKey, ls.Series], kinds: list[str] | None = None) -> ProcessSeries:
    """A ProcessSeries whose rows are the simulated sites (run 0 of each)."""
    n = max(s.counts.shape[1] for s in sites.values())
    samples = np.zeros((len(sites), n))
    for i, s in enumerate(sites.values()):
        samples[i, : s.counts.shape[1]] = s.counts[0]
    per_sample = np.asarray([s.size / s.p for s in sites.values()])[:, None]
    objects = samples / np.asarray([s.p for s in sites.values()])[:, None]
    return ProcessSeries(1, [f"d{t}" for t in range(n)], list(sites), samples * per_sample,
                         objects, samples, {k: (i,) for i, k in enumerate(sites)}, None,
                         [60.0 * t for t in range(n)], kinds=kinds or ["m"] * n)


def sim(plan: ls.Plan, n: int, seed: int, teardown: bool = False) -> ls.Series:
    return ls.simulate(plan, n, R, 1, np.random.default_rng(seed), teardown=teardown)


def test_exit_dump_after_teardown_is_not_judged() -> None:
    sites = {("leak",): sim(ls.Plan(ls.LEAK, leak=4, size=256), 20, 1, teardown=True),
             ("table",): sim(ls.Plan(ls.NOT_LEAK, steady=200, size=256), 20, 2, teardown=True)}
    j = judge_process(process(sites, ["m"] * 20 + ["f"]), {})
    assert j.teardown and j.dumps == 21 and j.judged == 20
    by = {s.key: s for s in j.sites}
    assert by[("leak",)].verdict == trend.LEAK
    assert by[("leak",)].at_exit == 0.0
    assert by[("table",)].verdict == trend.STEADY


def test_exit_dump_repeating_the_last_one_is_not_a_new_point() -> None:
    leak = sim(ls.Plan(ls.LEAK, leak=20, size=256), 3, 3)
    repeated = ls.Series(np.concatenate([leak.counts, leak.counts[:, -1:]], axis=1),
                         leak.size, leak.period, False)
    j = judge_process(process({("leak",): repeated}, ["m", "m", "m", "f"]), {})
    assert not j.teardown and j.judged == 3
    assert j.sites[0].verdict == trend.LEAK


def test_thousands_of_caches_bring_no_false_leak_and_hide_no_real_one() -> None:
    """2,000 caches turning over 30% a dump (each alone a leak in ~0.5% of runs), one real
    leak: the false-discovery control keeps the caches out and lets the leak through."""
    rng = np.random.default_rng(11)
    caches = ls.simulate(ls.Plan(ls.NOT_LEAK, cache=50, turnover=0.3, size=256), 20, R, 2000,
                         rng)
    sites: dict[SiteKey, ls.Series] = {
        (f"cache{i}",): ls.Series(caches.counts[i:i + 1], 256, R, False) for i in range(2000)}
    sites[("leak",)] = sim(ls.Plan(ls.LEAK, leak=4, steady=20, size=256), 20, 12)
    j = judge_process(process(sites), {})
    leaks = [s.key for s in j.sites if s.verdict == trend.LEAK]
    assert leaks == [("leak",)]
    raw = trend.judge_counts(caches.counts.astype(float))
    assert raw.verdict.count(trend.LEAK) >= 1  # without the control, caches would slip in


def test_many_small_stacks_leaking_through_one_function_roll_up() -> None:
    """400 call paths into the same function each gain a sample every ~10 dumps: no path
    is a leak on its own, their sum is (one roll-up finding, not one per path)."""
    rng = np.random.default_rng(21)
    small = ls.simulate(ls.Plan(ls.LEAK, leak=0.1, size=64), 30, R, 400, rng)
    sites: dict[SiteKey, ls.Series] = {
        ("parse_field parser.c:88", f"caller{i} x.c:{i}"): ls.Series(
            small.counts[i:i + 1], 64, R, False) for i in range(400)}
    sites[("table",)] = sim(ls.Plan(ls.NOT_LEAK, steady=100, size=64), 30, 22)
    leaf = {k: ("parse_field", "parse_field parser.c:88") for k in sites if len(k) == 2}
    j = judge_process(process(sites), leaf)
    assert not [s for s in j.sites if s.verdict == trend.LEAK]
    assert len(j.rollups) == 1, [(r.key, r.rollup) for r in j.rollups]
    r = j.rollups[0]
    sampled = int(np.sum(small.counts.max(axis=1) > 0))  # paths seen in any dump at all
    assert r.key == ("parse_field parser.c:88",) and r.rollup == "line"
    assert r.members == sampled
    assert r.verdict == trend.LEAK
    assert r.trend is not None and r.trend.slope_per_dump > 0


def test_level_rows_share_a_judgement_only_when_equal_to_the_bit() -> None:
    """Rows 0, 1 and 4 hold one sample of 64 bytes at every dump: judged once (as row 0).
    Row 2 is level with other numbers, row 3 moves, row 5 is row 0 but for the sign of a
    zero, row 6 differs from row 0 in its objects only: each is judged for itself."""
    c = np.asarray([[1, 1, 1], [1, 1, 1], [2, 2, 2], [1, 2, 3], [1, 1, 1], [1, 1, 1],
                    [1, 1, 1]], dtype=np.float64)
    y = np.asarray([[64, 64, 64], [64, 64, 64], [64, 64, 64], [64, 128, 192], [64, 64, 64],
                    [64, 64, 64], [64, 64, 64]], dtype=np.float64)
    o = np.ones_like(c)
    o[6] = 2.0
    y[5] = [-0.0, -0.0, -0.0]
    y[0] = y[1] = y[4] = [0.0, 0.0, 0.0]
    pick, back = distinct_rows(c, y, o)
    assert pick.tolist() == [0, 2, 3, 5, 6]
    assert back.tolist() == [0, 0, 1, 2, 0, 3, 4]


@pytest.mark.parametrize("n", [24, 72])
def test_each_site_is_judged_as_if_it_were_alone(n: int, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    """300 sites that hold the same objects at every dump (six kinds of them), beside a
    leak and a cache: each one's trend is the trend of a process holding that site alone
    (but for the q-value of the two that moved, which depends on the family). The long
    series is judged in blocks of one row."""
    monkeypatch.setattr(judge, "LONG_BLOCK", n)
    rng = np.random.default_rng(31)
    sites: dict[SiteKey, ls.Series] = {}
    for i in range(300):
        held = np.full((1, n), float(1 + i % 3))
        sites[(f"held{i}",)] = ls.Series(held, 256 * (1 + i % 2), R, False)
    sites[("leak",)] = sim(ls.Plan(ls.LEAK, leak=4, steady=20, size=256), n, 32)
    sites[("cache",)] = ls.simulate(ls.Plan(ls.NOT_LEAK, cache=50, turnover=0.3, size=256),
                                    n, R, 1, rng)
    j = judge_process(process(sites), {})
    assert {s.key: s.verdict for s in j.sites}[("leak",)] == trend.LEAK
    for s in j.sites:
        (alone,) = judge_process(process({s.key: sites[s.key]}), {}).sites
        assert s.trend is not None and alone.trend is not None
        if s.key[0].startswith("held"):
            assert s.trend == alone.trend and s.trend.q_value is None, s.key
        else:
            assert replace(s.trend, q_value=None) == replace(alone.trend, q_value=None)
        assert s.values == alone.values and s.objects == alone.objects


def test_blocks_of_short_series_stay_where_the_process_rows_put_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows 0, 2, 3, 5 and 9 of ten are judged. Three dumps, four rows a block: the blocks
    are those of all ten rows (0-3, 4-7, 8-9). Sixty-one dumps (past the whole-series fit),
    two rows a block: two of the rows judged at a time."""
    monkeypatch.setattr(judge, "BLOCK", 12)
    monkeypatch.setattr(judge, "LONG_BLOCK", 122)
    pick = np.asarray([0, 2, 3, 5, 9])
    short = [b.tolist() for b in judge._blocks(pick, 10, 3) if isinstance(b, np.ndarray)]
    assert short == [[0, 2, 3], [5], [9]]
    long = [b.tolist() for b in judge._blocks(pick, 10, 61) if isinstance(b, np.ndarray)]
    assert long == [[0, 2], [3, 5], [9]]
    every = list(judge._blocks(np.arange(10), 10, 3))
    assert every == [slice(0, 4), slice(4, 8), slice(8, 10)]


def test_value_lists_are_the_rows_with_a_float_per_run() -> None:
    values = np.asarray([[5.0] * 8, [1.0, 2, 3, 4, 5, 6, 7, 8],
                         [0.0, 0.0, 0.0, 9.5, 9.5, 9.5, 9.5, -0.0], [5.0] * 8, [0.0] * 8,
                         [-0.0] * 8])
    lists = value_lists(values)
    assert lists == values.tolist()
    assert [math.copysign(1.0, v) for v in lists[2][-2:]] == [1.0, -1.0]
    held, moving, runs, same, zero, negative = lists
    assert all(v is held[0] for v in held)
    assert same is held  # level rows of one value share their list ...
    assert zero is not negative and math.copysign(1.0, negative[0]) == -1.0  # ... bit for bit
    assert runs[3] is runs[6] and runs[0] is runs[2] and runs[7] is not runs[0]
    assert len({id(v) for v in moving}) == 8
    assert value_lists(np.zeros((2, 0))) == [[], []]
    assert value_lists(np.asarray([[3.0], [4.0]])) == [[3.0], [4.0]]
