"""EvalReport: what a device builds is what the coordinator reads back, and nothing of another shape."""

from __future__ import annotations

import math

import pytest

from cuvil.edge_runtime.latency import BUCKET_EDGES_MS, LatencyReport
from cuvil.edge_runtime.privacy.mechanism import NoisyReport, PrivacyParams
from cuvil.edge_runtime.report import KEYS, EvalReport, ReportError


def _report() -> EvalReport:
    hist = tuple([0] * 10 + [7, 3] + [0] * (len(BUCKET_EDGES_MS) - 12))
    noisy = NoisyReport({"correct": 1000, "loss": 300, "count": 2560}, (), PrivacyParams(sigma=12.0))
    return EvalReport.build(noisy, 0.5, LatencyReport(0.002, 0.003, 0.003, 0.0025, 10, 2, hist), emulated=False,
                            compile_ms=40.0, cache_hit=True, arena_bytes=4096, bundle_was_cached=False)


def test_build_carries_the_release_and_the_measurements():
    r = _report()
    assert (r.dp_correct, r.dp_loss, r.dp_count, r.dp_sigma, r.dp_quantum) == (1000, 300, 2560, 12.0, 256)
    assert (r.latency_p50_ms, r.cache_hit, r.bundle_was_cached, sum(r.latency_hist)) == (0.002, True, False, 10)


def test_metrics_round_trip_with_flags_as_integers():
    r = _report()
    m = r.as_metrics()
    assert list(m) == list(KEYS) and m["cache_hit"] == 1 and m["bundle_was_cached"] == 0
    assert isinstance(m["latency_hist"], list)
    assert EvalReport.from_metrics(m) == r


@pytest.mark.parametrize("key, value, word", [
    ("dp_correct", 1.5, "integer"), ("dp_correct", True, "integer"), ("dp_count", "12", "integer"),
    ("dp_sigma", math.nan, "finite"), ("latency_p50_ms", math.inf, "finite"), ("compile_ms", "fast", "finite"),
    ("cache_hit", 2, "0 or 1"), ("latency_hist", [1, 2], "counts"), ("latency_hist", "abc", "counts"),
    ("latency_hist", [0.5] * len(BUCKET_EDGES_MS), "counts"),
])
def test_a_value_of_another_type_is_refused(key, value, word):
    with pytest.raises(ReportError, match=word):
        EvalReport.from_metrics({**_report().as_metrics(), key: value})


def test_missing_and_extra_keys_are_refused():
    m = _report().as_metrics()
    with pytest.raises(ReportError, match="missing"):
        EvalReport.from_metrics({k: v for k, v in m.items() if k != "arena_bytes"})
    with pytest.raises(ReportError, match="unexpected"):
        EvalReport.from_metrics({**m, "accuracy": 0.99})
