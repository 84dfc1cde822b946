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
slope over m dumps follows in closed form (:func:`slope_variance`).

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

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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
Z_SPLIT = 1.645  # one-sided 5%: increments anti-correlated, so part of the noise is transient
MIN_NEW_SAMPLES = 3  # leak and growing need at least this many new samples in the window
VARIOGRAM_MIN = 12  # series at least this long estimate the noise split from many lags
SHORT = 5  # up to this many dumps, growth must also clear the levels' counting noise
MIN_WINDOW = 6  # the recent window: the last half, but at least this many dumps
FLAT_SHARE = 0.25  # bounded: the last third adds at most this share of the rise
CHURN_SHARE = 0.25  # churn: swings of at least this share of the peak

Matrix = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]


def slope_variance(m: int | Index, s_p2: Matrix | float, s_t2: Matrix | float) -> Matrix:
    """Variance of the least-squares slope over ``m`` consecutive dumps.

    The persistent part is a random walk: its share is s_p² times the sum over k of the
    squared slope weights summed from dump k on, 6(m²+1)/(5m(m²-1)); white noise adds
    s_t²·12/(m(m²-1)).
    """
    mm = np.asarray(m, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        walk = np.where(mm > 1, 6.0 * (mm * mm + 1) / (5.0 * mm * (mm * mm - 1)), np.inf)
        white = np.where(mm > 1, 12.0 / (mm * (mm * mm - 1)), np.inf)
    return np.asarray(s_p2 * walk + s_t2 * white, dtype=np.float64)


def _prefix(a: Matrix) -> Matrix:
    out = np.zeros((a.shape[0], a.shape[1] + 1))
    np.cumsum(a, axis=1, out=out[:, 1:])
    return out


class _Sums:
    """Prefix sums of a matrix's rows: slopes and increment moments over any column range."""

    def __init__(self, c: Matrix) -> None:
        idx = np.arange(c.shape[1], dtype=np.float64)
        self.rows = np.arange(c.shape[0])
        self.y = _prefix(c)
        self.iy = _prefix(c * idx)
        d = np.diff(c, axis=1)
        self.d = _prefix(d)
        self.dd = _prefix(d * d)
        self.lag = _prefix(d[:, :-1] * d[:, 1:]) if d.shape[1] > 1 else np.zeros((c.shape[0], 1))

    def slope(self, a: Index, b: Index) -> Matrix:
        """Least-squares slope of each row over columns [a, b) (x = column index)."""
        r = self.rows
        m = (b - a).astype(np.float64)
        sy = self.y[r, b] - self.y[r, a]
        siy = self.iy[r, b] - self.iy[r, a]
        sx = (a + b - 1) * m / 2.0
        sxx = m * (m * m - 1) / 12.0
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (siy - sx * sy / m) / sxx
        return np.where(m > 1, out, 0.0)

    def moments(self, a: Index, b: Index) -> tuple[Matrix, Matrix, Matrix]:
        """(mean, variance, lag-1 autocovariance) of each row's increments within [a, b)."""
        r = self.rows
        k = (b - a - 1).astype(np.float64)  # increments d[a..b-2], d[i] = c[i+1] - c[i]
        hi = np.maximum(b - 1, a)
        sd = self.d[r, hi] - self.d[r, a]
        sdd = self.dd[r, hi] - self.dd[r, a]
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(k > 0, sd / k, 0.0)
            var = np.maximum(np.where(k > 1, (sdd - k * mean * mean) / (k - 1), 0.0), 0.0)
        # Lag-1 pairs (d[i], d[i+1]) for i = a..b-3, centred on the mean.
        pairs = np.maximum(k - 1, 0.0)
        top = self.lag.shape[1] - 1
        p_lo = np.clip(a, 0, top)
        p_hi = np.maximum(np.clip(b - 2, 0, top), p_lo)
        slag = np.where(pairs > 0, self.lag[r, p_hi] - self.lag[r, p_lo], 0.0)
        head = self.d[r, np.maximum(b - 2, a)] - self.d[r, a]  # d[a..b-3]
        tail = self.d[r, hi] - self.d[r, np.minimum(a + 1, hi)]  # d[a+1..b-2]
        with np.errstate(divide="ignore", invalid="ignore"):
            cov = np.where(pairs > 1,
                           (slag - mean * (head + tail) + pairs * mean * mean) / pairs, 0.0)
        return mean, var, cov


def split_noise(k: int | Index, var: Matrix, cov: Matrix
                ) -> tuple[Matrix, Matrix, npt.NDArray[np.bool_]]:
    """(s_p², s_t², split?) from the increments' variance and lag-1 autocovariance.

    Transient noise makes consecutive increments anti-correlated (ρ = -s_t²/Var d); a
    persistent walk does not. The split is made only when ρ is significantly negative
    (one-sided 5%, standard error 1/sqrt(k)); otherwise all the variance counts as
    persistent, the conservative choice for a drift test.
    """
    kk = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(var > 0, cov / var, 0.0)
    split = (kk >= 4) & (rho < -Z_SPLIT / np.sqrt(np.maximum(kk, 1.0)))
    s_t2 = np.where(split, np.clip(-cov, 0.0, var / 2.0), 0.0)
    return var - 2.0 * s_t2, s_t2, np.asarray(split, dtype=np.bool_)


def dispersion_allowance(df: int, z: float = 3.09) -> float:
    """How far above its mean a Poisson count's sample variance (``df`` degrees of freedom)
    strays by chance: the upper point of χ²(df)/df at normal ``z`` (Wilson–Hilferty)."""
    if df < 1:
        return 1.0
    a = 2.0 / (9.0 * df)
    return float((1.0 - a + z * math.sqrt(a)) ** 3)


def variogram(c: Matrix) -> tuple[Matrix, Matrix]:
    """(s_p², s_t²) per row from the variance of differences at several lags.

    Var(c[t+h] - c[t]) = h·s_p² + 2·s_t²: a weighted least-squares line through the
    variances at lags 1, 2, 3, 4, 6, 8, … up to a quarter of the series. Long lags let the
    slow wander of the persistent part stand out from transient noise, which a lag-1
    estimate cannot do when the transient part dominates.
    """
    rows, n = c.shape
    lags = []
    h = 1
    while h <= max(2, n // 4):
        lags.append(h)
        h = h + 1 if h < 4 else int(h * 1.5)
    hs = np.asarray(lags, dtype=np.float64)
    v = np.empty((rows, len(lags)))
    counts = np.empty(len(lags))
    for j, lag in enumerate(lags):
        d = c[:, lag:] - c[:, :-lag]
        v[:, j] = d.var(axis=1, ddof=1)
        counts[j] = d.shape[1]
    # The variance of a sample variance grows with its square: weight by count / h².
    w = counts / (hs * hs)
    sw, swh, swhh = w.sum(), (w * hs).sum(), (w * hs * hs).sum()
    swv, swhv = (v * w).sum(axis=1), (v * w * hs).sum(axis=1)
    det = sw * swhh - swh * swh
    slope = (sw * swhv - swh * swv) / det
    icpt = (swhh * swv - swh * swhv) / det
    # Keep the line physical: no negative part (refit through the origin, or flat).
    through0 = swhv / swhh
    s_p2 = np.where(icpt < 0, through0, np.maximum(slope, 0.0))
    s_t2 = np.where(icpt < 0, 0.0, np.where(slope < 0, swv / sw, icpt) / 2.0)
    return s_p2, s_t2


def windows(n: int) -> tuple[int, int]:
    """(first dump of the recent window, first dump of the last third) for ``n`` dumps."""
    h = n if n <= MIN_WINDOW else max(MIN_WINDOW, math.ceil(n / 2))
    t = max(3, math.ceil(n / 3))
    return n - h, max(n - t, 0)


def hinge(c: Matrix) -> Index:
    """Where growth began, per row: the break of the best flat-then-straight fit."""
    rows, n = c.shape
    if n < 3:
        return np.zeros(rows, dtype=np.int64)
    y = _prefix(c)
    iy = _prefix(c * np.arange(n, dtype=np.float64))
    sy, syy = y[:, n], np.sum(c * c, axis=1)
    base = syy - sy * sy / n
    best = np.full(rows, np.inf)
    best_k = np.zeros(rows, dtype=np.int64)
    for k in range(0, n - 2):
        m = n - 1 - k  # x = 1..m for columns k+1..n-1, 0 before
        sx = m * (m + 1) / 2.0
        sxx = m * (m + 1) * (2 * m + 1) / 6.0
        sxy = (iy[:, n] - iy[:, k + 1]) - k * (y[:, n] - y[:, k + 1])
        vxy = sxy - sx * sy / n
        sse = base - vxy * vxy / (sxx - sx * sx / n)
        better = sse < best - 1e-9 * (np.abs(np.where(np.isinf(best), 0.0, best)) + 1.0)
        best = np.where(better, sse, best)
        best_k = np.where(better, k, best_k)
    return best_k


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

    def p_value(self, i: int) -> float:
        """One-sided p-value of row ``i``'s drift test."""
        z = float(self.z[i])
        return 0.5 if z == 0.0 else t_sf(z, float(self.df[i]))


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


def _two_dumps(c: Matrix) -> Judged:
    """Two dumps: growth against the counting noise of both levels, never more than
    ``growing`` (two points cannot tell a leak from a cache that is still filling)."""
    rows = c.shape[0]
    delta = c[:, 1] - c[:, 0]
    noise = np.sqrt(np.maximum(c[:, 0] + c[:, 1], 1.0))
    z = delta / noise
    verdict = [GROWING if v >= Z_GROWING and d >= MIN_NEW_SAMPLES else STEADY
               for v, d in zip(z, delta, strict=True)]
    zeros = np.zeros(rows)
    return Judged(verdict, 2, z, np.full(rows, np.inf), delta, noise,
                  np.zeros(rows, dtype=np.int64), np.full(rows, np.nan),
                  z, delta, np.zeros(rows, dtype=np.int64), zeros, zeros)


def judge_counts(c: Matrix) -> Judged:
    """Judge each row of ``c`` (sampled counts, one column per dump, oldest first)."""
    rows, n = c.shape
    if n < 2:
        raise ValueError("a trend needs two dumps")
    if n == 2:
        return _two_dumps(c)
    sums = _Sums(c)
    full = np.full(rows, n, dtype=np.int64)
    zero = np.zeros(rows, dtype=np.int64)
    w0, t0 = windows(n)
    first = hinge(c)
    # A count that never fell had nothing freed between dumps: every step is new samples,
    # so the whole stretch since growth began is the persistent part's record, and the
    # window reaches back to it (a late leak is judged from where it started).
    never_fell = np.all(np.diff(c, axis=1) >= 0, axis=1)
    win = np.where(never_fell, np.minimum(first, w0), w0).astype(np.int64)
    m = full - win
    slope = sums.slope(win, full)
    # The noise comes from every step of the series (more steps, a surer estimate; steps of
    # an earlier fill only widen it, the safe side); new samples arrive as a Poisson count,
    # so the persistent variance is at least the window's mean step.
    w_mean = sums.moments(win, full)[0]
    _mean, var, cov = sums.moments(zero, full)
    s_p2, s_t2, split = split_noise(n - 1, var, cov)
    if split.any() and n >= VARIOGRAM_MIN:
        vp, vt = variogram(c[split])
        s_p2[split], s_t2[split] = vp, vt
    pace = np.maximum(w_mean, 0.0)
    s_p2 = np.maximum(s_p2, pace)
    se = np.sqrt(slope_variance(m, s_p2, s_t2))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, slope / se, 0.0)
    # Steps that vary no more than a Poisson count: the variance is known (normal
    # reference). Otherwise it was estimated from n-1 steps: Student t, one degree fewer
    # when it was split in two.
    # A count that never fell may vary up to what chance allows a Poisson count (5%).
    allowance = dispersion_allowance(n - 2, Z_GROWING)
    poisson = ~split & ((var <= pace) | (never_fell & (var <= pace * allowance)))
    if n <= SHORT:
        # A handful of steps says little about how much a population of this size could
        # wander: the growth must also stand out from the counting noise of the levels
        # themselves (a stationary site's count at two dumps differs by at most about
        # sqrt(c0 + c1)), or the Poisson shortcut is not taken.
        ends = c[np.arange(rows), win]
        level = np.sqrt(np.maximum(c[:, -1] + ends, 1.0))
        poisson &= c[:, -1] - ends >= normal_isf_leak() * level
    df = np.where(poisson, np.inf, np.maximum(np.where(split, n - 3.0, n - 2.0), 1.0))
    crit = _critical(df, ALPHA_LEAK)
    crit_growing = _critical(df, normal_sf(Z_GROWING))

    # Slowdown: the slope over the last third against the slope from where growth began.
    slow = np.full(rows, np.nan)
    last = np.full(rows, t0, dtype=np.int64)
    if t0 >= 3:
        start = np.where(t0 - first >= 3, first, 0)
        b_before = sums.slope(start, last)
        b_last = sums.slope(last, full)
        g_mean, g_var, g_cov = sums.moments(start, full)
        g_p2, g_t2, _ = split_noise(full - start - 1, g_var, g_cov)
        # Where nothing was ever freed, a leak that went on would add a Poisson count of
        # samples at its pace: that is the noise to compare the slowdown with (a sample
        # variance would count the slowdown itself as noise).
        g_p2 = np.where(never_fell, np.maximum(g_mean, 0.0),
                        np.maximum(g_p2, np.maximum(g_mean, 0.0)))
        g_t2 = np.where(never_fell, 0.0, g_t2)
        v = slope_variance(t0 - start, g_p2, g_t2) + slope_variance(n - t0, g_p2, g_t2)
        with np.errstate(divide="ignore", invalid="ignore"):
            slow = np.where(v > 0, (b_before - b_last) / np.sqrt(v), 0.0)

    # Rise: the last third's level against the first dumps', each uncertain by its spread
    # and at least by its counting noise (a level of c samples, by sqrt(c)).
    q = 1
    tl = max(t0, 1)
    head_mean = np.mean(c[:, :q], axis=1)
    tail_mean = np.mean(c[:, tl:], axis=1)
    head_var = np.var(c[:, :q], axis=1, ddof=1) if q > 1 else np.zeros(rows)
    tail_var = np.var(c[:, tl:], axis=1, ddof=1) if n - tl > 1 else np.zeros(rows)
    # One or two first dumps say nothing of their own spread: assume the last third's.
    v_head = np.maximum(np.maximum(head_var, tail_var) if q < 3 else head_var, head_mean)
    v_rise = v_head / q + np.maximum(tail_var, tail_mean) / (n - tl)
    rise = tail_mean - head_mean
    with np.errstate(divide="ignore", invalid="ignore"):
        rise_z = np.where(v_rise > 0, rise / np.sqrt(v_rise), 0.0)

    # Stopped: had the growth gone on at the pace of the rise, the last third would lie
    # above the third before it by its share of the rise; the levels say it does not.
    stopped = _stopped(c, t0, q, rise)
    # A leak that slowed down is still a leak while its last third keeps growing on its own
    # (with that stretch's own noise, one-sided 5%).
    tail = np.full(rows, t0, dtype=np.int64)
    t_slope = sums.slope(tail, full)
    t_mean, t_var, t_cov = sums.moments(tail, full)
    t_p2, t_t2, _ = split_noise(n - t0 - 1, t_var, t_cov)
    t_p2 = np.maximum(t_p2, np.maximum(t_mean, 0.0))
    t_se = np.sqrt(slope_variance(n - t0, t_p2, t_t2))
    with np.errstate(divide="ignore", invalid="ignore"):
        t_z = np.where(t_se > 0, t_slope / t_se, 0.0)
    t_crit = _crit(float(max(n - t0 - 2, 1)), normal_sf(Z_GROWING))
    peak = c.max(axis=1)
    swing = peak - c.min(axis=1)
    # Growth of a sample or two is a count too small to rest a rate on.
    gained = c[:, -1] - c[np.arange(rows), win] >= MIN_NEW_SAMPLES
    verdict = []
    # A short series grows when its growth clears the levels' counting noise, as two dumps do.
    rows_i = np.arange(rows)
    level_z = (c[:, -1] - c[rows_i, win]) / np.sqrt(np.maximum(c[:, -1] + c[rows_i, win], 1.0))
    for i in range(rows):
        slowed = bool(slow[i] >= Z_SLOWDOWN)
        risen = bool(rise_z[i] >= Z_RISE)
        if z[i] >= crit[i] and gained[i] and (not slowed or t_z[i] >= t_crit):
            verdict.append(LEAK)
        elif risen and n >= 4 and (slowed or stopped[i] >= Z_SLOWDOWN):
            verdict.append(BOUNDED)
        elif ((risen or z[i] >= crit_growing[i] or (n <= SHORT and level_z[i] >= Z_GROWING))
              and slope[i] > 0 and gained[i]):
            verdict.append(GROWING)
        elif swing[i] >= CHURN_SHARE * peak[i] and swing[i] >= 3.0 * math.sqrt(peak[i]):
            verdict.append(CHURN)
        else:
            verdict.append(STEADY)
    return Judged(verdict, n, z, df, slope, se, win, slow, rise_z, rise, first, s_p2, s_t2)


def _stopped(c: Matrix, t0: int, q: int, rise: Matrix) -> Matrix:
    """z of "the last third lies below where continued growth would have put it".

    Compares the mean level of the last third with the third before it (each uncertain by
    its own spread or, at least, its counting noise), against the rise the earlier pace
    predicts over that distance. NaN when the series is too short to have two thirds.
    """
    rows, n = c.shape
    t = n - t0
    if t0 - t < 0 or n < 6:
        return np.full(rows, np.nan)
    tail, mid = c[:, t0:], c[:, t0 - t:t0]
    tail_mean, mid_mean = tail.mean(axis=1), mid.mean(axis=1)
    se = np.sqrt(np.maximum(tail.var(axis=1, ddof=1), tail_mean) / t
                 + np.maximum(mid.var(axis=1, ddof=1), mid_mean) / t)
    # Distance from the first dumps' centre to the last third's centre, and between thirds.
    span = (n - (t + 1) / 2.0) - (q - 1) / 2.0
    expected = rise * t / span
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, (expected - (tail_mean - mid_mean)) / se, 0.0)


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

    @property
    def score(self) -> float:
        """Evidence-weighted growth, for ranking within a verdict."""
        weight = min(1.0, max(self.z, 0.0) / 2.326)
        return max(self.growth, 0.0) * weight

    def with_verdict(self, verdict: str, q_value: float | None = None) -> Trend:
        """The same evidence under another verdict (after the process-wide correction)."""
        from dataclasses import replace

        more = self.more_dumps if verdict == GROWING else None
        return replace(self, verdict=verdict, q_value=q_value, more_dumps=more)


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
    half = 1.96 * float(j.se[i]) * w
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
        more_dumps=more_dumps(j, i) if verdict == GROWING else None)


def classify(values: list[float], counts: list[float] | None = None,
             times: list[float] | None = None) -> Trend:
    """Judge one series of live-byte estimates (with its sampled counts when known; without
    them every byte counts as one sample's worth, i.e. exact counting)."""
    y = np.asarray([values], dtype=np.float64)
    c = np.asarray([counts], dtype=np.float64) if counts is not None else y.copy()
    return describe(judge_counts(c), 0, c, y, times)


__all__ = ["BOUNDED", "CHURN", "GROWING", "LEAK", "STEADY", "Judged", "Trend", "classify",
           "describe", "judge_counts", "more_dumps", "normal_sf", "slope_variance"]
