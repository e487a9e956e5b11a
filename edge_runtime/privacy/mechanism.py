"""The release mechanism: per-example contributions bounded by construction, discrete Gaussian noise.

Each report is a few integer sums ("families"): examples correct, clipped loss, example count, and
optionally a latency histogram. Every example changes every family by at most ``quantum`` (Q) in
L2 (the loss is clipped to ``loss_clip`` nats and quantised to [0, Q]; a histogram example moves
one bucket by Q), so the report's L2 sensitivity is exactly ``Q * sqrt(families)`` under add/remove
neighbours, and the example count itself is noised (n is private too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .dgauss import discrete_gaussian
from .rng import ChaChaRandom

BASE_FAMILIES = ("correct", "loss", "count")


@dataclass(frozen=True)
class PrivacyParams:
    """Defaults (``docs/privacy.md``): sigma 10 examples, B = 5 nats, Q = 256, 512 examples, (3, 1e-6)."""

    sigma: float = 10.0
    loss_clip: float = 5.0
    quantum: int = 256
    max_examples: int = 512
    epsilon: float = 3.0
    delta: float = 1e-6

    def noise_multiplier(self, families: int) -> float:
        """sigma in units of the L2 sensitivity: (sigma * Q) / (Q * sqrt(families))."""
        return self.sigma / math.sqrt(families)

    @property
    def noise_sigma2(self) -> int:
        """Variance of the integer noise, rounded up so the noise is never less than declared."""
        return math.ceil((self.sigma * self.quantum) ** 2)


DEFAULT_PARAMS = PrivacyParams()


@dataclass(frozen=True)
class NoisyReport:
    """What leaves the device: noised integer sums and how they were made (no raw metric)."""

    sums: Mapping[str, int]
    histogram: tuple[int, ...] = ()
    params: PrivacyParams = field(default_factory=PrivacyParams)
    families: int = 3


def encode_sums(correct: Sequence[bool], losses: Sequence[float], params: PrivacyParams,
                latency_bucket: Sequence[int] | None = None, buckets: int = 0) -> tuple[dict[str, int], tuple[int, ...]]:
    """The true integer sums, each example contributing at most Q to every family."""
    correct = np.asarray(correct, dtype=bool)
    losses = np.asarray(losses, dtype=np.float64)
    if correct.shape != losses.shape or correct.ndim != 1:
        raise ValueError("correct and losses must be 1-D and of equal length")
    if len(correct) > params.max_examples:
        raise ValueError(f"a report covers at most {params.max_examples} examples, got {len(correct)}")
    q = params.quantum
    clipped = np.clip(np.nan_to_num(losses, nan=params.loss_clip, posinf=params.loss_clip), 0.0, params.loss_clip)
    loss_units = np.minimum(np.floor(clipped / params.loss_clip * q), q).astype(np.int64)
    sums = {"correct": q * int(correct.sum()), "loss": int(loss_units.sum()), "count": q * len(correct)}
    hist: tuple[int, ...] = ()
    if latency_bucket is not None:
        idx = np.asarray(latency_bucket, dtype=np.int64)
        if idx.shape != correct.shape or (idx.size and (idx.min() < 0 or idx.max() >= buckets)):
            raise ValueError("latency buckets must be one index in [0, buckets) per example")
        hist = tuple(int(v) * q for v in np.bincount(idx, minlength=buckets))
    return sums, hist


def add_noise(sums: Mapping[str, int], hist: Sequence[int], params: PrivacyParams, rng: ChaChaRandom) -> NoisyReport:
    s2 = params.noise_sigma2
    noisy = {k: int(v) + discrete_gaussian(s2, rng) for k, v in sorted(sums.items())}
    noisy_hist = tuple(int(v) + discrete_gaussian(s2, rng) for v in hist)
    return NoisyReport(noisy, noisy_hist, params, len(BASE_FAMILIES) + (1 if hist else 0))


@dataclass(frozen=True)
class Estimate:
    value: float
    stderr: float
    clamped: bool = False  # the raw ratio fell outside the estimate's range (noise, or a hostile report)


def decode_reports(reports: Sequence[NoisyReport]) -> dict[str, Estimate]:
    """Accuracy and mean loss from summed noisy reports, with the noise's standard error (delta method).

    Two clamps bound what one report can do (``docs/privacy.md``, "One device's pull on an estimate"):
    a negative noisy count weighs 0, so no report takes weight from the others; and a ratio outside
    [0, 1] (of the loss clip, for the loss) is shown at the edge and flagged :attr:`Estimate.clamped`.
    Neither changes an estimate whose counts are positive and whose ratio lies in its range.
    """
    if not reports:
        return {}
    q = reports[0].params.quantum
    var = sum(r.params.noise_sigma2 for r in reports)
    tot = {k: sum(r.sums[k] for r in reports) for k in ("correct", "loss")}
    tot["count"] = sum(max(r.sums["count"], 0) for r in reports)
    count = max(tot["count"], q)
    out = {"examples": Estimate(tot["count"] / q, math.sqrt(var) / q)}
    clip = reports[0].params.loss_clip
    for key, family, scale in (("accuracy", "correct", 1.0), ("loss", "loss", clip)):  # each in [0, scale]
        raw = tot[family] / count
        ratio = min(max(raw, 0.0), 1.0)
        stderr = math.sqrt(var * (1 + ratio**2)) / count
        out[key] = Estimate(scale * ratio, scale * stderr, ratio != raw)
    return out
