"""Judging a whole process: exit dumps set aside, the family-wide control of leak verdicts,
and roll-ups that catch many small stacks leaking through one function.

Processes are built from tests/leaksim.py's object-level simulation (one site per plan).
"""

from __future__ import annotations

import numpy as np

from heapscope.analysis import trend
from heapscope.analysis.judge import judge_process
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
