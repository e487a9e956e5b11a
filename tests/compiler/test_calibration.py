"""Activation ranges and bias correction on hand-made distributions whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.compiler.calibration import ChannelMean, Observer, bias_shift, entropy_range, mse_range, u8_params


def test_u8_params_cover_the_range_and_keep_zero_exact():
    assert u8_params(0.0, 2.55) == (pytest.approx(0.01), 0)
    scale, zp = u8_params(-1.0, 3.0)
    assert scale == pytest.approx(4 / 255) and zp == 64  # rint(1 / (4/255)) = rint(63.75)
    assert u8_params(0.5, 2.0)[1] == 0  # widened to include 0


def test_mse_clips_an_outlier_that_minmax_keeps():
    """200,000 values uniform on [0, 1] and one at 1.3. Covering [0, a] costs each value
    (a/255)^2 / 12 of rounding and the outlier (1.3 - a)^2 once clipped: the sum is least at
    a = 1.3 / (1 + n / (12 * 255^2)) = 1.035."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(0, 1, 200_000), [1.3]]).astype(np.float32)
    obs = Observer(keep=x.size)
    obs.add(x)
    assert obs.bounds("minmax")[1] == pytest.approx(1.3)
    lo, hi = obs.bounds("mse")
    assert lo == 0.0 and hi == pytest.approx(1.3 / (1 + 200_000 / (12 * 255 ** 2)), abs=0.015)


def test_mse_range_of_a_gaussian_is_the_analytic_optimum():
    """For N(0, 1) on a symmetric 255-step grid over [-a, a] the squared error is
    (2a/255)^2 / 12 inside plus 2 ((1 + a^2) Q(a) - a phi(a)) for the clipped tails, least at a = 3.92
    (Banner et al.'s ACIQ gives the same for 8 bits); the sample's extremes are beyond 4.2."""
    a = np.linspace(3, 5, 2001)
    q = 0.5 * np.array([math.erfc(v / math.sqrt(2)) for v in a])
    phi = np.exp(-a ** 2 / 2) / math.sqrt(2 * math.pi)
    best = a[((2 * a / 255) ** 2 / 12 * (1 - 2 * q) + 2 * ((1 + a ** 2) * q - a * phi)).argmin()]
    assert best == pytest.approx(3.92, abs=0.01)
    x = np.random.default_rng(1).standard_normal(200_000).astype(np.float32)
    lo, hi = mse_range(x, float(x.min()), float(x.max()))
    assert min(-x.min(), x.max()) > 4.1
    assert (hi - lo) / 2 == pytest.approx(best, rel=0.03)


def test_entropy_ignores_the_spike_of_relu_zeros():
    """Half exact zeros, half uniform on [0, 1]: the uniform part needs no clipping, so the window is
    the whole range; counted as they are, the zeros alone would pick the narrowest window (1/8)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([np.zeros(100_000), rng.uniform(0, 1, 100_000)]).astype(np.float32)
    lo, hi = entropy_range(x, 0.0, float(x.max()))
    assert lo == 0.0 and hi == pytest.approx(1.0, abs=0.01)


def test_entropy_and_mse_clip_a_laplace_tail_that_minmax_keeps():
    x = np.random.default_rng(4).laplace(0, 1, 200_000).astype(np.float32)
    obs = Observer(keep=x.size)
    obs.add(x)
    lo, hi = obs.bounds("minmax")
    for method in ("mse", "entropy", "percentile"):
        clo, chi = obs.bounds(method)
        assert 0.5 * hi < chi < 0.95 * hi and 0.5 * lo > clo > 0.95 * lo, (method, clo, chi)


def test_observer_refuses_an_unknown_method():
    obs = Observer()
    obs.add(np.arange(4.0))
    with pytest.raises(ValueError, match="calibration method"):
        obs.bounds("kl")


def test_bias_shift_of_a_matrix_and_a_grouped_conv():
    w = np.array([[0.5, 0.25], [1.0, -1.0]])
    wq = np.array([[0.5, 0.26], [0.98, -1.0]])  # errors 0.01 on input 1 of output 0, -0.02 on input 0 of output 1
    assert bias_shift(w, wq, np.array([2.0, 3.0]), out_axis=0) == pytest.approx([0.03, -0.04])
    assert bias_shift(w.T, wq.T, np.array([2.0, 3.0]), out_axis=1) == pytest.approx([0.03, -0.04])
    conv = np.zeros((2, 1, 3, 3))  # two groups of one channel: output o reads input channel o
    err = conv.copy()
    err[0, 0, 1, 1], err[1, 0] = 0.1, 0.02  # one tap of output 0; all nine of output 1
    assert bias_shift(conv, conv + err, np.array([1.0, 10.0]), out_axis=0, group=2) == pytest.approx([0.1, 1.8])


def test_channel_mean_along_an_axis():
    m = ChannelMean(axis=1)
    m.add(np.stack([np.full((2, 2), 1.0), np.full((2, 2), 3.0)])[None])  # [1, 2, 2, 2]
    m.add(np.stack([np.full((2, 2), 3.0), np.full((2, 2), 5.0)])[None])
    assert m.mean == pytest.approx([2.0, 4.0])
