"""Which findings a process lists: every site with something to say, then the quiet ones
that held the most at any judged dump (the exit dump set aside), each peak taken from the
series' matrix once."""

from __future__ import annotations

import numpy as np
import pytest

from heapscope.analysis import leaks, trend
from heapscope.analysis.judge import ProcessJudgement
from heapscope.analysis.leaks import Finding, _peaks, _select
from heapscope.analysis.series import ProcessSeries


def finding(function: str, verdict: str, series: list[float]) -> Finding:
    return Finding(1, function, "", 0, "", (function,), series[-2], 1.0, verdict, series)


def test_quiet_sites_follow_the_loud_ones_by_their_peak_over_the_judged_dumps() -> None:
    # Four dumps, the last an exit dump set aside: three judged.
    judged = ProcessJudgement(dumps=4, judged=3, teardown=False, sites=[])
    found = [finding("b", trend.STEADY, [5.0, 9.0, 1.0, 100.0]),
             finding("c", trend.STEADY, [7.0, 7.0, 7.0, 0.0]),
             finding("d", leaks.EXPECTED, [1.0, 20.0, 3.0, 0.0]),
             finding("a", trend.STEADY, [9.0, 2.0, 2.0, 0.0]),
             finding("leak", trend.LEAK, [1.0, 2.0, 3.0, 4.0])]
    values = np.asarray([f.series for f in found])
    series = ProcessSeries(1, ["d0", "d1", "d2", "d3"], [f.stack for f in found], values,
                           values, values, {}, None)
    peaks = _peaks(series, judged, single=False)
    assert peaks == [9.0, 7.0, 20.0, 9.0, 3.0]  # by hand: each row's most in dumps 0..2
    picked = _select(found, peaks, judged, single=False)
    # d held 20; a and b held 9 (a first by name); c held 7. The exit dump's 100 of b
    # counts for nothing.
    assert [f.function for f in picked] == ["leak", "d", "a", "b", "c"]


def test_cut_at_max_findings_keeps_the_biggest_quiet_ones(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    judged = ProcessJudgement(dumps=3, judged=3, teardown=False, sites=[])
    found = [finding(f"s{k}", trend.STEADY, [float(k), float(k), float(k)]) for k in range(5)]
    values = np.asarray([f.series for f in found])
    series = ProcessSeries(1, ["d0", "d1", "d2"], [f.stack for f in found], values, values,
                           values, {}, None)
    monkeypatch.setattr(leaks, "MAX_FINDINGS", 2)
    picked = _select(found, _peaks(series, judged, single=False), judged, single=False)
    assert [f.function for f in picked] == ["s4", "s3"]
