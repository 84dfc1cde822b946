"""The leak/bounded/churn/steady classifier on simulated sampled series with known truth.

The simulator reproduces jemalloc's sampling object by object: every allocation of size s is
sampled with probability 1-exp(-s/R) and then counts s/p in the estimate for as long as it
lives, so noise is cumulative for leaks and renewed for caches, as in real dumps.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable

import pytest

from heapscope.analysis import trend

STEPS = 40
KIB = 1024
MIB = 1024 * 1024


class Site:
    """Live sampled objects of one allocation site."""

    def __init__(self, rng: random.Random, period: int, size: int) -> None:
        self.rng, self.period, self.size = rng, period, size
        self.p = 1 - math.exp(-size / period)
        self.live: deque[bool] = deque()

    def alloc(self, nbytes: int) -> None:
        for _ in range(nbytes // self.size):
            self.live.append(self.rng.random() < self.p)

    def free_oldest(self, nbytes: int) -> None:
        for _ in range(min(len(self.live), nbytes // self.size)):
            self.live.popleft()

    def estimate(self) -> float:
        return sum(self.live) * self.size / self.p


Plan = Callable[[int, Site], None]


def linear(rate: int, start: int = 0) -> Plan:
    def step(t: int, s: Site) -> None:
        if t >= start:
            s.alloc(rate)
    return step


def cache(rate: int, cap: int) -> Plan:
    def step(t: int, s: Site) -> None:
        s.alloc(rate)
        over = len(s.live) * s.size - cap
        if over > 0:
            s.free_oldest(over)
    return step


def square(low: int, high: int, every: int = 5) -> Plan:
    def step(t: int, s: Site) -> None:
        want = high if (t // every) % 2 else low
        have = len(s.live) * s.size
        s.free_oldest(have)  # a new working set each phase: renewed objects
        s.alloc(want)
    return step


def once(nbytes: int) -> Plan:
    def step(t: int, s: Site) -> None:
        if t == 0:
            s.alloc(nbytes)
    return step


Scenario = dict[str, tuple[Plan, str]]


def scenarios(x: int = 1) -> dict[str, Scenario]:
    """The known-truth scenarios, amounts multiplied by ``x`` (for sparser sampling)."""
    return {
        "leak beside a bigger warming cache": {
            "leak_linear": (linear(40 * KIB * x), trend.LEAK),
            "cache_fill": (cache(400 * KIB * x, 4 * MIB * x), trend.BOUNDED),
            "startup_table": (once(2 * MIB * x), trend.STEADY),
        },
        "two leaks of different rates": {
            "leak_fast": (linear(100 * KIB * x), trend.LEAK),
            "leak_slow": (linear(20 * KIB * x), trend.LEAK),
        },
        "a leak that starts late": {
            "leak_late": (linear(80 * KIB * x, start=24), trend.LEAK),
            "table": (once(1 * MIB * x), trend.STEADY),
        },
        "churn with large swings": {
            "churn_buffers": (square(1 * MIB * x, 8 * MIB * x), trend.CHURN),
            "table": (once(1 * MIB * x), trend.STEADY),
        },
    }


SCENARIOS = scenarios()


def simulate(plans: Scenario, period: int, seed: int,
             size: int = KIB) -> dict[str, list[float]]:
    rng = random.Random(seed)
    sites = {name: Site(rng, period, size) for name in plans}
    series: dict[str, list[float]] = {name: [] for name in plans}
    for t in range(STEPS):
        for name, (plan, _truth) in plans.items():
            plan(t, sites[name])
            series[name].append(sites[name].estimate())
    return series


CASES = [(name, period, factor) for name in SCENARIOS
         for period, factor in ((1, 1), (4 * KIB, 1), (64 * KIB, 4), (512 * KIB, 16))]


def _verdicts(name: str, period: int, factor: int, seed: int) -> dict[str, trend.Trend]:
    series = simulate(scenarios(factor)[name], period, seed)
    return {site: trend.classify(ys, None, period, KIB) for site, ys in series.items()}


@pytest.mark.parametrize(("name", "period", "factor"), CASES)
def test_scenarios_across_sample_periods(name: str, period: int, factor: int) -> None:
    for seed in range(5):
        got = _verdicts(name, period, factor, seed)
        for site, (_plan, truth) in SCENARIOS[name].items():
            assert got[site].verdict == truth, (
                f"{name} R={period} x{factor} seed {seed}: {site} is {got[site].verdict}, "
                f"truth {truth}")


def test_precision_and_recall_of_leak_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    tp = fp = fn = bounded_as_leak = 0
    for name, period, factor in CASES:
        for seed in range(10, 20):
            got = _verdicts(name, period, factor, seed)
            for site, (_plan, truth) in SCENARIOS[name].items():
                said = got[site].verdict == trend.LEAK
                tp += said and truth == trend.LEAK
                fp += said and truth != trend.LEAK
                fn += (not said) and truth == trend.LEAK
                bounded_as_leak += said and truth == trend.BOUNDED
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    with capsys.disabled():
        print(f"\nleak verdict over {len(CASES) * 10} simulated runs: precision {precision:.3f},"
              f" recall {recall:.3f} (tp {tp}, fp {fp}, fn {fn})")
    assert bounded_as_leak == 0
    assert precision == 1.0
    assert recall == 1.0


def test_ranking_by_evidence_and_size() -> None:
    got = _verdicts("two leaks of different rates", 4 * KIB, 1, 3)
    assert got["leak_fast"].score > got["leak_slow"].score
    mixed = _verdicts("leak beside a bigger warming cache", 4 * KIB, 1, 3)
    assert mixed["leak_linear"].verdict == trend.LEAK
    assert mixed["cache_fill"].rise > mixed["leak_linear"].rise  # bigger, yet not a leak


def test_late_leak_first_growth_and_rate() -> None:
    for seed in range(5):
        t = _verdicts("a leak that starts late", 4 * KIB, 1, seed)["leak_late"]
        assert t.first_growth is not None and abs(t.first_growth - 24) <= 2
        assert t.slope_per_dump == pytest.approx(80 * KIB, rel=0.15)
        assert t.fit > 0.95


def test_statistics() -> None:
    z, tau = trend.mann_kendall([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert tau == 1.0 and z > 3.5
    assert trend.mann_kendall([5, 5, 5, 5])[0] == 0.0
    assert trend.theil_sen([0, 1, 2, 3, 4], [0, 2, 4, 6, 100]) == 2.0
    assert trend.hinge([0, 0, 0, 0, 0, 1, 2, 3, 4, 5]) == 4
    assert trend.r_squared([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)


def test_two_dumps() -> None:
    assert trend.classify([1 * MIB, 5 * MIB], None, 4096, 1024).verdict == trend.LEAK
    assert trend.classify([1 * MIB, 1 * MIB + 100], None, 4096, 1024).verdict == trend.STEADY


def test_per_second_rate_with_times() -> None:
    ys = [i * 1000.0 for i in range(10)]
    t = trend.classify(ys, [2.0 * i for i in range(10)], 1, 100)
    assert t.verdict == trend.LEAK and t.slope_per_s == pytest.approx(500.0)
