"""Activation ranges for post-training quantization: which [lo, hi] each tensor's u8 grid covers.

The values a tensor takes on the calibration inputs are observed (their extremes and a random
sample); a method then picks the range:

- ``minmax``: the observed extremes. Nothing clips, but one rare extreme value widens every step.
- ``percentile``: the ``percentile``-th of the values on each side; clips a fixed share.
- ``mse``: the range whose u8 grid (the very scale and zero point ``u8_params`` gives) reproduces
  the sample with the least squared error, searched over ranges ``[lo*t, hi*t]`` shrunk about zero
  (a ReLU output keeps ``lo = 0``): it trades the clipping error of the tail against the rounding
  error of every other value, as NVIDIA's ``pytorch-quantization`` ``mse`` calibrator does.
- ``entropy``: TensorRT's and ONNX Runtime's ``CalibrationMethod.Entropy`` (KL divergence), for the
  asymmetric u8 grid: a 2048-bin histogram over the observed range; each candidate window of it,
  shrunk about zero, with the outliers added to its end bins (``p``), is merged into 256 quantized
  bins and spread back over its non-empty bins (``q``); the window with the least ``KL(p || q)``
  wins. The bin holding zero counts as its neighbour, as in NVIDIA's ``pytorch-quantization``: a
  ReLU output's spike of exact zeros would otherwise pick the narrowest window. It keeps the histogram's shape rather than its squared error, so it clips more than ``mse``.
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("minmax", "percentile", "mse", "entropy")
SAMPLE = 200_000  # values kept per tensor for the sample-based methods
SHRINK_STEPS = 160  # candidate ranges [lo*t, hi*t], t from 1/8 to 1
HIST_BINS, LEVELS = 2048, 256  # entropy: histogram bins; u8 levels a window is merged into


def u8_params(lo: float, hi: float) -> tuple[float, int]:
    """Asymmetric u8 covering [lo, hi] (widened to include 0, as zero must be exact)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo < 1e-12:
        return 1.0, 0 if lo >= 0 else 255
    scale = float(np.float32((hi - lo) / 255.0))
    zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    return scale, zp


class Observer:
    """One tensor's values over the calibration inputs: the extremes and a random sample."""

    def __init__(self, keep: int = SAMPLE // 4) -> None:
        self.lo, self.hi = math.inf, -math.inf
        self.keep = keep  # values kept per observed batch
        self.parts: list[np.ndarray] = []
        self.rng = np.random.default_rng(0)

    def add(self, v: np.ndarray) -> None:
        flat = np.asarray(v, np.float32).reshape(-1)
        finite = flat[np.isfinite(flat)]
        if finite.size:
            self.lo, self.hi = min(self.lo, float(finite.min())), max(self.hi, float(finite.max()))
            self.parts.append(finite if finite.size <= self.keep else self.rng.choice(finite, self.keep, replace=False))

    @property
    def sample(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)

    def bounds(self, method: str, percentile: float = 99.99) -> tuple[float, float]:
        if method not in METHODS:
            raise ValueError(f"calibration method must be one of {', '.join(METHODS)}, got {method!r}")
        if method == "minmax" or not self.parts or not self.hi > self.lo:
            return self.lo, self.hi
        s = self.sample
        if method == "percentile":
            return float(np.percentile(s, 100 - percentile)), float(np.percentile(s, percentile))
        return (mse_range if method == "mse" else entropy_range)(s, self.lo, self.hi)


def _shrinks() -> np.ndarray:
    return np.linspace(1.0, 1.0 / 8, SHRINK_STEPS)


def fake_quantize(x: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """``x`` through u8 QuantizeLinear / DequantizeLinear (round half to even, saturation)."""
    q = np.clip(np.rint(x / np.float32(scale)) + zp, 0, 255)
    return ((q - zp) * np.float32(scale)).astype(np.float32)


def mse_range(sample: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The range ``[lo*t, hi*t]`` whose u8 grid reproduces ``sample`` with the least squared error."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    x = np.asarray(sample, np.float32)
    best, best_err = (lo, hi), math.inf
    for t in _shrinks():
        err = float(np.square(fake_quantize(x, *u8_params(lo * t, hi * t)) - x, dtype=np.float64).sum())
        if err < best_err:
            best, best_err = (lo * t, hi * t), err
    return best


def _kl(p: np.ndarray, q: np.ndarray, eps: float = 1e-4) -> float:
    """KL(p || q) after ONNX Runtime's smoothing (empty bins get ``eps``, taken from the others)."""
    def smooth(d):
        zeros = d == 0
        if zeros.all():
            return None
        d = d.astype(np.float64) + eps * zeros - eps * zeros.sum() / (~zeros).sum() * ~zeros
        return d / d.sum()
    ps, qs = smooth(p), smooth(q)
    if ps is None or qs is None or (qs <= 0).any() or (ps <= 0).any():
        return math.inf
    return float((ps * np.log(ps / qs)).sum())


def entropy_range(sample: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The window of the histogram of ``sample`` over [lo, hi] whose 256-level form has the least
    KL divergence from it (outliers clipped into its end bins)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    hist, _ = np.histogram(np.asarray(sample, np.float64), HIST_BINS, range=(lo, hi))
    zero = int(round(-lo / (hi - lo) * HIST_BINS))  # the bin edge at 0
    at = min(zero, HIST_BINS - 1)  # the bin of exact zeros (a ReLU's): its spike would decide alone,
    hist[at] = hist[at + 1 if at + 1 < HIST_BINS else at - 1]  # so it counts as its neighbour (NVIDIA's too)
    best, best_kl = (lo, hi), math.inf
    for t in _shrinks():
        start, end = zero - int(round(zero * t)), zero + int(round((HIST_BINS - zero) * t))
        if end - start < LEVELS:
            continue
        window = hist[start:end]
        p = window.astype(np.float64)
        p[0] += hist[:start].sum()
        p[-1] += hist[end:].sum()
        starts = np.array([g[0] for g in np.array_split(np.arange(window.size), LEVELS)])
        sums = np.add.reduceat(window, starts)
        counts = np.add.reduceat(window != 0, starts)
        sizes = np.diff(np.append(starts, window.size))
        spread = np.repeat(np.where(counts > 0, sums / np.maximum(counts, 1), 0.0), sizes)
        q = np.where(window != 0, spread, 0.0)
        kl = _kl(p, q)
        if kl < best_kl:
            edges = lo + (hi - lo) * np.array([start, end]) / HIST_BINS
            best, best_kl = (float(edges[0]), float(edges[1])), kl
    return best


class ChannelMean:
    """The mean of each channel (``axis``) of a tensor over the calibration inputs."""

    def __init__(self, axis: int) -> None:
        self.axis, self.total, self.count = axis, None, 0

    def add(self, v: np.ndarray) -> None:
        v = np.moveaxis(np.asarray(v, np.float64), self.axis, -1)
        s = v.reshape(-1, v.shape[-1]).sum(axis=0)
        self.total = s if self.total is None else self.total + s
        self.count += v.size // v.shape[-1]

    @property
    def mean(self) -> np.ndarray:
        return self.total / max(self.count, 1)


def bias_shift(w: np.ndarray, w_int8_value: np.ndarray, x_mean: np.ndarray, out_axis: int, group: int = 1) -> np.ndarray:
    """Per output channel, the mean error the int8 weights add to the layer's output:
    ``sum (w_int8_value - w) * E[x]`` over each output's inputs (Nagel et al., "Data-free quantization
    through weight equalization and bias correction", 2019). ``w`` is a conv's ``[O, C/group, kh, kw]``
    (``out_axis`` 0) or a matrix ``[N, K]`` / ``[K, N]`` (``out_axis`` 0 / 1); ``x_mean`` the input's
    per-channel mean (a conv's padding is taken as the mean too: exact away from the border)."""
    err = np.moveaxis(w_int8_value.astype(np.float64) - w.astype(np.float64), out_axis, 0)
    per_input = err.reshape(err.shape[0], err.shape[1], -1).sum(axis=2)  # [O, C/group]
    groups = np.asarray(x_mean, np.float64).reshape(group, -1)  # [group, C/group]
    return (per_input * np.repeat(groups, err.shape[0] // group, axis=0)).sum(axis=1)
