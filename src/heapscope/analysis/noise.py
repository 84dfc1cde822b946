"""The noise model of a site's sampled count over a series, and the sums that feed it.

A site's count is a persistent part (a random walk: new samples that stay, a cache's
evictions and refills) plus a transient part (white noise: objects renewed between dumps);
see :mod:`heapscope.analysis.trend`. This module holds the arithmetic: variances of
least-squares slopes under that model, moments of increments over any stretch of any row
(prefix sums, so each is O(1) per row), the split of the noise into its two parts, and where
growth began. Everything works on many rows (sites) at once.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]

Z_SPLIT = 1.645  # one-sided 5%: increments anti-correlated, so part of the noise is transient


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


class Sums:
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
