"""Judge every allocation site of one process over its series of dumps.

The series becomes two matrices (sites × dumps): estimated live bytes, and the sampled
objects behind them, which the trend tests of :mod:`heapscope.analysis.trend` need. Before
judging:

- the dump written at exit is not a point of the series when three or more dumps were taken
  as the program ran: it comes whenever the program ended (after a clean shutdown, most live
  bytes are already freed), so growth is judged on the running dumps and the exit dump is
  kept as "what was left"; a final dump that repeats the one before it is not counted twice;
- every site is tested, and the leak verdict must also survive the process-wide
  false-discovery control (Benjamini–Hochberg at ``Q_FAMILY`` over the sites that moved),
  so a process with thousands of sites does not collect false leaks by chance;
- sites are also rolled up by leaf line and by leaf function, so that many small stacks
  leaking through the same code are caught together even when none is big enough alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from heapscope.analysis import stats, trend
from heapscope.analysis.series import ProcessSeries, SiteKey
from heapscope.analysis.stats import bh_qvalues

TEARDOWN_SHARE = 0.5  # an exit dump holding less than this share of the dump before it
Q_FAMILY = 0.05  # false-discovery rate of leak verdicts within one process
# Cells judged at once, which bounds the temporaries on long series of big processes. A
# series short enough for the whole-series fit (trend.WHITE_MAX dumps) is judged in blocks of
# BLOCK cells of the process's rows: that fit multiplies matrices, whose rounding depends on
# the rows multiplied together, so its blocks stay where they always were. Longer series are
# judged row by row and take blocks of LONG_BLOCK cells of the rows to judge.
BLOCK = 1 << 21
LONG_BLOCK = 1 << 17
ROLLUP_SHARE = 0.5  # a roll-up is shown when its leaking sites explain less than this


@dataclass
class SiteSeries:
    """One site (or roll-up of sites) of one process: its values and verdict."""

    key: SiteKey
    # Estimated live bytes per dump, exit dump included. Never changed in place: sites whose
    # bytes never changed share one list (see value_lists).
    values: list[float]
    objects: float  # estimated objects at the last judged dump
    trend: trend.Trend | None  # None for a single judged dump
    at_exit: float | None = None  # bytes in the exit dump, when it was set aside
    rollup: str = ""  # "", "line" or "function"
    members: int = 1  # sites in a roll-up

    @property
    def bytes(self) -> float:
        """Live bytes at the last judged dump."""
        return self.values[self.judged - 1] if self.values else 0.0

    @property
    def judged(self) -> int:
        """How many dumps the verdict rests on."""
        return self.trend.dumps if self.trend is not None else 1

    @property
    def verdict(self) -> str:
        """The trend verdict (``live`` without one)."""
        return self.trend.verdict if self.trend is not None else "live"


@dataclass
class ProcessJudgement:
    """All sites of one process, judged."""

    dumps: int  # dumps read
    judged: int  # dumps the verdicts rest on (an exit dump set aside is not one of them)
    teardown: bool  # the exit dump came after a clean shutdown (most memory freed)
    sites: list[SiteSeries]
    rollups: list[SiteSeries] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)  # live bytes per dump
    exit_aside: bool = False  # the exit dump is shown as what was left, not judged


def tore_down(kinds: list[str], totals: list[float]) -> bool:
    """True when the last dump was written at exit after the program freed most of its
    memory (a clean shutdown): then it is not one more point of the series. ``kinds`` are
    the dumps' jemalloc kinds (``f`` final), ``totals`` their live bytes."""
    if len(totals) < 2 or not kinds or kinds[-1] != "f":
        return False
    return totals[-1] < TEARDOWN_SHARE * totals[-2]


def exit_aside(kinds: list[str], n: int) -> bool:
    """True when the last of ``n`` dumps was written at exit and at least three dumps taken
    as the program ran remain: the exit dump comes off the series' clock (whenever the
    program ended), so it is shown as what was left rather than judged as one more point."""
    return n >= 4 and bool(kinds) and kinds[-1] == "f"


def repeats(kinds: list[str], samples: np.ndarray) -> bool:
    """True when the exit dump holds exactly the samples of the dump before it: nothing was
    sampled or freed in between (a program that exits right after its last dump), so it is
    the same moment measured twice, not one more point of the series. ``samples`` has a
    row per site and a column per dump."""
    if samples.shape[1] < 2 or not kinds or kinds[-1] != "f":
        return False
    return bool(np.array_equal(samples[:, -1], samples[:, -2]))


def judge_process(series: ProcessSeries, leaf: dict[SiteKey, tuple[str, str]]
                  ) -> ProcessJudgement:
    """Judge every site of ``series``; ``leaf`` gives each site's (function, leaf line) for
    the roll-ups."""
    n = series.count
    totals = series.totals
    keys = series.sites
    values, counts = series.values, series.samples
    teardown = n >= 3 and tore_down(series.kinds, totals)
    aside = exit_aside(series.kinds, n) or teardown
    judged = n - 1 if aside or (n >= 3 and repeats(series.kinds, counts)) else n
    objects = series.objects if keys else np.zeros((0, n))
    times = _times(series, judged)
    sites = _judge_rows(keys, values, counts, objects, judged, times, aside)
    rollups: list[SiteSeries] = []
    if judged >= 3 and keys:
        rollups = _rollups(keys, values, counts, objects, judged, times, aside, leaf, sites)
    return ProcessJudgement(n, judged, teardown, sites, rollups, totals, aside)


def _times(series: ProcessSeries, judged: int) -> list[float] | None:
    ts = series.times
    if ts is None or len(ts) < judged:
        return None
    ts = ts[:judged]
    return ts if ts[-1] > ts[0] else None


def _judge_rows(keys: list[SiteKey], values: np.ndarray, counts: np.ndarray,
                objects: np.ndarray, judged: int, times: list[float] | None,
                teardown: bool) -> list[SiteSeries]:
    """Each row as a site with its trend verdict (none for a single judged dump).
    ``values``, ``counts`` and ``objects`` are the rows' estimated bytes, sampled objects
    and estimated objects per dump."""
    trends: list[trend.Trend | None] = [None] * len(keys)
    if judged >= 2:
        trends = list(_verdicts(values, counts, objects, judged, times))
    lists = value_lists(values)  # after the verdicts: their temporaries are gone by now
    last_objects = objects[:, judged - 1].tolist()
    at_exit: list[float | None] = values[:, -1].tolist() if teardown else [None] * len(keys)
    return [SiteSeries(k, lists[i], last_objects[i], trends[i], at_exit[i])
            for i, k in enumerate(keys)]


def _verdicts(values: np.ndarray, counts: np.ndarray, objects: np.ndarray, judged: int,
              times: list[float] | None) -> list[trend.Trend]:
    """The trend of each row over the first ``judged`` dumps, with the family-wide
    correction of leak verdicts."""
    y = values[:, :judged]
    c = counts[:, :judged]
    o = objects[:, :judged]
    pick, back = distinct_rows(c, y, o)
    judged_rows = _trends(c, y, o, pick, times)
    return _control_family([judged_rows[b] for b in back.tolist()], y)


def _trends(c: np.ndarray, y: np.ndarray, o: np.ndarray, pick: np.ndarray,
            times: list[float] | None) -> list[trend.Trend]:
    """The trend of each row ``pick`` names (in its order), a block at a time."""
    trends: list[trend.Trend] = []
    for rows in _blocks(pick, c.shape[0], c.shape[1]):
        cb, yb, ob = c[rows], y[rows], o[rows]
        j = trend.judge_counts(cb, yb, ob, times)
        trends.extend(trend.describe_all(j, cb, yb, times))
    return trends


def _blocks(pick: np.ndarray, rows: int, judged: int) -> Iterator[slice | np.ndarray]:
    """The rows of ``pick`` (ascending, out of ``rows``) judged together, in order: slices
    (views) when every row is picked, else selections (copies). See BLOCK."""
    if judged <= trend.WHITE_MAX:
        step = max(1, BLOCK // judged)
        bounds = np.searchsorted(pick, np.arange(0, rows + step, step)).tolist()
    else:
        step = max(1, LONG_BLOCK // judged)
        bounds = list(range(0, pick.size + step, step))
    everything = pick.size == rows
    for lo, hi in itertools.pairwise(bounds):
        hi = min(hi, pick.size)
        if lo < hi:
            yield slice(lo, hi) if everything else pick[lo:hi]


def distinct_rows(c: np.ndarray, y: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows to judge, and for each row the position among them of the row judged for it).

    Most sites of a big process hold the same objects dump after dump: their rows are level,
    and level rows with the same counts, bytes and objects have the same trend to the last
    bit (a level row's statistics come from its own numbers alone), so one of them is
    judged for all. Rows are compared by their bits, so that no two rows that differ in any
    way (not even 0.0 against -0.0) share a judgement.
    """
    rows = c.shape[0]
    level = np.ones(rows, dtype=np.bool_)
    for a in (c, y, o):
        bits = a.view(np.int64)
        level &= np.all(bits[:, 1:] == bits[:, :1], axis=1)
    every = np.arange(rows, dtype=np.int64)
    flat = np.flatnonzero(level)
    if flat.size < 2:
        return every, every
    firsts = np.stack([a[flat, 0] for a in (c, y, o)], axis=1).view(np.int64)
    _, first, inverse = np.unique(firsts, axis=0, return_index=True, return_inverse=True)
    rep = every.copy()
    rep[flat] = flat[first[inverse.reshape(-1)]]
    pick = np.flatnonzero(rep == every)
    return pick, np.searchsorted(pick, rep)


def value_lists(values: np.ndarray) -> list[list[float]]:
    """Each row of ``values`` as a list of floats, a run of equal values sharing one float,
    and rows that hold one value throughout sharing one list.

    A process's 20,000 sites over 300 dumps are six million values; most sites hold the
    same bytes for long runs of dumps (most of them for the whole series), so a float per
    run and a list per level row save both the time to make them and the memory they take
    (hundreds of MB otherwise). The lists are values: nobody changes them in place.
    """
    n = values.shape[1]
    if n < 2:
        return values.tolist()  # type: ignore[no-any-return]
    bits = values.view(np.int64)
    change = bits[:, 1:] != bits[:, :-1]
    runs = np.count_nonzero(change, axis=1).tolist()
    firsts = values[:, 0].tolist()
    keys = bits[:, 0].tolist()  # the bits of each row's value: 0.0 is not -0.0
    level: dict[int, list[float]] = {}
    out: list[list[float]] = []
    for i, r in enumerate(runs):
        if r == 0:
            row = level.get(keys[i])
            if row is None:
                row = level[keys[i]] = [firsts[i]] * n
            out.append(row)
        elif 4 * r > n:
            out.append(values[i].tolist())
        else:
            cuts = [0, *(np.flatnonzero(change[i]) + 1).tolist(), n]
            row = []
            for v, a, b in zip(values[i, cuts[:-1]].tolist(), cuts, cuts[1:], strict=False):
                row += [v] * (b - a)
            out.append(row)
    return out


def _control_family(trends: list[trend.Trend], y: np.ndarray) -> list[trend.Trend]:
    """Benjamini–Hochberg over the sites that moved: a leak verdict needs q ≤ Q_FAMILY.

    Sites whose series never changed cannot be leaks under any test, so they are left out
    of the family (they would only dilute it). A leak that fails the correction is
    ``growing``: it drifts up, but not surely enough among this many sites. A series too
    short to tell a leak from a filling cache counts its ``growing`` sites against
    ``--fail-on-leak``, so there they must pass the same correction (or be ``steady``).
    """
    moved = np.flatnonzero(np.ptp(y, axis=1) > 0).tolist()
    short = y.shape[1] < trend.MIN_WINDOW
    p = [min(trends[i].p_value, stats.normal_sf(trends[i].rise_z)) if short
         else trends[i].p_value for i in moved]
    q = bh_qvalues(p)
    out = list(trends)
    for i, qi in zip(moved, q, strict=True):
        t = trends[i]
        verdict = t.verdict
        if verdict == trend.LEAK and qi > Q_FAMILY:
            verdict = trend.GROWING
        if verdict == trend.GROWING and short and qi > Q_FAMILY:
            verdict = trend.STEADY
        out[i] = t.with_verdict(verdict, qi)
    return out


def _rollups(keys: list[SiteKey], values: np.ndarray, counts: np.ndarray,
             objects: np.ndarray, judged: int,
             times: list[float] | None, teardown: bool, leaf: dict[SiteKey, tuple[str, str]],
             sites: list[SiteSeries]) -> list[SiteSeries]:
    """Leaks found only by summing sites that share a leaf line, or a leaf function.

    A roll-up is reported when it is a leak and the sites already called leak explain less
    than half of its growth (otherwise it would only repeat them).
    """
    growth = {s.key: max(s.trend.growth, 0.0) for s in sites
              if s.trend is not None and s.trend.verdict == trend.LEAK}
    reported: list[SiteSeries] = []
    covered: set[SiteKey] = set(growth)
    live = values[:, :judged].max(axis=1) > 0  # stacks that only ever held nothing join none
    for kind, pick in (("line", 1), ("function", 0)):
        groups: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            name = leaf.get(k, ("", ""))[pick]
            if name and live[i]:
                groups.setdefault(name, []).append(i)
        names = [g for g, rows in groups.items() if len(rows) >= 2]
        if not names:
            continue
        v, c, objs = (np.empty((len(names), values.shape[1])) for _ in range(3))
        for r, g in enumerate(names):
            v[r] = values[groups[g]].sum(axis=0)
            c[r] = counts[groups[g]].sum(axis=0)
            objs[r] = objects[groups[g]].sum(axis=0)
        # Only the roll-ups reported become sites: most of a big process's are not.
        found = _verdicts(v, c, objs, judged, times)
        for row, (g, t) in enumerate(zip(names, found, strict=True)):
            if t.verdict != trend.LEAK or t.growth <= 0:
                continue
            explained = sum(growth.get(keys[i], 0.0) for i in groups[g] if keys[i] in covered)
            if explained >= ROLLUP_SHARE * t.growth:
                continue
            reported.append(SiteSeries((g,), v[row].tolist(), float(objs[row, judged - 1]), t,
                                       float(v[row, -1]) if teardown else None, kind,
                                       len(groups[g])))
            for i in groups[g]:
                covered.add(keys[i])
                growth.setdefault(keys[i], max(float(values[i, judged - 1] - values[i, 0]), 0.0))
    return reported
