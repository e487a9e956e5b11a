import math
import time

import numpy as np

import pytest

from cuvil.edge_runtime.latency import (
    BUCKET_EDGES_MS, MAX_BUDGET_S, MAX_RUNS, MAX_WARMUP, MeasureError, histogram, measure, percentile_from_histogram,
)


def test_histogram_places_samples_in_the_bucket_whose_upper_edge_bounds_them():
    samples = [0.0005, 0.5, 2.0, 2.0, 50_000.0]
    hist = histogram(samples)
    assert sum(hist) == 5 and hist[0] == 1 and hist[-1] == 1
    i = next(k for k, e in enumerate(BUCKET_EDGES_MS) if e >= 2.0)
    assert hist[i] == 2 and BUCKET_EDGES_MS[i - 1] < 2.0


def test_percentile_from_histogram_is_within_one_bucket_of_the_exact_value():
    rng = np.random.default_rng(0)
    samples = rng.lognormal(mean=0.0, sigma=0.5, size=5000)
    ratio = BUCKET_EDGES_MS[1] / BUCKET_EDGES_MS[0]
    for q in (50, 90, 99):
        exact = np.percentile(samples, q)
        est = percentile_from_histogram(histogram(samples), q)
        assert exact <= est <= exact * ratio * 1.0001
    assert math.isnan(percentile_from_histogram([0] * 64, 50))


def test_measure_times_a_known_sleep():
    report = measure(lambda: time.sleep(0.002), warmup=1, runs=20)
    assert report.runs == 20 and 1.9 <= report.p50_ms <= 20 and report.p50_ms <= report.p90_ms <= report.p99_ms
    assert sum(report.histogram) == 20


def test_measure_refuses_counts_and_budgets_it_cannot_honour():
    calls = []
    for bad in ({"runs": 0}, {"runs": -1}, {"runs": MAX_RUNS + 1}, {"runs": 2.5}, {"runs": True}, {"warmup": -1},
                {"warmup": MAX_WARMUP + 1}, {"warmup": "5"}, {"budget_s": 0}, {"budget_s": float("nan")},
                {"budget_s": float("inf")}, {"budget_s": MAX_BUDGET_S * 2}):
        with pytest.raises(MeasureError):
            measure(lambda: calls.append(1), **bad)
    assert not calls  # refused before running anything


def test_warmup_stops_at_the_budget():
    calls = []
    t0 = time.perf_counter()
    report = measure(lambda: (calls.append(1), time.sleep(0.001)), warmup=MAX_WARMUP, runs=3, budget_s=0.05)
    assert time.perf_counter() - t0 < 5 and report.warmup < MAX_WARMUP and report.runs == 3
    assert len(calls) == report.warmup + 3
