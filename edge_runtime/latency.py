"""Latency measurement: warm-up, timed runs, percentiles, and a fixed log-bucket histogram.

Every device reports the same bucket edges, so the coordinator can merge histograms per device
class and read fleet percentiles from them (a fixed metric schema for every device).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..compiler.errors import CuvilError

MAX_RUNS = 100_000
MAX_WARMUP = 100_000
MAX_BUDGET_S = 600.0

# 64 log-spaced buckets from 1 µs to 10 s (upper edges, ms); the last bucket also takes anything slower.
BUCKET_EDGES_MS: tuple[float, ...] = tuple(float(x) for x in np.logspace(-3, 4, 64))


class MeasureError(CuvilError):
    """Latency measurement asked with counts or a time budget outside their bounds."""


@dataclass(frozen=True)
class LatencyReport:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    runs: int
    warmup: int
    histogram: tuple[int, ...]


def histogram(samples_ms: Sequence[float]) -> tuple[int, ...]:
    idx = np.searchsorted(BUCKET_EDGES_MS, np.asarray(samples_ms, dtype=np.float64), side="left")
    return tuple(int(c) for c in np.bincount(np.minimum(idx, len(BUCKET_EDGES_MS) - 1), minlength=len(BUCKET_EDGES_MS)))


def percentile_from_histogram(hist: Sequence[int], q: float) -> float:
    """The upper edge of the bucket holding the q-th percentile (an upper bound, within one bucket)."""
    total = sum(hist)
    if total == 0:
        return math.nan
    rank = q / 100 * total
    running = 0
    for edge, count in zip(BUCKET_EDGES_MS, hist):
        running += count
        if running >= rank and count:
            return edge
    return BUCKET_EDGES_MS[-1]


def check_request(warmup: int, runs: int, budget_s: float) -> None:
    """Refuse counts and budgets a measurement cannot honour: none, negative, unbounded or not numbers."""
    for name, value, lo, hi in (("warmup", warmup, 0, MAX_WARMUP), ("runs", runs, 1, MAX_RUNS)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
            raise MeasureError(f"latency {name} must be an integer in [{lo}, {hi}], got {value!r}"[:200])
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s <= MAX_BUDGET_S:
        raise MeasureError(f"latency budget must be a number of seconds in (0, {MAX_BUDGET_S:g}], got {budget_s!r}"[:200])


def measure(run: Callable[[], object], warmup: int = 10, runs: int = 100, budget_s: float = 5.0) -> LatencyReport:
    """Time ``run`` after ``warmup`` calls; stops early (at least 5 runs, or ``runs`` if fewer) when
    ``budget_s`` is spent. Warm-up stops at the same budget, so a measurement is bounded in time."""
    check_request(warmup, runs, budget_s)
    warm_deadline = time.perf_counter() + budget_s
    done = 0
    while done < warmup and (done < 1 or time.perf_counter() < warm_deadline):
        run()
        done += 1
    warmup = done
    samples = []
    deadline = time.perf_counter() + budget_s
    for i in range(runs):
        t0 = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        if i >= 4 and time.perf_counter() > deadline:
            break
    arr = np.asarray(samples)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return LatencyReport(float(p50), float(p90), float(p99), float(arr.mean()), len(samples), warmup, histogram(arr))
