"""Goodness of fit of the exact discrete Gaussian sampler, and proof the check can fail."""

from fractions import Fraction
from math import exp

import numpy as np
import pytest
from scipy import stats

from cuvil.edge_runtime.privacy.dgauss import bernoulli_exp, discrete_gaussian, discrete_laplace
from cuvil.edge_runtime.privacy.rng import ChaChaRandom

ALPHA = 1e-6


def dgauss_pmf(sigma2: float, support: np.ndarray) -> np.ndarray:
    ys = np.arange(-60 * int(sigma2**0.5) - 60, 60 * int(sigma2**0.5) + 61)
    norm = np.exp(-(ys.astype(float) ** 2) / (2 * sigma2)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma2)) / norm


def chi2_pvalue(samples: np.ndarray, sigma2: float) -> float:
    """Chi-square against the exact pmf; values beyond ±4σ pooled into two tail bins."""
    edge = int(4 * sigma2**0.5)
    support = np.arange(-edge, edge + 1)
    pmf = dgauss_pmf(sigma2, support)
    tail = (1 - pmf.sum()) / 2
    observed = np.concatenate([[np.sum(samples < -edge)], [np.sum(samples == y) for y in support], [np.sum(samples > edge)]])
    expected = np.concatenate([[tail], pmf, [tail]]) * len(samples)
    keep = expected > 5
    pooled_obs = np.append(observed[keep], observed[~keep].sum())
    pooled_exp = np.append(expected[keep], expected[~keep].sum())
    if pooled_exp[-1] == 0:
        pooled_obs, pooled_exp = pooled_obs[:-1], pooled_exp[:-1]
    return stats.chisquare(pooled_obs, pooled_exp * pooled_obs.sum() / pooled_exp.sum()).pvalue


def draw(sigma2, n, key=b"\x07" * 32):
    rng = ChaChaRandom(key)
    return np.array([discrete_gaussian(Fraction(sigma2), rng) for _ in range(n)])


@pytest.mark.parametrize("sigma2", [Fraction(1, 2), 4, 9])
def test_sampler_fits_the_exact_pmf(sigma2):
    assert chi2_pvalue(draw(sigma2, 20000), float(sigma2)) > ALPHA


def test_same_check_rejects_a_sampler_with_the_wrong_variance():
    wrong = draw(Fraction(9 * 144, 100), 20000)  # sigma 20% too large
    assert chi2_pvalue(wrong, 9.0) < ALPHA


def test_large_sigma_has_the_declared_spread():
    xs = draw(2560**2, 3000)
    assert abs(xs.std() / 2560 - 1) < 0.05 and abs(xs.mean()) < 5 * 2560 / 3000**0.5


def test_bernoulli_exp_probability():
    rng = ChaChaRandom(b"\x01" * 32)
    hits = sum(bernoulli_exp(Fraction(3, 2), rng) for _ in range(20000))
    assert stats.binomtest(hits, 20000, exp(-1.5)).pvalue > ALPHA


def test_discrete_laplace_is_symmetric_with_the_right_scale():
    rng = ChaChaRandom(b"\x02" * 32)
    xs = np.array([discrete_laplace(Fraction(2), rng) for _ in range(20000)])
    # P[Y=0] = (1 - e^{-1/2}) / (1 + e^{-1/2}) for scale 2
    p0 = (1 - exp(-0.5)) / (1 + exp(-0.5))
    assert stats.binomtest(int(np.sum(xs == 0)), len(xs), p0).pvalue > ALPHA
    assert stats.binomtest(int(np.sum(xs > 0)), int(np.sum(xs != 0)), 0.5).pvalue > ALPHA


def test_fresh_generators_are_keyed_independently_and_explicit_keys_repeat():
    a, b = ChaChaRandom.fresh(), ChaChaRandom.fresh()
    first = [a.randbelow(1 << 30) for _ in range(4)]
    assert first != [b.randbelow(1 << 30) for _ in range(4)]
    c, d = ChaChaRandom(b"s" * 32), ChaChaRandom(b"s" * 32)
    assert [c.randbelow(1 << 30) for _ in range(4)] == [d.randbelow(1 << 30) for _ in range(4)]
