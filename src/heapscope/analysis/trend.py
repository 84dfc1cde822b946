"""Classify one allocation site's live bytes over a series of dumps: leak, bounded, churn, steady.

The estimates are sampled: with a mean sampling period of R bytes, a site holding b bytes of
small objects is seen through about b/R samples of weight about R each, so its estimate jitters
by roughly sqrt(R·b) bytes from dump to dump (Poisson). Decisions therefore use rank statistics
that ignore the size of the jitter (complete separation of start and end, the Theil–Sen slope;
the Mann–Kendall z is reported as evidence) together with that noise scale: a rise counts only
when it is several noise widths tall.

- leak: the end lies wholly above the start, and growth still goes on at its earlier pace;
- bounded: a significant rise that has stopped (a cache that warmed up, a pool that filled);
- churn: no trend, but swings well above the noise;
- steady: none of these.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import median

LEAK = "leak"
BOUNDED = "bounded"
CHURN = "churn"
STEADY = "steady"

Z_TREND = 2.33  # one-sided p < 0.01 for the whole series
Z_RECENT = 1.28  # one-sided p < 0.10 for the last part: "still growing"
RISE_SIGMAS = 3.0


@dataclass(frozen=True)
class Trend:
    """The verdict on one series and the numbers behind it."""

    verdict: str
    z: float  # Mann–Kendall z-score of the whole series
    tau: float  # Kendall's tau (-1..1): how monotonic
    z_recent: float  # the same test on the last part of the series
    slope_per_dump: float  # Theil–Sen, over the growing part
    slope_per_s: float | None  # the same per second, when dump times are known
    first_growth: int | None  # index of the dump after which growth began
    fit: float  # R² of a straight line over the growing part
    rise: float  # end level minus start level, bytes
    noise: float  # the sampling noise scale at the end level, bytes

    @property
    def score(self) -> float:
        """Evidence-weighted size, for ranking: growth scaled by how monotonic it is."""
        return max(self.rise, 0.0) * max(self.tau, 0.0)


def mann_kendall(y: list[float]) -> tuple[float, float]:
    """Mann–Kendall test: (z-score with tie correction, Kendall's tau)."""
    n = len(y)
    if n < 3:
        return 0.0, 0.0
    s = 0
    for i in range(n - 1):
        yi = y[i]
        for j in range(i + 1, n):
            d = y[j] - yi
            s += (d > 0) - (d < 0)
    counts: dict[float, int] = {}
    for v in y:
        counts[v] = counts.get(v, 0) + 1
    var = (n * (n - 1) * (2 * n + 5)
           - sum(t * (t - 1) * (2 * t + 5) for t in counts.values() if t > 1)) / 18.0
    if var <= 0:
        return 0.0, 0.0
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    return z, s / (n * (n - 1) / 2)


def theil_sen(x: list[float], y: list[float]) -> float:
    """Median of pairwise slopes: a line fit that shrugs off outliers."""
    slopes = [(y[j] - y[i]) / (x[j] - x[i])
              for i in range(len(x) - 1) for j in range(i + 1, len(x)) if x[j] != x[i]]
    return median(slopes) if slopes else 0.0


def r_squared(x: list[float], y: list[float]) -> float:
    """Coefficient of determination of the least-squares line through (x, y)."""
    n = len(x)
    if n < 3:
        return 1.0 if n == 2 else 0.0
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return 0.0
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return (sxy * sxy) / (sxx * syy)


def noise_scale(level: float, period: int, object_size: float) -> float:
    """The dump-to-dump jitter of a sampled estimate around ``level`` bytes.

    Objects much larger than the period are always sampled and do not jitter; small ones do,
    by about sqrt(R·b). A floor of one object keeps exactly-sampled series from looking noisy.
    """
    r = float(max(period, 1))
    if object_size >= 8 * r:
        return max(object_size, 1.0)
    return math.sqrt(r * max(level, 0.0)) + max(object_size, 1.0)


def classify(y: list[float], times: list[float] | None, period: int,
             object_size: float) -> Trend:
    """Classify a series of live-byte estimates (one per dump, oldest first)."""
    n = len(y)
    x = [float(i) for i in range(n)]
    k = max(1, n // 5)
    start, end = median(y[: min(3, n)]), median(y[-k:])
    rise = end - start
    noise = noise_scale(max(start, end), period, object_size)
    z, tau = mann_kendall(y)
    half = n // 2
    z_recent, _tau_recent = mann_kendall(y[half:]) if n - half >= 4 else (0.0, 0.0)
    # Grew: the end sits wholly above the start (every one of the last points above every one
    # of the first), by several noise widths. A rank trend test would be fooled both ways: a
    # long, slightly sagging plateau cancels a cache's warm-up, and churn that happens to end
    # on a high phase looks like a trend.
    grew = rise > RISE_SIGMAS * noise and min(y[-k:]) > max(y[: min(3, n)])
    if n == 2:
        verdict = LEAK if rise > RISE_SIGMAS * noise else STEADY
    elif _churns(y, period, object_size):
        verdict = CHURN
    elif grew and _still_growing(y, period, object_size, noise) and not _levelled_off(y):
        verdict = LEAK
    elif grew:
        verdict = BOUNDED
    elif _swings(y, period, object_size):
        verdict = CHURN
    else:
        verdict = STEADY
    first = hinge(y) if verdict in (LEAK, BOUNDED) else None
    g = first or 0
    # The rate is measured where the site grows: from the start of growth on for a leak, up
    # to the plateau for a bounded site.
    stop = n if verdict != BOUNDED else max(g + 2, _plateau(y, noise))
    slope = theil_sen(x[g:stop], y[g:stop]) if stop - g >= 2 else 0.0
    fit = r_squared(x[g:stop], y[g:stop])
    slope_s = None
    if times is not None and len(times) == n and times[stop - 1] > times[g]:
        slope_s = theil_sen(times[g:stop], y[g:stop])
    return Trend(verdict, z, tau, z_recent, slope, slope_s, first, fit, rise, noise)


def _still_growing(y: list[float], period: int, object_size: float, noise: float) -> bool:
    """True when growth goes on over the later half of the growing stretch.

    The later half's Theil–Sen slope must keep a quarter of the earlier half's pace (a cache
    that filled up flattens out to nothing, while a sampled leak's pace wobbles by about half
    as samples arrive in Poisson clumps), and the growth it predicts over that stretch must
    stand out from the sampling noise of an increment (two widths of sqrt(R·Δ): new samples
    arrive as Poisson counts) and from the jitter of the level itself. Then the later stretch must
    climb rather than wander: its net change is at least half of all its ups and downs (a
    leak's estimate hardly ever falls, since its sampled objects are never freed, while a full
    cache's estimate falls as often as it rises).
    """
    g = hinge(y)
    grow = y[g:]
    m = len(grow)
    if m < 4:
        return False
    mid = m // 2
    xs = [float(i) for i in range(m)]
    early = theil_sen(xs[: mid + 1], grow[: mid + 1])
    late = theil_sen(xs[mid:], grow[mid:])
    delta = late * (m - mid - 1)
    counting = math.sqrt(float(max(period, 1)) * max(delta, 0.0)) + max(object_size, 1.0)
    tail = grow[mid:]
    travel = sum(abs(b - a) for a, b in itertools.pairwise(tail))
    net = tail[-1] - tail[0]
    steady_climb = travel > 0 and net >= 0.5 * travel
    at_top = max(y[-max(1, len(y) // 5):]) >= max(y) - noise
    # With few samples a leak's pace looks uneven, but it never falls: since growth began,
    # no drop at all, and new samples (rises) still arriving in the later half.
    never_falls = all(b >= a for a, b in itertools.pairwise(grow))
    if never_falls and sum(1 for a, b in itertools.pairwise(tail) if b > a) >= 3 and at_top:
        return True
    return (late > 0 and late >= 0.25 * early and delta > 2 * counting and steady_climb
            and delta > noise and at_top)


def _best_break(y: list[float], shape: str, last: int) -> tuple[int, float]:
    """Best breakpoint and its squared error for ``flat-then-rise`` or ``rise-then-flat``.

    Each candidate is a least-squares line on a bent time axis (max(0, i-c) or min(i, c));
    prefix sums make every candidate O(1), so long series stay cheap.
    """
    n = len(y)
    sy = sum(y)
    syy = sum(v * v for v in y)
    base_yy = syy - sy * sy / n
    # prefix[i] = sums over indexes < i
    py = [0.0] * (n + 1)
    piy = [0.0] * (n + 1)
    for i, v in enumerate(y):
        py[i + 1] = py[i] + v
        piy[i + 1] = piy[i] + i * v
    best, best_c = float("inf"), 0
    for c in range(0, last):
        if shape == "flat-then-rise":
            m = n - 1 - c  # x = 1..m for i = c+1..n-1
            sx = m * (m + 1) / 2.0
            sxx = m * (m + 1) * (2 * m + 1) / 6.0
            sxy = (piy[n] - piy[c + 1]) - c * (py[n] - py[c + 1])
        else:
            tail = n - 1 - c  # x = i for i <= c, then c
            sx = c * (c + 1) / 2.0 + c * tail
            sxx = c * (c + 1) * (2 * c + 1) / 6.0 + c * c * tail
            sxy = piy[c + 1] + c * (py[n] - py[c + 1])
        vxx = sxx - sx * sx / n
        if vxx <= 0:
            continue
        vxy = sxy - sx * sy / n
        sse = base_yy - vxy * vxy / vxx
        if best == float("inf") or sse < best - 1e-9 * (abs(best) + 1.0):
            best, best_c = sse, c
    return best_c, best


def hinge(y: list[float]) -> int:
    """Where growth began: the break of the best flat-then-straight least-squares fit."""
    return _best_break(y, "flat-then-rise", max(1, len(y) - 2))[0]


def _levelled_off(y: list[float]) -> bool:
    """True when "a ramp, then flat" explains the series far better than "flat, then a
    straight climb to the end", and the flat part really is a full cache: its estimate falls
    as well as rises (objects leave it). A sampled leak can sit still for a few dumps while no
    new sample arrives, but it does not fall: its sampled objects are never freed."""
    n = len(y)
    k = max(3, n // 5)
    if n < 2 * k:
        return False
    _c, leak_sse = _best_break(y, "flat-then-rise", n - 2)
    c, bounded_sse = _best_break(y, "rise-then-flat", n - k)
    moves = [b - a for a, b in itertools.pairwise(y[c:]) if b != a]
    falls = sum(1 for d in moves if d < 0)
    return bounded_sse < 0.5 * leak_sse and bool(moves) and falls >= 0.25 * len(moves)


def _plateau(y: list[float], noise: float) -> int:
    """The first dump at which a bounded site reached its final level."""
    level = median(y[-max(1, len(y) // 5):])
    for i, v in enumerate(y):
        if v >= level - noise:
            return i + 1
    return len(y)


def _churns(y: list[float], period: int, object_size: float) -> bool:
    """Large falls from a running peak while the floor stays put: memory taken and given back.

    A leak that also frees in bursts (a sawtooth on a rising floor) is not churn: its floor,
    the lowest level still to come, rises.
    """
    n = len(y)
    peak, fall = y[0], 0.0
    for v in y:
        peak = max(peak, v)
        fall = max(fall, peak - v)
    top = max(y)
    if fall <= max(2 * RISE_SIGMAS * noise_scale(top, period, object_size), 0.25 * top):
        return False
    floor = [min(y[i:]) for i in range(n)]
    k = max(1, n // 5)
    return floor[-k] - floor[0] <= RISE_SIGMAS * noise_scale(floor[0], period, object_size)


def _swings(y: list[float], period: int, object_size: float) -> bool:
    lo, hi = min(y), max(y)
    return (hi - lo) > 2 * RISE_SIGMAS * noise_scale(hi, period, object_size) \
        and (hi - lo) > 0.25 * hi
