"""Object-level simulation of jemalloc's heap-profile sampling, for the leak-verdict tests.

jemalloc samples each allocation of size s with probability p = 1 - exp(-s/R) (R the mean
sample period) and a sampled object stays in every later dump until the object is freed. A
dump lists, per stack, the number of sampled objects still live; the estimate of live bytes
is count·s/p. This module reproduces exactly that, object by object (in distribution): a
site's objects are born, sampled or not, and die by the site's lifetime law, and each dump
reports the sampled survivors. Many independent runs of one scenario are simulated at once
(one row per run).

A site's behaviour is a :class:`Plan` (a sum of parts: leaked objects, short-lived objects
renewed at every dump, a cache that fills and then turns over, a cache that is flushed, a
table made at start); its truth label says what a correct leak finder calls it.
:func:`write_series` writes a simulated series as real heap_v2 dump files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

KIB = 1024
MIB = 1024 * 1024

LEAK = "leak"  # still growing at the end of the series
NOT_LEAK = "not-leak"  # caches, churn, steady tables, leaks that stopped


def sample_probability(size: int, period: int) -> float:
    """jemalloc's chance of sampling one object of ``size`` bytes (mean period ``period``)."""
    return 1.0 - math.exp(-size / period) if period > 0 else 1.0


@dataclass(frozen=True)
class Plan:
    """One allocation site's behaviour over ``n`` dumps, in objects of one size.

    Rates are in *expected samples per dump* (the unit the statistics care about); the
    simulator turns them into objects with the sample probability. ``truth`` is the verdict
    a correct classifier gives.
    """

    truth: str
    leak: float = 0.0  # expected new samples per dump that are never freed
    leak_start: float = 0.0  # fraction of the series before the leak starts
    leak_stop: float = 1.0  # fraction of the series after which it stops
    transient: float = 0.0  # expected samples of objects renewed before every dump
    spread: float = 0.0  # churn: the renewed level varies uniformly by ±spread
    swing: int = 0  # churn: the renewed level alternates low/high every `swing` dumps
    cache: float = 0.0  # expected samples in a full cache
    fill: float = 0.0  # fraction of the series the cache takes to fill (0: one dump)
    turnover: float = 0.0  # fraction of a full cache evicted and replaced per dump
    flush_every: int = 0  # a cache that grows and is emptied every `flush_every` dumps
    steady: float = 0.0  # expected samples of a table built before the first dump
    size: int = 64  # object size, bytes
    keep_at_exit: float = 0.0  # fraction of live objects still live after a teardown


@dataclass
class Series:
    """Simulated dumps of one site: sampled counts per run and dump, and their estimates."""

    counts: np.ndarray  # runs × dumps, sampled live objects
    size: int
    period: int
    teardown: bool  # the last column is a dump taken after a clean teardown

    @property
    def p(self) -> float:
        """The sample probability of one object."""
        return sample_probability(self.size, self.period)

    @property
    def bytes(self) -> np.ndarray:
        """jeprof's estimate of live bytes, runs × dumps."""
        return self.counts * (self.size / self.p)


def _objects(samples: float, p: float) -> int:
    """Objects to allocate so that ``samples`` are expected to be sampled."""
    return max(0, round(samples / p))


def intervals(runs: int, n: int, kind: str, rng: np.random.Generator,
              group: int = 1) -> np.ndarray:
    """The time each dump's interval covers, runs × n, in mean dump intervals (each row sums
    to ``n``), for the dumps of a process whose rounds come unevenly. ``kind``:

    - ``even``: every interval 1;
    - ``jitter``: uniform in [0.5, 1.5] (a busy machine);
    - ``loaded``: 1, or with chance 0.15 each a late round (2-4) or a hurried one (0.1-0.3),
      as when many processes are dumped per round on a loaded machine.

    Runs come in groups of ``group`` sharing one draw (the processes of one session share
    their rounds; one judgement takes one row of times for all its rows).
    """
    draws = -(-runs // group)
    if kind == "even":
        dt = np.ones((draws, n))
    elif kind == "jitter":
        dt = rng.uniform(0.5, 1.5, (draws, n))
    elif kind == "loaded":
        u = rng.uniform(size=(draws, n))
        dt = np.where(u < 0.15, rng.uniform(2.0, 4.0, (draws, n)),
                      np.where(u < 0.30, rng.uniform(0.1, 0.3, (draws, n)), 1.0))
    else:
        raise ValueError(f"unknown interval kind {kind}")
    dt *= n / dt.sum(axis=1, keepdims=True)
    return np.repeat(dt, group, axis=0)[:runs]


def _within(clock: np.ndarray | float, step: np.ndarray | float, start: float,
            stop: float) -> np.ndarray:
    """The part of the interval [clock, clock + step) within [start, stop): an interval that
    straddles a leak's end holds only the growth up to it."""
    return np.clip(np.minimum(np.add(clock, step), stop) - np.maximum(clock, start), 0.0, None)


def simulate(plan: Plan, n: int, period: int, runs: int, rng: np.random.Generator,
             teardown: bool = False, dt: np.ndarray | None = None) -> Series:
    """``runs`` independent runs of ``plan`` over ``n`` dumps at sample period ``period``.

    With ``teardown`` one more dump follows the last: the program freed everything but
    ``keep_at_exit`` of it (the dump jemalloc writes at exit after a clean shutdown). With
    ``dt`` (runs × n, :func:`intervals`) the dumps come at uneven times: a plan's rates are
    per mean interval, and the program's clock (when a leak starts or stops, a cache's fill
    and turnover, a flush) runs in that time; without it every interval is 1.
    """
    p = sample_probability(plan.size, period)
    out = np.zeros((runs, n + (1 if teardown else 0)), dtype=np.int64)
    persistent = np.zeros(runs, dtype=np.int64)  # leaked and steady samples
    cache = np.zeros(runs, dtype=np.int64)
    cache_objects = np.zeros(runs, dtype=np.int64)  # all objects in the cache
    if plan.steady:
        persistent += rng.binomial(_objects(plan.steady, p), p, runs)
    leak_objects = _objects(plan.leak, p)
    start, stop = plan.leak_start * n, plan.leak_stop * n
    capacity = _objects(plan.cache, p)
    fill_dumps = max(1, round(plan.fill * n))
    per_fill = math.ceil(capacity / fill_dumps) if capacity else 0
    flush_every = plan.flush_every
    even = dt is None
    if dt is None:
        dt = np.ones((runs, n))
    clock = np.zeros(runs)  # the program's time at the start of each interval
    before = clock.copy()  # ... and at the start of the one before
    for t in range(n):
        step = dt[:, t]
        if leak_objects:
            if even:
                span = np.where((start <= clock) & (clock < stop), 1.0, 0.0)
            else:
                span = _within(clock, step, start, stop)
            born = np.round(leak_objects * span).astype(np.int64)
            persistent += rng.binomial(born, p)
        if capacity:
            if flush_every and t:
                # flushed when the program's clock passed a multiple of flush_every
                flush = np.floor(clock / flush_every) > np.floor(before / flush_every)
                cache[flush] = 0
                cache_objects[flush] = 0
            full = cache_objects >= capacity
            if plan.turnover and full.any():
                # Random eviction: every object leaves with the same chance, sampled or not;
                # each is replaced by a new object, sampled with probability p.
                share = plan.turnover if even else 1.0 - (1.0 - plan.turnover) ** step
                evicted = rng.binomial(capacity, share, runs)
                cache -= np.where(full, rng.binomial(cache, share), 0)
                cache += np.where(full, rng.binomial(evicted, p), 0)
            grow = np.minimum(np.round(per_fill * step).astype(np.int64),
                              np.maximum(capacity - cache_objects, 0))
            grow = np.where(full, 0, grow)
            if grow.any():
                cache += rng.binomial(grow, p)
                cache_objects += grow
        level = 0
        if plan.transient:
            mean = plan.transient
            if plan.spread:
                mean = mean * (1 + plan.spread * rng.uniform(-1, 1, runs))
            elif plan.swing:
                mean = mean * (0.25 if (t // plan.swing) % 2 == 0 else 1.75)
            objects = np.maximum(np.round(np.asarray(mean) / p), 0).astype(np.int64)
            level = rng.binomial(np.broadcast_to(objects, (runs,)), p)
        out[:, t] = persistent + cache + level
        before = clock.copy()
        clock += step
    if teardown:
        live = out[:, n - 1]
        out[:, n] = rng.binomial(live, plan.keep_at_exit) if plan.keep_at_exit else 0
    return Series(out, plan.size, period, teardown)


# --------------------------------------------------------------------------------------
# The scenario matrix


@dataclass(frozen=True)
class Case:
    """One cell of the scenario matrix: a plan, a series length and a sample period."""

    name: str
    plan: Plan
    n: int
    period: int
    teardown: bool = False

    @property
    def label(self) -> str:
        """A short unique description."""
        r = f"{self.period // KIB}k"
        end = " +exit" if self.teardown else ""
        return f"{self.name} n={self.n} R={r} s={self.plan.size}{end}"


PERIODS = (4 * KIB, 64 * KIB, 512 * KIB)
SIZES = (16, 256, 4 * KIB, 64 * KIB, MIB)


def _size_for(i: int) -> int:
    return SIZES[i % len(SIZES)]


def leak_cases() -> list[Case]:
    """Leaks the classifier must call ``leak`` (where the target applies, see below)."""
    cases = []
    i = 0
    for rate in (1, 2, 4, 10):
        for n in (3, 6, 10, 30, 100):
            for period in PERIODS:
                size = _size_for(i)
                i += 1
                cases.append(Case(f"leak {rate}/dump", Plan(LEAK, leak=rate, steady=20,
                                                            size=size), n, period))
    for mult in (10, 25):
        for rate in (2, 4, 10):
            for n in (10, 30, 100):
                for period in PERIODS:
                    size = _size_for(i)
                    i += 1
                    # the churn's level varies by ±50% from dump to dump, or only by its
                    # own sampling (a steady request rate)
                    for spread, how in ((0.5, "±50%"), (0.0, "steady")):
                        cases.append(Case(f"leak {rate}/dump + {how} churn {mult}x",
                                          Plan(LEAK, leak=rate, transient=mult * rate,
                                               spread=spread, size=size), n, period))
    for rate in (2, 4):
        for n in (10, 30, 100):
            for period in PERIODS:
                size = _size_for(i)
                i += 1
                cases.append(Case(f"late leak {rate}/dump", Plan(LEAK, leak=rate, leak_start=0.6,
                                                                 steady=10, size=size),
                                  n, period))
    for n in (20, 30, 100):
        for period in PERIODS:
            size = _size_for(i)
            i += 1
            cases.append(Case("slow leak 1/dump", Plan(LEAK, leak=1, steady=30, size=size),
                              n, period))
    return cases


def null_cases() -> list[Case]:
    """Sites that are not leaks: caches, churn, steady tables, leaks that stopped."""
    cases = []
    i = 0
    for n in (6, 10, 30, 100):
        for period in PERIODS:
            size = _size_for(i)
            i += 1
            for cap in (20, 200, 1000):
                for fill in (0.0, 2 / n, 1 / 3):
                    for turnover in (0.05, 0.3):
                        cases.append(Case(
                            f"cache {cap} fill {fill:.2f} turnover {turnover:.0%}",
                            Plan(NOT_LEAK, cache=cap, fill=fill, turnover=turnover, size=size),
                            n, period))
            cases.append(Case("flush cache", Plan(NOT_LEAK, cache=100, fill=0.1,
                                                  flush_every=max(2, n // 5), size=size),
                              n, period))
            for level in (5, 50, 500):
                cases.append(Case(f"churn around {level}",
                                  Plan(NOT_LEAK, transient=level, spread=0.5, size=size),
                                  n, period))
                cases.append(Case(f"square churn {level}",
                                  Plan(NOT_LEAK, transient=level, swing=max(1, n // 8),
                                       size=size), n, period))
            cases.append(Case("steady table", Plan(NOT_LEAK, steady=100, size=size), n, period))
            for rate in (2, 10):
                cases.append(Case(f"stopped leak {rate}/dump",
                                  Plan(NOT_LEAK, leak=rate, leak_stop=1 / 3, steady=10,
                                       size=size), n, period))
    return cases


def with_teardown(cases: Sequence[Case]) -> list[Case]:
    """The same cases, each followed by a dump taken after a clean teardown."""
    return [replace(c, teardown=True) for c in cases]


# --------------------------------------------------------------------------------------
# Real dump files


def write_series(folder: Path, pid: int, sites: dict[int, Series], run: int,
                 *, start_address: int = 0x555555555000) -> list[Path]:
    """Write run ``run`` of the simulated ``sites`` as heap_v2 dumps of one process.

    ``sites`` maps a code offset (a distinct one-frame stack each) to its series; the
    mapping names a file that does not exist, so the sites show as ``sim+0xOFFSET``. The
    last dump is a final (``.f.``) dump; the others are manual (``.m<i>.``) dumps.
    """
    folder.mkdir(parents=True, exist_ok=True)
    periods = {s.period for s in sites.values()}
    if len(periods) != 1:
        raise ValueError("all sites of one process share the sample period")
    (period,) = periods
    n = max(s.counts.shape[1] for s in sites.values())
    limit = start_address + 0x100000
    paths = []
    for t in range(n):
        lines = [f"heap_v2/{period}"]
        body = []
        total_c = total_b = 0
        for offset, s in sorted(sites.items()):
            c = int(s.counts[run, t]) if t < s.counts.shape[1] else 0
            if c <= 0:
                continue
            b = c * s.size
            total_c += c
            total_b += b
            # A return address points after the call; the reader subtracts one.
            body.append(f"@ 0x{start_address + offset + 1:x}")
            body.append(f"  t*: {c}: {b} [0: 0]")
        lines.append(f"  t*: {total_c}: {total_b} [0: 0]")
        lines += body
        lines += ["", "MAPPED_LIBRARIES:",
                  f"{start_address:x}-{limit:x} r-xp 00000000 00:00 0   /nonexistent/sim"]
        kind = "f" if t == n - 1 else f"m{t}"
        path = folder / f"jeprof.{pid}.{t}.{kind}.heap"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_counts(folder: Path, pid: int, counts: dict[int, list[int]], size: int = 4096,
                 period: int = 4096) -> list[str]:
    """Dumps of one process whose one-frame stacks (code offsets) hold exactly ``counts``
    sampled objects of ``size`` bytes at each dump, written a minute apart (mtimes from
    2027-01-15), as :func:`write_series` writes them."""
    sites = {off: Series(np.asarray([c]), size, period, False) for off, c in counts.items()}
    paths = write_series(folder, pid, sites, 0)
    for i, p in enumerate(paths):
        os.utime(p, (1_800_000_000 + 60 * i, 1_800_000_000 + 60 * i))
    return [str(p) for p in paths]


# --------------------------------------------------------------------------------------
# Sites of big objects: pools that grow in blocks, big buffers, vectors that double


POOL_FIRST = 8 * KIB  # an AllocSet-like pool's first block
POOL_MAX = 8 * MIB  # and its largest: blocks double up to this size


@dataclass(frozen=True)
class BlockPlan:
    """One site whose objects are big or of changing sizes, simulated object by object.

    ``kind`` is one of:

    - ``pool``: ``rate`` bytes a dump of small chunks kept in a pool that mallocs blocks
      doubling from 8 KiB to 8 MiB as it fills (PostgreSQL's AllocSet, APR and nginx pools):
      the chunks are never freed; ``cap`` bytes of blocks at most (a pool that stops);
    - ``blocks``: ``rate`` objects of ``size`` bytes a dump, never freed, arriving as a
      Poisson count (``regular`` False) or one every 1/rate dumps at a random phase;
    - ``cache``: up to ``cap`` objects of ``size``, filled over ``fill`` of the series, then
      ``turnover`` of them freed and replaced a dump (at random times between dumps);
    - ``churn``: a Poisson count of ``rate`` objects of ``size`` live at each dump, renewed;
    - ``vector``: one buffer that doubles from 64 KiB as it fills at a steady pace, up to
      ``cap`` bytes, reached after ``fill`` of the series (the old buffer is freed).

    ``start``/``stop`` bound the fraction of the series over which it grows; ``preload``
    dumps' worth of growth happened before the first dump.
    """

    truth: str
    kind: str
    rate: float = 0.0
    size: int = 8 * MIB
    cap: float = math.inf
    fill: float = 1 / 3
    turnover: float = 0.0
    start: float = 0.0
    stop: float = 1.0
    preload: float = 0.0
    regular: bool = True
    jitter: float = 0.3  # pool: the bytes per dump vary uniformly by ±jitter


@dataclass
class BlockSeries:
    """Simulated dumps of one site: sampled objects, their bytes, and jeprof's estimates."""

    counts: np.ndarray  # runs × dumps, sampled live objects
    raw: np.ndarray  # runs × dumps, bytes of the sampled live objects
    period: int

    @property
    def bytes(self) -> np.ndarray:
        """jeprof's estimate of live bytes (the mean object size decides the scale)."""
        return self._scaled(self.raw)

    @property
    def objects(self) -> np.ndarray:
        """jeprof's estimate of live objects."""
        return self._scaled(self.counts.astype(float))

    def _scaled(self, a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(self.counts > 0, self.raw / np.maximum(self.counts, 1), 0.0)
            p = np.where(mean > 0, -np.expm1(-mean / self.period), 1.0)
        return np.asarray(a / p, dtype=np.float64)


def _pool_blocks(total: float, cap: float) -> list[int]:
    """The blocks a pool holds once ``total`` bytes of chunks were put in it."""
    blocks: list[int] = []
    held = 0
    size = POOL_FIRST
    while held < total and held + size <= cap:
        blocks.append(size)
        held += size
        size = min(2 * size, POOL_MAX)
    return blocks


def simulate_blocks(plan: BlockPlan, n: int, period: int, runs: int,
                    rng: np.random.Generator, dt: np.ndarray | None = None) -> BlockSeries:
    """``runs`` independent runs of ``plan`` over ``n`` dumps at sample period ``period``;
    with ``dt`` at uneven times, as in :func:`simulate`."""
    counts = np.zeros((runs, n), dtype=np.int64)
    raw = np.zeros((runs, n), dtype=np.float64)
    start, stop = plan.start * n, plan.stop * n
    even = dt is None
    steps = np.ones((runs, n)) if dt is None else dt
    for r in range(runs):
        live: list[tuple[int, bool]] = []  # (size, sampled) of each live object
        grown = plan.preload  # dumps' worth of growth so far (pool: in bytes below)
        phase = rng.uniform()
        pooled = plan.preload * plan.rate
        clock = 0.0  # the program's time at the start of the interval
        for t in range(n):
            step = float(steps[r, t])
            growing = start <= clock < stop
            span = step  # the part of the interval the site grows in
            if not even:
                span = float(_within(clock, step, start, stop))
                growing = span > 0
            if plan.kind == "pool":
                if growing:
                    pooled += plan.rate * span * (1 + plan.jitter * rng.uniform(-1, 1))
                want = _pool_blocks(pooled, plan.cap)
                for size in want[len(live):]:
                    live.append((size, rng.uniform() < sample_probability(size, period)))
            elif plan.kind == "blocks":
                if growing:
                    if plan.regular:
                        before = math.floor(grown * plan.rate + phase)
                        grown += span
                        new = math.floor(grown * plan.rate + phase) - before
                    else:
                        new = int(rng.poisson(plan.rate * span))
                    p = sample_probability(plan.size, period)
                    live += [(plan.size, bool(rng.uniform() < p)) for _ in range(new)]
            elif plan.kind == "cache":
                p = sample_probability(plan.size, period)
                target = plan.cap * min(1.0, (clock + step) / max(1.0, plan.fill * n))
                while len(live) < math.floor(target):
                    live.append((plan.size, bool(rng.uniform() < p)))
                if len(live) >= plan.cap and plan.turnover:
                    # evicted objects leave; a random share of their replacements arrived by
                    # the time of the dump
                    share = plan.turnover if even else 1.0 - (1.0 - plan.turnover) ** step
                    out = rng.binomial(len(live), share)
                    for _ in range(out):
                        live.pop(int(rng.integers(len(live))))
                    back = out if rng.uniform() < 0.5 else int(rng.binomial(out, 0.5))
                    live += [(plan.size, bool(rng.uniform() < p)) for _ in range(back)]
            elif plan.kind == "churn":
                p = sample_probability(plan.size, period)
                live = [(plan.size, bool(rng.uniform() < p))
                        for _ in range(int(rng.poisson(plan.rate)))]
            elif plan.kind == "vector":
                # linear fill to the cap over `fill` of the series; capacity doubles
                used = plan.cap * min(1.0, (clock + step) / max(1.0, plan.fill * n))
                size = 64 * KIB
                while size < used:
                    size *= 2
                if not live or live[0][0] != size:
                    live = [(size, bool(rng.uniform() < sample_probability(size, period)))]
            else:
                raise ValueError(f"unknown kind {plan.kind}")
            sampled = [s for s, kept in live if kept]
            counts[r, t] = len(sampled)
            raw[r, t] = float(sum(sampled))
            clock += step
    return BlockSeries(counts, raw, period)


@dataclass(frozen=True)
class BlockCase:
    """One cell of the big-object matrix."""

    name: str
    plan: BlockPlan
    n: int
    period: int = 512 * KIB

    @property
    def label(self) -> str:
        """A short unique description."""
        return f"{self.name} n={self.n} R={self.period // KIB}k"


def block_leak_cases() -> list[BlockCase]:
    """Leaks of big objects: staircases the classifier must call ``leak``."""
    cases = []
    for n in (6, 10, 20, 30, 40, 60, 100):
        # PostgreSQL's TopMemoryContext leak: chunks into AllocSet blocks, 8 MiB steps every
        # 8, 4 or 2 dumps once the blocks reached their largest size
        for mib in (1, 2, 4):
            cases.append(BlockCase(f"pool leak {mib} MiB/dump",
                                   BlockPlan(LEAK, "pool", rate=mib * MIB, preload=1), n))
        for every in (2, 5):
            for regular in (True, False):
                rhythm = "rhythm" if regular else "poisson"
                cases.append(BlockCase(f"8 MiB block every {every} dumps ({rhythm})",
                                       BlockPlan(LEAK, "blocks", rate=1 / every,
                                                 regular=regular), n))
        cases.append(BlockCase("1 MiB objects, 2 a dump (poisson)",
                               BlockPlan(LEAK, "blocks", rate=2, size=MIB, regular=False), n))
    return cases


def block_null_cases() -> list[BlockCase]:
    """Big-object sites that are not leaks: pools and caches that fill and stop, vectors
    that double to their final size, big buffers renewed per request, stopped staircases."""
    cases = []
    for n in (6, 10, 20, 30, 40, 60, 100):
        for cap in (3, 5, 8):  # a pool capped after `cap` blocks of its largest sizes
            cap_bytes = (POOL_MAX - POOL_FIRST) + cap * POOL_MAX  # the doubling, then caps
            for fill in (2 / n, 1 / 3, 1 / 2):
                rate = cap_bytes / max(1.0, fill * n)
                cases.append(BlockCase(f"pool of {cap} x 8 MiB filled over {fill:.2f}",
                                       BlockPlan(NOT_LEAK, "pool", rate=rate, cap=cap_bytes,
                                                 jitter=0.3), n))
        for fill in (2 / n, 1 / 3, 1 / 2):
            cases.append(BlockCase(f"vector doubling to 64 MiB over {fill:.2f}",
                                   BlockPlan(NOT_LEAK, "vector", cap=64 * MIB, fill=fill), n))
        for cap in (4, 16):
            for turnover in (0.05, 0.3):
                cases.append(BlockCase(f"cache of {cap} x 8 MiB turnover {turnover:.0%}",
                                       BlockPlan(NOT_LEAK, "cache", cap=cap, fill=1 / 3,
                                                 turnover=turnover), n))
        for level in (1, 4):
            cases.append(BlockCase(f"8 MiB buffers renewed, {level} live",
                                   BlockPlan(NOT_LEAK, "churn", rate=level), n))
        for stop in (1 / 3, 1 / 2):
            cases.append(BlockCase(f"staircase stopped at {stop:.2f}",
                                   BlockPlan(NOT_LEAK, "blocks", rate=1 / 2, stop=stop), n))
            cases.append(BlockCase(f"pool leak 2 MiB/dump stopped at {stop:.2f}",
                                   BlockPlan(NOT_LEAK, "pool", rate=2 * MIB, stop=stop,
                                             preload=1), n))
    return cases


def observe(case: Case | BlockCase, runs: int, rng: np.random.Generator,
            dt: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None]:
    """``runs`` runs of ``case`` as a dump series shows them: (sampled counts, estimated
    bytes, estimated objects), runs × dumps, and the true leak rate in bytes per dump (None
    where the truth is not a leak, or not one rate: a leak that starts late). With ``dt``
    (:func:`intervals`) the dumps come at uneven times; the rate is per mean interval."""
    if isinstance(case, BlockCase):
        b = simulate_blocks(case.plan, case.n, case.period, runs, rng, dt)
        p = case.plan
        rate = (p.rate if p.kind == "pool" else p.rate * p.size) if p.truth == LEAK else None
        return b.counts.astype(float), b.bytes, b.objects, rate
    s = simulate(case.plan, case.n, case.period, runs, rng, dt=dt)
    c = s.counts.astype(float)
    leaking = case.plan.truth == LEAK and not case.plan.leak_start
    # the simulator allocates whole objects: the rate is theirs, not the plan's samples
    truth = _objects(case.plan.leak, s.p) * s.size if leaking else None
    return c, c * (s.size / s.p), c / s.p, truth
