"""Unsampling follows jeprof's AdjustSamples exactly, per stack, never from the header."""

from __future__ import annotations

import math

import pytest

from heapscope.analysis.unsample import scale_pair_v1, scale_pair_v2, unsample
from heapscope.model import Profile, Sample


def test_v2_formula() -> None:
    n, s = scale_pair_v2(10, 480, 4096)
    f = 1 / (1 - math.exp(-(48 / 4096)))
    assert n == pytest.approx(10 * f)
    assert s == pytest.approx(480 * f)


def test_v2_large_objects_barely_scaled() -> None:
    n, s = scale_pair_v2(2, 2 * 1048576, 4096)
    assert (n, s) == pytest.approx((2, 2 * 1048576))


def test_zero_count_untouched() -> None:
    assert scale_pair_v2(0, 0, 4096) == (0, 0)
    assert scale_pair_v1(0, 0, 4096) == (0, 0)


def test_v1_divides_only_small_ratios() -> None:
    assert scale_pair_v1(4, 400, 1000) == pytest.approx((40, 4000))
    assert scale_pair_v1(4, 40000, 1000) == (4, 40000)


def test_per_stack_then_sum_not_header() -> None:
    samples = (Sample((1,), (10, 480, 10, 480)), Sample((2,), (2, 2097152, 2, 2097152)))
    p = Profile(samples=samples, period=4096, sampling="v2", header=(12, 999, 12, 999))
    u = unsample(p)
    # By hand: each stack's bytes times 1/(1-exp(-avg/R)), then the sum (never the header).
    expect = (480 / (1 - math.exp(-48 / 4096))
              + 2097152 / (1 - math.exp(-1048576 / 4096)))
    assert u.total(1) == pytest.approx(expect)
    assert u.unsampled and unsample(u) is u


def test_unsampled_profile_not_scaled() -> None:
    p = Profile(samples=(Sample((1,), (3, 30, 3, 30)),), sampling="none")
    assert unsample(p).samples[0].values == (3, 30, 3, 30)
