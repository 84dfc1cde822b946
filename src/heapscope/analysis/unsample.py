"""Undo heap-profile sampling: estimate true object counts and bytes from sampled counts.

jemalloc samples an allocation of size x with probability 1-exp(-x/R) (a Poisson process with
mean period R bytes). jeprof's estimate (``AdjustSamples`` in ``bin/jeprof.in``) scales a
stack's (count, bytes) pair by 1/(1-exp(-(bytes/count)/R)), separately for the in-use and the
cumulative pair. jemalloc 5.3 writes values pre-fudged so that this very formula gives unbiased
results, so it is right for every heap_v2 dump. It must be applied per stack and only then
summed; the header ``t*`` totals are not additive. Legacy ``heap/P`` (v1) profiles divide by
ratio when ratio < 1.
"""

from __future__ import annotations

import math

from heapscope.errors import InputError
from heapscope.model import Profile, Sample, Thread, ThreadValues
from heapscope.native import core


def scale_pair_v2(count: float, size: float, period: int) -> tuple[float, float]:
    """jeprof's v2 adjustment of one (count, bytes) pair for mean sampling period ``period``."""
    if count == 0 or period <= 0:
        return count, size
    ratio = (size / count) / period
    # -expm1(-r) is 1 - exp(-r) without the cancellation that makes it 0.0 (and the factor
    # a division by zero) for a ratio below 1e-16: objects far smaller than the period.
    factor = -1.0 / math.expm1(-ratio) if ratio > 0 else 1.0
    return count * factor, size * factor


def scale_pair_v1(count: float, size: float, period: int) -> tuple[float, float]:
    """jeprof's v1 adjustment of one (count, bytes) pair."""
    if count == 0 or period <= 0:
        return count, size
    ratio = (size / count) / period
    if 0 < ratio < 1:
        return count / ratio, size / ratio
    return count, size


def scale_values(values: tuple[float, ...], sampling: str, period: int) -> tuple[float, ...]:
    """Unsample a four-value tuple (inuse objs, inuse bytes, alloc objs, alloc bytes)."""
    if sampling == "v2":
        fn = scale_pair_v2
    elif sampling == "v1":
        fn = scale_pair_v1
    else:
        return values
    a = fn(values[0], values[1], period)
    b = fn(values[2], values[3], period)
    return (a[0], a[1], b[0], b[1])


def unsample(profile: Profile) -> Profile:
    """Return a profile whose values are estimates of the true counts and bytes;
    InputError when an estimate is not a finite number."""
    if profile.unsampled:
        return profile
    mode, period = profile.sampling, profile.period
    if mode not in ("v1", "v2"):
        return profile.with_(unsampled=True)
    memo: dict[tuple[float, ...], tuple[float, ...]] = {}

    def scaled(values: tuple[float, ...]) -> tuple[float, ...]:
        # Many stacks share the same counts; the formula is pure, so compute each pair once.
        out = memo.get(values)
        if out is None:
            out = memo[values] = finite(scale_values(values, mode, period))
        return out

    def finite(values: tuple[float, ...]) -> tuple[float, ...]:
        if not all(map(math.isfinite, values)):
            # Only absurd counts do this (fractions of a byte per object): damage, said in
            # one line rather than estimates of inf bytes.
            raise InputError(profile.source or "the profile",
                             "counts whose unsampled estimate is past any number "
                             "(a damaged dump?)")
        return values

    fast = core.with_values(profile.samples, scaled, Sample) if core is not None else None
    samples = tuple(fast) if fast is not None else tuple(
        Sample(
            s.stack,
            scaled(s.values),
            tuple(ThreadValues(t.thread, scaled(t.values)) for t in s.threads)
            if s.threads
            else (),
            s.via,
        )
        for s in profile.samples
    )
    threads = tuple(
        Thread(t.id, t.name, finite(scale_values(t.values, mode, period)) if t.values else ())
        for t in profile.threads
    )
    return profile.with_(samples=samples, threads=threads, unsampled=True, same_stacks=True)
