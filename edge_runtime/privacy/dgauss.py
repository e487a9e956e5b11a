"""Exact discrete Gaussian sampling (Canonne, Kamath, Steinke 2020, Algorithms 1-3).

All arithmetic is on integers and Fractions, so no floating-point rounding can leak through the
noise's low bits (Mironov 2012). The random source is a :class:`ChaChaRandom`.
"""

from __future__ import annotations

from fractions import Fraction
from math import isqrt

from .rng import ChaChaRandom


def bernoulli(p: Fraction, rng: ChaChaRandom) -> bool:
    return rng.randbelow(p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: ChaChaRandom) -> bool:
    """True with probability exp(-gamma), gamma >= 0."""
    while gamma > 1:
        if not bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def geometric_exp(x: Fraction, rng: ChaChaRandom) -> int:
    """Geometric: number of failures before success, success probability 1 - exp(-x)."""
    if x.numerator == 0:
        raise ValueError("x must be positive")
    s, t = x.numerator, x.denominator
    while True:
        u = rng.randbelow(t)
        if bernoulli_exp(Fraction(u, t), rng):
            break
    v = 0
    while bernoulli_exp(Fraction(1), rng):
        v += 1
    return (v * t + u) // s


def discrete_laplace(scale: Fraction, rng: ChaChaRandom) -> int:
    """P[Y = y] proportional to exp(-|y| / scale)."""
    while True:
        negative = bernoulli(Fraction(1, 2), rng)
        magnitude = geometric_exp(1 / scale, rng)
        if negative and magnitude == 0:
            continue
        return -magnitude if negative else magnitude


def discrete_gaussian(sigma2: Fraction | int, rng: ChaChaRandom) -> int:
    """P[Y = y] proportional to exp(-y^2 / (2 sigma^2)), for sigma^2 > 0 given exactly."""
    sigma2 = Fraction(sigma2)
    if sigma2 <= 0:
        raise ValueError("sigma^2 must be positive")
    t = isqrt(sigma2.numerator // sigma2.denominator) + 1
    while True:
        y = discrete_laplace(Fraction(t), rng)
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp(gamma, rng):
            return y
