"""Judge allocation sites' live memory over a series of dumps: leak, bounded, growing, churn.

The model follows how jemalloc samples. A dump holds, per site, the number ``c`` of sampled
objects still live; a sampled object stays until its object is freed. So a site's count is
a *persistent* part (objects that stay: leaked objects, or a cache's content, which changes
only as objects are added or evicted) plus a *transient* part (objects renewed between dumps:
request buffers). In sample units:

    c[t] = P[t] + E[t],   P[t] - P[t-1] = δ + η[t],   Var η = s_p²,   Var E = s_t²

``δ`` is the drift: new samples per dump that are never freed. A pure leak is a random walk
with drift whose steps are Poisson counts (s_p² = δ); transient objects add white noise; a
cache's evictions and refills make its content wander (a mean-reverting walk, which this model
treats as a free one: the safe side for a drift test). The increments d[t] = c[t] - c[t-1]
then have

    Var d = s_p² + 2·s_t²,   Cov(d[t], d[t+1]) = -s_t²

so both noise parts are estimated from the series itself, and the variance of a least-squares
slope over m dumps follows in closed form (:mod:`heapscope.analysis.noise`).

Verdicts, from the tests in :func:`judge_counts` (all one-sided, with stated levels):

- **leak**: positive drift over the recent window (the last half, at least ``MIN_WINDOW``
  dumps) at level ``ALPHA_LEAK``, and no significant slowdown in the last third;
- **bounded**: the level rose well above its counting noise, then stopped: the last third is
  flat (a cache that filled, a leak that stopped);
- **growing**: it rose, or drifts up, but not surely enough for ``leak``; :func:`more_dumps`
  says about how many more dumps would settle it;
- **churn**: no lasting rise, but swings of more than a quarter of the peak and more than the
  counting noise;
- **steady**: none of these.

Every statistic is computed for many sites at once (the rows of a matrix, one column per dump)
in time linear in the number of dumps.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heapscope.analysis.noise import (
    Index,
    Matrix,
    Sums,
    dispersion_allowance,
    hinge,
    slope_variance,
    split_noise,
    variogram,
)
from heapscope.analysis.stats import normal_sf, t_quantile, t_sf

LEAK = "leak"
GROWING = "growing"
BOUNDED = "bounded"
CHURN = "churn"
STEADY = "steady"

ALPHA_LEAK = 0.01  # one-sided level of the drift test behind `leak`
Z_SLOWDOWN = 2.326  # one-sided 1%: the slope fell in the last third
Z_RISE = 3.09  # one-sided 0.1%: the end lies above the start (beyond counting noise)
Z_GROWING = 1.645  # one-sided 5%: enough for "growing"
MIN_NEW_SAMPLES = 3  # leak and growing need at least this many new samples in the window
VARIOGRAM_MIN = 12  # series at least this long estimate the noise split from many lags
SHORT = 5  # up to this many dumps, growth must also clear the levels' counting noise
MIN_WINDOW = 6  # the recent window: the last half, but at least this many dumps
CHURN_SHARE = 0.25  # churn: swings of at least this share of the peak
EXACT = 0.5  # counting noise per sample at most this: the dumps count the objects (s ≳ 0.7 R)
F_LEVEL = 2.0  # ... and when "rose, then flat" fits it no better than this F against the line
ALPHA_WHITE = 0.01  # one-sided level of the slope test against white scatter
Z_WHITE_RECENT = 1.0  # ... and the recent window's own drift is at least this
WHITE_MIN = 8  # the line through every dump: series from this long (shorter: the window is all)
WHITE_MAX = 60  # series up to this long (longer ones have power enough in the recent window)
R1_WHITE = 0.5  # scatter is white when its lag-1 autocorrelation is below -1/n + this/sqrt(n)
STEPS = 4  # counted exactly, a leak needs this many dumps that brought new objects ...
FEW = 12  # ... where it gained fewer objects than this: a few big ones
TINY = 1e-6  # sample units: differences below this are rounding


UNEVEN = 1.5  # dumps whose intervals differ by more than this factor are uneven
WARP_CV = 0.5  # ... and whose intervals' spread is this share of their mean: see _scattered


def uneven(times: list[float] | None) -> bool:
    """True when the dumps came at uneven intervals (a loaded machine, missed rounds): a
    pace per dump then says little about the pace in time."""
    if times is None or len(times) < 3:
        return False
    steps = [b - a for a, b in itertools.pairwise(times)]
    return min(steps) <= 0 or max(steps) > UNEVEN * min(steps)


MIN_STEP = 0.02  # seconds: dumps closer than this have times too coarse to judge by


def _timed(times: list[float]) -> bool:
    """Whether the dumps' times can carry a judgement: every interval at least MIN_STEP. A
    dump's time is its file's, which the kernel stamps with a clock that ticks every few
    milliseconds: dumps a few milliseconds apart (a test's rapid dumps, or files copied
    without their times) share ticks, and their intervals say more of the clock than of
    the program."""
    return all(b - a >= MIN_STEP for a, b in itertools.pairwise(times))


def windows(n: int) -> tuple[int, int]:
    """(first dump of the recent window, first dump of the last third) for ``n`` dumps."""
    h = n if n <= MIN_WINDOW else max(MIN_WINDOW, math.ceil(n / 2))
    t = max(3, math.ceil(n / 3))
    return n - h, max(n - t, 0)


@dataclass
class Judged:
    """Per-row results of :func:`judge_counts`, in sample units (one entry per site)."""

    verdict: list[str]
    n: int
    z: Matrix  # drift over the recent window, standardised
    df: Matrix  # degrees of freedom of z's reference distribution (inf: normal)
    slope: Matrix  # samples per dump over the recent window
    se: Matrix  # its standard error
    window_start: Index  # first dump of each row's drift window
    slowdown_z: Matrix  # NaN where the series is too short
    rise_z: Matrix
    rise: Matrix  # samples: last third's level minus the first dumps'
    first_growth: Index
    s_p2: Matrix
    s_t2: Matrix
    se_interval: Matrix  # standard error behind the printed interval of the slope
    steps: Matrix  # dumps in the window that brought new objects
    exact: npt.NDArray[np.bool_]  # objects every dump counts (sampling noise φ ≤ EXACT)
    whole: npt.NDArray[np.bool_]  # drift tested as the line through every dump (white scatter)
    phi: Matrix  # counting noise per unit: 1 - the share of the objects that are sampled

    def p_value(self, i: int) -> float:
        """One-sided p-value of row ``i``'s drift test."""
        z = float(self.z[i])
        return 0.5 if z == 0.0 else t_sf(z, float(self.df[i]))


def _two_sided(df: float) -> float:
    """Student t's 97.5% point: a 95% interval's half-width in standard errors."""
    return _crit(min(df, 1000.0), 0.025)


def normal_isf_leak() -> float:
    """The normal z that ``ALPHA_LEAK`` corresponds to."""
    return _crit(math.inf, ALPHA_LEAK)


def _critical(df: Matrix, level: float) -> Matrix:
    """One-sided critical values of Student t (normal where df is infinite)."""
    out = np.empty_like(df)
    for v in np.unique(df):
        out[df == v] = _crit(float(v), level)
    return out


_CRIT: dict[tuple[float, float], float] = {}


def _crit(df: float, level: float) -> float:
    key = (df, level)
    if key not in _CRIT:
        _CRIT[key] = t_quantile(level, df)
    return _CRIT[key]


def _two_dumps(c: Matrix, phi: Matrix) -> Judged:
    """Two dumps: growth against the counting noise of both levels, never more than
    ``growing`` (two points cannot tell a leak from a cache that is still filling)."""
    rows = c.shape[0]
    delta = c[:, 1] - c[:, 0]
    noise = np.sqrt(np.maximum(phi * (c[:, 0] + c[:, 1]), 0.0))
    z = _ratio(delta, noise)
    verdict = [GROWING if v >= Z_GROWING and d >= MIN_NEW_SAMPLES else STEADY
               for v, d in zip(z, delta, strict=True)]
    zeros = np.zeros(rows)
    return Judged(verdict, 2, z, np.full(rows, np.inf), delta, noise,
                  np.zeros(rows, dtype=np.int64), np.full(rows, np.nan),
                  z, delta, np.zeros(rows, dtype=np.int64), zeros, zeros, noise.copy(),
                  np.where(delta > 0, 1.0, 0.0), phi <= EXACT, np.zeros(rows, dtype=np.bool_),
                  phi)


def units(c: Matrix, y: Matrix | None, objects: Matrix | None
          ) -> tuple[Matrix, Matrix, Matrix]:
    """(x, φ, a): each row's series in its own sample units, its counting noise, and how
    many units one of its objects is (its mean object size over its bytes per sample).

    ``x`` is the estimated live bytes over the row's mean bytes per sample (so ``x`` is the
    sampled count itself where every object has the same size), which keeps a site whose
    objects grow in size (a pool's blocks doubling) on one scale. ``φ`` is the variance of
    jemalloc's sampling per unit of ``x``: an object of size s is sampled with probability
    p = 1 - exp(-s/R), so a sampled count of objects renewed between dumps varies by c·(1-p)
    (Poisson, φ = 1, for objects much smaller than R; nothing, φ = 0, for objects far above
    it, which every dump counts exactly). Without ``y`` and ``objects``: x = c, φ = 1, a = 1.
    """
    rows = c.shape[0]
    if y is None or objects is None:
        return c, np.ones(rows), np.ones(rows)
    total_c = c.sum(axis=1)
    total_y = y.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        unit = np.where((total_c > 0) & (total_y > 0), total_y / total_c, 1.0)
        x = y / unit[:, None]
        # Objects of one size give back the counts themselves: keep them exact, so that a
        # flat stretch stays flat to the last bit (a slope of 1e-15 over no noise is not
        # growth).
        x = np.where(np.abs(x - c) <= 1e-9 * np.maximum(c, 1.0), c, x)
        weight = np.where(c > 0, y / np.where(c > 0, c, 1.0), 0.0) / unit[:, None]
        p = np.where(objects > 0, c / np.where(objects > 0, objects, 1.0), 1.0)
        total_x = x.sum(axis=1)
        phi = np.where(total_x > 0,
                       np.sum(x * weight * np.clip(1.0 - p, 0.0, 1.0), axis=1) / total_x, 1.0)
        total_o = objects.sum(axis=1)
        per_object = np.where(total_o > 0, total_y / np.where(total_o > 0, total_o, 1.0)
                              / unit, 1.0)
    return (np.asarray(x, dtype=np.float64), np.asarray(phi, dtype=np.float64),
            np.asarray(per_object, dtype=np.float64))


def _ratio(num: Matrix, den: Matrix) -> Matrix:
    """num / den, where a zero ``den`` (noise that is exactly nothing: objects every dump
    counts) makes any growth infinitely sure and no growth no evidence."""
    # A stretch that is flat gives a slope of zero up to the rounding of the prefix sums
    # (~1e-12 of a sample): that is no growth, not infinitely sure growth.
    exact = np.where(num > TINY, np.inf, np.where(num < -TINY, -np.inf, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(den > 0, num / np.where(den > 0, den, 1.0), exact),
                          dtype=np.float64)


def judge_counts(c: Matrix, y: Matrix | None = None, objects: Matrix | None = None,
                 times: list[float] | None = None) -> Judged:
    """Judge each row of ``c`` (sampled counts, one column per dump, oldest first).

    With ``y`` (estimated live bytes) and ``objects`` (estimated live objects) of the same
    shape, each row is judged in its own units with the sampling noise its objects' sizes
    imply (:func:`units`); without them every sample counts as a Poisson one. With the
    dumps' ``times`` (seconds), when they came at uneven intervals (:func:`uneven`) and far
    enough apart for their times to tell (:func:`_timed`), whether
    growth slowed down is asked in time rather than per dump (:func:`_slowdown_in_time`),
    and where the intervals scatter widely (:func:`_scattered`) the drift's noise is taken
    from the series moved to even times (:func:`_even_times`).
    """
    rows, n = c.shape
    if n < 2:
        raise ValueError("a trend needs two dumps")
    x, phi, per_object = units(c, y, objects)
    if n == 2:
        return _two_dumps(x, phi)
    w0, t0 = windows(n)
    ts = np.asarray(times, dtype=np.float64) if times is not None and len(times) == n \
        and uneven(times) and _timed(times) else None
    sums = Sums(x)
    first = hinge(x)
    # A count that never fell had nothing (sampled) freed between dumps: every step is new
    # objects. Where the dumps count every object (φ small), that is exact.
    never_fell = np.all(np.diff(c, axis=1) >= 0, axis=1)
    exact = phi <= EXACT
    if ts is None or not _scattered(ts):
        d = _drift(x, sums, w0, first, never_fell, phi, exact)
    else:
        # Dumps at uneven times: a steady pace gains more over a long interval than over a
        # short one, which the increments' spread would count as noise. The noise is taken
        # from the series as it would read at even times. Where nothing grows there is
        # nothing to move, and the spread (hence the test's level) is what it was.
        xe = _even_times(x, ts, w0)
        d = _drift(x, sums, w0, first, never_fell, phi, exact, (xe, Sums(xe)))
    slow = _slowdown(sums, n, t0, first, never_fell, phi)
    rise, rise_z = _rise(x, t0, phi)
    stopped = _stopped(x, t0, rise, phi)
    if ts is not None:
        # Dumps at uneven intervals gain unevenly per dump: a steady leak whose last dumps
        # came close together seems to slow down, a cache whose last dumps came far apart
        # seems not to. Slowing down is a question about time; where the times allow it,
        # they answer it, for the pace of the last third and for its level alike.
        in_time = _slowdown_in_time(x, ts, t0, first, d.s_p2, d.s_t2)
        slow = np.where(np.isnan(in_time), slow, in_time)
        levels = _stopped(x, t0, rise, phi, ts)
        stopped = np.where(np.isnan(levels), stopped, levels)
    t_z, t_crit = _tail_drift(sums, n, t0, phi)
    crit = _critical(d.df, ALPHA_LEAK)
    crit_growing = _critical(d.df, normal_sf(Z_GROWING))
    r = np.arange(rows)
    grown = x[:, -1] - x[r, d.win]
    # Growth of a sample or two is a count too small to rest a rate on.
    gained = grown >= MIN_NEW_SAMPLES
    # A short series grows when its growth clears the levels' counting noise, as two do.
    level_z = _ratio(grown, np.sqrt(np.maximum(phi * (x[:, -1] + x[r, d.win]), 0.0)))
    steps = _steps(c, d.win)  # dumps that brought new objects
    # Counted exactly and never freed, growth is whole objects arriving: a leak needs them
    # arriving in a rhythm (STEPS of them) and still in the last third; a filling pool stops.
    rose_late = c[:, -1] - c[:, t0] >= np.where(exact, 1.0, MIN_NEW_SAMPLES)
    few = c[:, -1] - c[r, d.win] < FEW
    rhythm = ~(exact & never_fell & few) | ((steps >= STEPS) & rose_late)
    # Churn beside a leak: where the whole series scatters around its line like fresh
    # samples (no wander left in its residuals), the line's slope over every dump is tested
    # against that scatter, far more surely than the increments can say.
    # Only where the dumps sample (objects well below R): sampling is what makes a renewed
    # population's count scatter independently from dump to dump; counted exactly, the
    # scatter is the program's own and may well wander. (Its "rose, then flat" fit costs
    # n² per row: long series, which have power enough in the recent window, skip it.)
    candidates = ~exact & ~(d.z >= crit) & (d.z >= Z_WHITE_RECENT) & \
        (x[:, -1] - x[:, 0] >= MIN_NEW_SAMPLES)
    if not WHITE_MIN <= n <= WHITE_MAX:
        candidates[:] = False
    white = _white_drift(x[candidates], phi[candidates])
    use_white = np.zeros(rows, dtype=np.bool_)
    use_white[candidates] = (white.z >= _critical(white.df, ALPHA_WHITE)) & \
        (white.r1 <= R1_WHITE / math.sqrt(n) - 1.0 / n) & (white.levelled < F_LEVEL)
    if use_white.any():
        picked = use_white[candidates]
        for a, b in ((d.z, white.z), (d.df, white.df), (d.slope, white.slope),
                     (d.se, white.se)):
            a[use_white] = b[picked]
        d.win[use_white] = 0
        crit = _critical(d.df, ALPHA_LEAK)
        crit_growing = _critical(d.df, normal_sf(Z_GROWING))
        gained = gained | use_white
    se_int = _interval_se(x, d, exact & never_fell, use_white, phi, per_object)
    peak = x.max(axis=1)
    swing = peak - x.min(axis=1)
    verdict = []
    for i in range(rows):
        slowed = bool(slow[i] >= Z_SLOWDOWN)
        risen = bool(rise_z[i] >= Z_RISE)
        # A record that never fell and still rose in its last third did not stop growing.
        flat_end = not (never_fell[i] and rose_late[i])
        if d.z[i] >= crit[i] and gained[i] and rhythm[i] and \
                (not slowed or t_z[i] >= t_crit):
            verdict.append(LEAK)
        elif risen and n >= 4 and flat_end and (slowed or stopped[i] >= Z_SLOWDOWN):
            verdict.append(BOUNDED)
        elif ((risen or d.z[i] >= crit_growing[i] or (n <= SHORT and level_z[i] >= Z_GROWING))
              and d.slope[i] > 0 and gained[i]):
            verdict.append(GROWING)
        elif never_fell[i] and gained[i] and rose_late[i]:
            verdict.append(GROWING)  # it only ever rose, and still does: not sure enough
        elif not never_fell[i] and \
                swing[i] >= max(CHURN_SHARE * peak[i], 3.0 * math.sqrt(phi[i] * peak[i]), 1.0):
            verdict.append(CHURN)
        else:
            verdict.append(STEADY)
    return Judged(verdict, n, d.z, d.df, d.slope, d.se, d.win, slow, rise_z, rise, first,
                  d.s_p2, d.s_t2, se_int, steps, exact, use_white, phi)


@dataclass
class _White:
    """The least-squares line through every dump of each row, its slope tested against
    the scatter of the points around it (white noise), and that scatter's lag-1
    autocorrelation (near -1/n when the points scatter independently)."""

    slope: Matrix
    se: Matrix
    z: Matrix
    df: Matrix
    r1: Matrix
    levelled: Matrix  # F of "rose, then flat" against the line (a cache that filled)


def _interval_se(x: Matrix, d: _Drift, arrivals: npt.NDArray[np.bool_],
                 white: npt.NDArray[np.bool_], phi: Matrix, per_object: Matrix) -> Matrix:
    """The standard error of each row's slope as an estimate of the pace (not as a test).

    A test against "no drift" may rest on a rhythm or on white scatter; the pace itself is
    uncertain by the leak's own arrivals as well: new objects arriving as a Poisson count
    (``per_object`` units each, where the dumps count objects exactly), or new samples
    (where the slope was tested against white scatter), over the slope's window.
    """
    n = x.shape[1]
    m = n - d.win
    pace = np.maximum(d.slope, 0.0)
    walk = np.where(arrivals, pace * per_object, 0.0)
    walk = np.where(white, pace * phi, walk)
    return np.asarray(np.sqrt(d.se * d.se + np.where(arrivals | white, 1.0, 0.0)
                              * slope_variance(m, walk, 0.0)), dtype=np.float64)


def _white_drift(x: Matrix, phi: Matrix) -> _White:
    """The slope of every row over all its dumps against white scatter (:class:`_White`);
    the scatter is at least the counting noise of the mean level (φ per unit)."""
    rows, n = x.shape
    t = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
    sxx = float(np.sum(t * t))
    mean = x.mean(axis=1)
    slope = (x - mean[:, None]) @ t / sxx
    e = x - mean[:, None] - slope[:, None] * t[None, :]
    sse = np.sum(e * e, axis=1)
    s2 = np.maximum(sse / max(n - 2, 1), phi * np.maximum(mean, 0.0))
    se = np.sqrt(s2 / sxx)
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = np.where(sse > 0, np.sum(e[:, 1:] * e[:, :-1], axis=1) / sse, 1.0)
    # The best "rose until dump k, flat after" (x = a + b·min(t, k), the flat part at least
    # three dumps): a cache that filled fits it far better than a line.
    best = sse.copy()
    xc = x - mean[:, None]
    for k in range(1, n - 3):
        u = np.minimum(np.arange(n, dtype=np.float64), float(k))
        u -= u.mean()
        fit = xc @ u
        best = np.minimum(best, np.sum(xc * xc, axis=1) - fit * fit / float(u @ u))
    best = np.maximum(best, 0.0)
    levelled = _ratio(sse - best, best / max(n - 3, 1))
    return _White(slope, se, _ratio(slope, se), np.full(rows, float(max(n - 2, 1))),
                  np.asarray(r1, dtype=np.float64), levelled)


@dataclass
class _Drift:
    """The drift test of each row: its window, slope, noise, statistic and reference."""

    win: Index
    slope: Matrix
    se: Matrix
    z: Matrix
    df: Matrix
    s_p2: Matrix
    s_t2: Matrix


def _steps(c: Matrix, win: Index) -> Matrix:
    """How many dumps in each row's window brought a rise of its count."""
    n = c.shape[1]
    rose = np.diff(c, axis=1) > 0
    after = np.arange(1, n)[None, :] > win[:, None]
    return np.asarray(np.sum(rose & after, axis=1), dtype=np.float64)


def _drift(c: Matrix, sums: Sums, w0: int, first: Index, never_fell: npt.NDArray[np.bool_],
           phi: Matrix, exact: npt.NDArray[np.bool_],
           noise: tuple[Matrix, Sums] | None = None) -> _Drift:
    """Positive drift over the recent window, with the noise of the persistent/transient
    model (see the module's docstring), estimated from ``noise`` (the series and its sums)
    when given, else from ``c`` itself."""
    rows, n = c.shape
    cn, sn = noise if noise is not None else (c, sums)
    full = np.full(rows, n, dtype=np.int64)
    # Where nothing was freed, the whole stretch since growth began is the persistent
    # part's record: the window reaches back to it (a late leak is judged from its start).
    win = np.where(never_fell, np.minimum(first, w0), w0).astype(np.int64)
    slope = sums.slope(win, full)
    # The noise comes from every step of the series (more steps, a surer estimate; steps of
    # an earlier fill only widen it, the safe side); new samples arrive as a Poisson count,
    # so the persistent variance is at least the window's mean step.
    pace = np.maximum(sums.moments(win, full)[0], 0.0)
    zero = np.zeros(rows, dtype=np.int64)
    _mean, var, cov = sums.moments(zero, full)
    if noise is not None:
        # The series at even times had its growth in time fitted and taken out: one degree
        # of freedom fewer for its spread (a fitted line leaves less scatter than the true).
        _m, var_n, cov_n = sn.moments(zero, full)
        grow = (n - 2) / (n - 3) if n > 3 else 1.0
        var, cov = var_n * grow, cov_n * grow
    s_p2, s_t2, split = split_noise(n - 1, var, cov)
    if split.any() and n >= VARIOGRAM_MIN:
        s_p2[split], s_t2[split] = variogram(cn[split])
    # Counted exactly, a record that never fell is the arrivals themselves: whether they
    # wander (a Poisson stream) or keep a rhythm (a steady request rate filling blocks) shows
    # in the gains over long lags, which no sampling noise blurs.
    rose = c[:, -1] > c[np.arange(rows), win]
    walks = np.flatnonzero(exact & never_fell & rose & (n - win >= VARIOGRAM_MIN))
    # Rows whose window starts at the same dump go through one call (the variogram is row by
    # row: the same numbers as one call per row, without a call per row).
    for start in np.unique(win[walks]):
        rows_at = walks[win[walks] == start]
        vp, vt = variogram(cn[rows_at, int(start):])
        s_p2[rows_at], s_t2[rows_at], split[rows_at] = vp, vt, True
    # The sampling noise of new samples is a floor: φ per unit (Poisson for small objects).
    s_p2 = np.maximum(s_p2, pace * phi)
    se = np.sqrt(slope_variance(full - win, s_p2, s_t2))
    z = _ratio(slope, se)
    # Steps that vary no more than a Poisson count (or, where the count never fell, no more
    # than chance lets a Poisson count's sample variance stray, 5%) make the variance known:
    # normal reference. Otherwise it was estimated from n-1 steps: Student t, one degree
    # fewer when it was split in two.
    allowance = dispersion_allowance(n - 2, Z_GROWING)
    poisson = ~split & ((var <= pace) | (never_fell & (var <= pace * allowance)))
    if n <= SHORT:
        # A handful of steps says little about how far a population of this size could
        # wander: the growth must also stand out from the counting noise of the levels
        # themselves (a stationary site's count at two dumps differs by about
        # sqrt(c0 + c1)), or the Poisson shortcut is not taken.
        ends = c[np.arange(rows), win]
        level = np.sqrt(np.maximum(phi * (c[:, -1] + ends), 1.0))
        poisson &= c[:, -1] - ends >= normal_isf_leak() * level
    fitted = 1.0 if noise is not None else 0.0
    df = np.where(poisson, np.inf,
                  np.maximum(np.where(split, n - 3.0, n - 2.0) - fitted, 1.0))
    return _Drift(win, slope, se, z, df, s_p2, s_t2)


def _slowdown(sums: Sums, n: int, t0: int, first: Index,
              never_fell: npt.NDArray[np.bool_], phi: Matrix) -> Matrix:
    """z of "the slope over the last third is below the slope from where growth began";
    NaN where the series is too short to have both."""
    rows = first.shape[0]
    if t0 < 3:
        return np.full(rows, np.nan)
    full = np.full(rows, n, dtype=np.int64)
    last = np.full(rows, t0, dtype=np.int64)
    start = np.where(t0 - first >= 3, first, 0)
    b_before = sums.slope(start, last)
    b_last = sums.slope(last, full)
    g_mean, g_var, g_cov = sums.moments(start, full)
    g_p2, g_t2, _ = split_noise(full - start - 1, g_var, g_cov)
    # Where nothing was ever freed, a leak that went on would add at least a Poisson count
    # of samples at its pace; the steps' own noise, measured within each stretch (pooled,
    # from stretches of three steps or more) so that the slowdown itself does not count as
    # noise, may say more (a program whose pace varies, dumps taken at uneven times).
    pace = np.maximum(g_mean, 0.0) * phi
    _m1, v1, _c1 = sums.moments(start, last)
    _m2, v2, _c2 = sums.moments(last, full)
    k1 = (last - start - 1).astype(np.float64)  # steps within each stretch
    k2 = float(n - t0 - 1)
    w1 = np.where(k1 >= 3, k1 - 1, 0.0)
    w2 = k2 - 1 if k2 >= 3 else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = np.where(w1 + w2 > 0, (v1 * w1 + v2 * w2) / (w1 + w2), 0.0)
    g_p2 = np.where(never_fell, np.maximum(pooled, pace), np.maximum(g_p2, pace))
    g_t2 = np.where(never_fell, 0.0, g_t2)
    v = slope_variance(t0 - start, g_p2, g_t2) + slope_variance(n - t0, g_p2, g_t2)
    return _ratio(b_before - b_last, np.sqrt(v))


def _scattered(t: Matrix) -> bool:
    """True when the dumps' intervals vary by more than WARP_CV of their mean (standard
    deviation over mean): enough that the pace's share of the increments' spread outweighs
    the degree of freedom that taking it out costs (simulated: a loaded machine's late and
    hurried rounds, CV ~0.9, gain; intervals jittered ±50%, CV 0.29, lose a little)."""
    steps = np.diff(t)
    mean = float(steps.mean())
    return mean > 0 and float(steps.std()) > WARP_CV * mean


def _even_times(x: Matrix, t: Matrix, w0: int) -> Matrix:
    """Each row as it would read at even intervals: its growth in time over the recent
    window (least squares on the dumps' seconds) moved from each dump's own time to where
    the dump would have come at even intervals between the first and the last."""
    n = x.shape[1]
    tw = t[w0:] - t[w0:].mean()
    sxx = float(tw @ tw)
    if sxx <= 0:
        return x
    rate = (x[:, w0:] - x[:, w0:].mean(axis=1, keepdims=True)) @ tw / sxx
    even = t[0] + (t[-1] - t[0]) * np.arange(n) / (n - 1)
    return np.asarray(x - rate[:, None] * (t - even)[None, :], dtype=np.float64)


def _slowdown_in_time(x: Matrix, t: Matrix, t0: int, first: Index, s_p2: Matrix,
                      s_t2: Matrix) -> Matrix:
    """z of "the last third gained fewer samples than the earlier pace per second predicts
    over its own duration", for dumps at times ``t``; NaN where there is nothing to compare
    (too short a series, or times that do not advance).

    The earlier pace runs from where growth began up to the last dump before the last third
    that brought a rise (a table filled in the first seconds and flat since did not grow at
    its average pace). Each stretch's gain is uncertain by the persistent part's wander over
    its duration (the per-dump wander spread over the seconds a dump covers on average), at
    least a Poisson count of the samples gained (new objects arriving at random, sampled or
    not, are a Poisson count of samples), plus the transient part at both of its ends.
    """
    rows, n = x.shape
    if t0 < 3 or t[-1] <= t[0]:
        return np.full(rows, np.nan)
    r = np.arange(rows)
    start = np.where(t0 - first >= 3, first, 0).astype(np.int64)
    rises = np.diff(x[:, :t0 + 1], axis=1) > TINY  # [k]: dump k+1 rose above dump k
    rises &= np.arange(t0)[None, :] >= start[:, None]
    last = t0 - 1 - np.argmax(rises[:, ::-1], axis=1)
    end = np.where(rises.any(axis=1), last + 1, t0)
    span1, span2 = t[end] - t[start], float(t[-1] - t[t0])
    g1 = np.maximum(x[r, end] - x[r, start], 0.0)
    g2 = x[:, -1] - x[:, t0]
    ok = (span1 > 0) & (span2 > 0)
    ratio = np.where(ok, span2 / np.where(span1 > 0, span1, 1.0), 0.0)
    expected = g1 * ratio
    per_s = np.maximum(s_p2, 0.0) * (n - 1) / float(t[-1] - t[0])
    t2 = np.maximum(s_t2, 0.0)
    v1 = np.maximum(per_s * span1, g1) + 2.0 * t2
    v2 = np.maximum(per_s * span2, expected) + 2.0 * t2
    # Stretches that meet at the third's first dump share its transient part.
    v = ratio * ratio * v1 + v2 + np.where(end == t0, 2.0 * ratio * t2, 0.0)
    z = _ratio(expected - g2, np.sqrt(np.maximum(v, 1.0)))
    return np.where(ok, z, np.nan)


def _rise(c: Matrix, t0: int, phi: Matrix) -> tuple[Matrix, Matrix]:
    """(rise, z): the last third's mean level against the first dump's, each uncertain by
    the last third's spread and at least by its counting noise (c samples, by sqrt(c))."""
    n = c.shape[1]
    tl = max(t0, 1)
    head = c[:, 0]
    tail = c[:, tl:]
    tail_mean = tail.mean(axis=1)
    tail_var = tail.var(axis=1, ddof=1) if n - tl > 1 else np.zeros(c.shape[0])
    # One dump says nothing of its own spread: assume the last third's.
    v = np.maximum(tail_var, phi * head) + np.maximum(tail_var, phi * tail_mean) / (n - tl)
    rise = tail_mean - head
    return rise, _ratio(rise, np.sqrt(v))


def _tail_drift(sums: Sums, n: int, t0: int, phi: Matrix) -> tuple[Matrix, float]:
    """(z, critical value) of positive drift within the last third alone, with that
    stretch's own noise (one-sided 5%): a leak that slowed down is still a leak while it
    keeps growing there."""
    rows = sums.rows.shape[0]
    full = np.full(rows, n, dtype=np.int64)
    tail = np.full(rows, t0, dtype=np.int64)
    slope = sums.slope(tail, full)
    mean, var, cov = sums.moments(tail, full)
    s_p2, s_t2, _ = split_noise(n - t0 - 1, var, cov)
    se = np.sqrt(slope_variance(n - t0, np.maximum(s_p2, np.maximum(mean, 0.0) * phi), s_t2))
    return _ratio(slope, se), _crit(float(max(n - t0 - 2, 1)),
                                                  normal_sf(Z_GROWING))


def _stopped(c: Matrix, t0: int, rise: Matrix, phi: Matrix,
             times: Matrix | None = None) -> Matrix:
    """z of "the last third lies below where continued growth would have put it".

    Compares the mean level of the last third with the third before it (each uncertain by
    its own spread or, at least, its counting noise), against the rise the earlier pace
    predicts over that distance: counted in dumps, or in seconds with the dumps' ``times``.
    NaN when the series is too short to have two thirds.
    """
    rows, n = c.shape
    t = n - t0
    if t0 - t < 0 or n < 6:
        return np.full(rows, np.nan)
    tail, mid = c[:, t0:], c[:, t0 - t:t0]
    tail_mean, mid_mean = tail.mean(axis=1), mid.mean(axis=1)
    se = np.sqrt(np.maximum(tail.var(axis=1, ddof=1), phi * tail_mean) / t
                 + np.maximum(mid.var(axis=1, ddof=1), phi * mid_mean) / t)
    # Distance from the first dump to the last third's centre, against the thirds' distance.
    if times is None:
        span, apart = n - (t + 1) / 2.0, float(t)
    else:
        centre = float(times[t0:].mean())
        span, apart = centre - float(times[0]), centre - float(times[t0 - t:t0].mean())
        if span <= 0 or apart <= 0:
            return np.full(rows, np.nan)
    expected = rise * apart / span
    return _ratio(expected - (tail_mean - mid_mean), se)


def more_dumps(j: Judged, i: int, limit: int = 1000) -> int | None:
    """About how many more dumps (at the same interval and pace) row ``i`` needs before its
    drift test can reach the ``leak`` level; None when it is not drifting up, or would need
    more than ``limit``."""
    slope = float(j.slope[i])
    if slope <= 0 or not math.isfinite(slope):
        return None
    extra = np.arange(1, limit + 1)
    n = j.n + extra
    m = np.where(n <= MIN_WINDOW, n, np.maximum(MIN_WINDOW, np.ceil(n / 2.0)))
    se = np.sqrt(slope_variance(m.astype(np.int64), float(j.s_p2[i]), float(j.s_t2[i])))
    df = float(j.df[i])
    if math.isinf(df):
        crit = np.full(limit, _crit(math.inf, ALPHA_LEAK))
    else:
        # Student t's critical value falls towards the normal one as steps accumulate.
        crit = np.asarray([_crit(min(df + e, 200.0), ALPHA_LEAK) for e in range(1, 33)]
                          + [_crit(200.0, ALPHA_LEAK)] * max(0, limit - 32))[:limit]
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = (se == 0) | (slope / se >= crit)
    hits = np.flatnonzero(ok)
    return int(extra[hits[0]]) if hits.size else None


@dataclass(frozen=True)
class Trend:
    """The verdict on one site's series and the evidence behind it, in bytes.

    ``z``/``p_value`` test positive drift over the recent window (from dump
    ``window_start``); ``samples`` is how many sampled objects the last dump holds.
    """

    verdict: str
    dumps: int
    growth: float  # live bytes at the last dump minus the first
    slope_per_dump: float  # drift over the recent window, bytes per dump
    slope_low: float  # its 95% interval
    slope_high: float
    slope_per_s: float | None  # the same per second, when the dumps' times are known
    z: float
    p_value: float
    window_start: int
    first_growth: int | None  # the dump after which growth began (leak, bounded, growing)
    slowdown_z: float | None  # evidence that growth slowed in the last third
    rise_z: float  # evidence that the end lies above the start
    samples: float  # sampled objects live at the last dump
    new_samples: float  # samples gained over the recent window
    noise_persistent: float  # per-dump wander of the persistent part, bytes (s_p)
    noise_transient: float  # noise of the transient part per dump, bytes (s_t)
    more_dumps: int | None  # growing: about how many more dumps a leak verdict needs
    q_value: float | None = None  # false-discovery rate over the process's sites
    exact: bool = False  # its objects are big enough that the dumps all but count them
    sampled: float = 0.0  # about the share of its objects that jemalloc samples (1 - φ)
    steps: int = 0  # dumps of the window that brought new objects
    whole_series: bool = False  # drift tested as the line through every dump

    @property
    def score(self) -> float:
        """Evidence-weighted growth, for ranking within a verdict."""
        weight = min(1.0, max(self.z, 0.0) / 2.326)
        return max(self.growth, 0.0) * weight

    def with_verdict(self, verdict: str, q_value: float | None = None) -> Trend:
        """The same evidence under another verdict (after the process-wide correction)."""
        # A copy of the fields with three changed: dataclasses.replace would run __init__
        # again, which costs more when thousands of sites are corrected at once.
        new = object.__new__(Trend)
        new.__dict__.update(self.__dict__, verdict=verdict, q_value=q_value,
                            more_dumps=self.more_dumps if verdict == GROWING else None)
        return new


def describe(j: Judged, i: int, counts: Matrix, values: Matrix,
             times: list[float] | None) -> Trend:
    """Row ``i`` of a judgement as bytes: ``counts`` and ``values`` are the row's sampled
    counts and byte estimates per dump, ``times`` the dumps' seconds (or None)."""
    c = counts[i]
    y = values[i]
    total_c = float(np.sum(c))
    w = float(np.sum(y)) / total_c if total_c > 0 else 0.0  # bytes per sample
    n = j.n
    slope = float(j.slope[i]) * w
    df = float(j.df[i])
    half = (1.96 if math.isinf(df) else _two_sided(df)) * float(j.se_interval[i]) * w
    per_s = None
    start = int(j.window_start[i])
    if times is not None and len(times) == n:
        span = times[-1] - times[start]
        steps = n - 1 - start
        if span > 0 and steps > 0:
            per_s = slope * steps / span
    verdict = j.verdict[i]
    first = int(j.first_growth[i]) if verdict in (LEAK, BOUNDED, GROWING) else None
    slow = float(j.slowdown_z[i])
    return Trend(
        verdict=verdict, dumps=n, growth=float(y[-1] - y[0]), slope_per_dump=slope,
        slope_low=slope - half, slope_high=slope + half, slope_per_s=per_s,
        z=float(j.z[i]), p_value=j.p_value(i), window_start=start,
        first_growth=first, slowdown_z=None if math.isnan(slow) else slow,
        rise_z=float(j.rise_z[i]), samples=float(c[-1]),
        new_samples=float(c[-1] - c[start]),
        noise_persistent=math.sqrt(max(float(j.s_p2[i]), 0.0)) * w,
        noise_transient=math.sqrt(max(float(j.s_t2[i]), 0.0)) * w,
        more_dumps=more_dumps(j, i) if verdict == GROWING else None,
        exact=bool(j.exact[i]), sampled=1.0 - float(j.phi[i]), steps=int(j.steps[i]),
        whole_series=bool(j.whole[i]))


def describe_all(j: Judged, counts: Matrix, values: Matrix,
                 times: list[float] | None) -> list[Trend]:
    """Every row of a judgement as bytes: :func:`describe` of each row (its reference),
    the arithmetic done on whole columns (a process's 20,000 sites: 0.3 s row by row)."""
    rows = counts.shape[0]
    if rows == 0:
        return []
    n = j.n
    total_c = counts.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(total_c > 0, values.sum(axis=1) / np.where(total_c > 0, total_c, 1.0),
                     0.0)
    slope = j.slope * w
    df = j.df
    crit = np.empty(rows)
    for v in np.unique(df):
        crit[df == v] = 1.96 if math.isinf(v) else _two_sided(float(v))
    half = crit * j.se_interval * w
    start = j.window_start.astype(np.int64)
    per_s: list[float | None] = [None] * rows
    if times is not None and len(times) == n:
        t = np.asarray(times, dtype=np.float64)
        span = t[-1] - t[start]
        steps = n - 1 - start
        ok = (span > 0) & (steps > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = slope * steps / np.where(ok, span, 1.0)
        per_s = [float(r) if k else None for r, k in zip(rate.tolist(), ok.tolist(),
                                                       strict=True)]
    persistent = np.sqrt(np.maximum(j.s_p2, 0.0)) * w
    transient = np.sqrt(np.maximum(j.s_t2, 0.0)) * w
    last_c = counts[:, -1]
    new = last_c - counts[np.arange(rows), start]
    growth = values[:, -1] - values[:, 0]
    out: list[Trend] = []
    tails: dict[tuple[float, float], float] = {}  # rows alike share their p-value
    for i, (verdict, sl, hf, z, slow, first, st) in enumerate(zip(
            j.verdict, slope.tolist(), half.tolist(), j.z.tolist(), j.slowdown_z.tolist(),
            j.first_growth.tolist(), start.tolist(), strict=True)):
        out.append(Trend(
            verdict=verdict, dumps=n, growth=float(growth[i]), slope_per_dump=sl,
            slope_low=sl - hf, slope_high=sl + hf, slope_per_s=per_s[i],
            z=z, p_value=0.5 if z == 0.0 else _tail(tails, z, float(df[i])), window_start=st,
            first_growth=int(first) if verdict in (LEAK, BOUNDED, GROWING) else None,
            slowdown_z=None if math.isnan(slow) else slow, rise_z=float(j.rise_z[i]),
            samples=float(last_c[i]), new_samples=float(new[i]),
            noise_persistent=float(persistent[i]), noise_transient=float(transient[i]),
            more_dumps=more_dumps(j, i) if verdict == GROWING else None,
            exact=bool(j.exact[i]), sampled=1.0 - float(j.phi[i]), steps=int(j.steps[i]),
            whole_series=bool(j.whole[i])))
    return out


def _tail(memo: dict[tuple[float, float], float], z: float, df: float) -> float:
    """:func:`t_sf` remembered in ``memo``: many rows of a process share their numbers."""
    got = memo.get((z, df))
    if got is None:
        got = memo[(z, df)] = t_sf(z, df)
    return got


def classify(values: list[float], counts: list[float] | None = None,
             times: list[float] | None = None) -> Trend:
    """Judge one series of live-byte estimates (with its sampled counts when known; without
    them every byte counts as one sample's worth, i.e. exact counting)."""
    y = np.asarray([values], dtype=np.float64)
    c = np.asarray([counts], dtype=np.float64) if counts is not None else y.copy()
    return describe(judge_counts(c, times=times), 0, c, y, times)
