"""analysis/noise.py: the variogram is row by row, so rows can be judged together.

The trend test calls :func:`variogram` once for all rows whose window starts at the same
dump; that must give each row exactly (bit for bit) what a call with the row alone gives,
or verdicts would depend on which other sites a process has.
"""

from __future__ import annotations

import numpy as np

from heapscope.analysis.noise import variogram


def test_rows_together_give_each_row_its_own_numbers() -> None:
    rng = np.random.default_rng(7)
    for n in (8, 12, 30, 61, 300):
        walks = np.cumsum(rng.poisson(3.0, size=(40, n)), axis=1).astype(np.float64)
        steps = np.repeat(rng.integers(0, 5, size=(40, 1)), n, axis=1).astype(np.float64)
        steps[:, n // 2:] += 1  # one step up halfway
        c = np.vstack([walks, steps, np.zeros((3, n))])
        s_p2, s_t2 = variogram(c)
        for i in range(c.shape[0]):
            one_p2, one_t2 = variogram(c[i:i + 1])
            # exact equality (NaN where both are NaN)
            np.testing.assert_array_equal(one_p2, s_p2[i:i + 1])
            np.testing.assert_array_equal(one_t2, s_t2[i:i + 1])


def test_a_poisson_walk_is_persistent_noise() -> None:
    """A walk of Poisson(λ) steps wanders by λ per dump (s_p² ≈ λ) with no transient part;
    the same walk seen through independent ±noise of variance σ² at each dump adds s_t² ≈ σ²
    (Var(c[t+h] - c[t]) = h·λ + 2σ²)."""
    rng = np.random.default_rng(11)
    lam, sigma2, n = 4.0, 9.0, 400
    walk = np.cumsum(rng.poisson(lam, size=(200, n)), axis=1).astype(np.float64)
    s_p2, s_t2 = variogram(walk)
    assert abs(float(np.median(s_p2)) - lam) < 0.15 * lam
    assert float(np.median(s_t2)) < 0.5
    noisy = walk + rng.normal(0.0, np.sqrt(sigma2), size=walk.shape)
    s_p2, s_t2 = variogram(noisy)
    assert abs(float(np.median(s_p2)) - lam) < 0.3 * lam
    assert abs(float(np.median(s_t2)) - sigma2) < 0.3 * sigma2
