"""Aggregation of one round's reports: overall and per device class.

Accuracy and loss are decoded from noisy sums with their standard errors, each within its range
(``clamped`` names those whose raw ratio fell outside and was shown at the edge). Latency percentiles come
from merged histograms of natively measured devices only: emulated latency is never device latency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..edge_runtime.latency import percentile_from_histogram
from ..edge_runtime.privacy.mechanism import NoisyReport, PrivacyParams, decode_reports

OVERALL = "all"


@dataclass(frozen=True)
class ClassAggregate:
    device_class: str
    devices: int
    accuracy: float | None = None
    accuracy_se: float | None = None
    loss: float | None = None
    loss_se: float | None = None
    examples: float | None = None
    latency_p50_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_devices: int = 0
    emulated_devices: int = 0
    compile_ms_median: float | None = None
    cache_hits: int = 0
    arena_bytes_max: int | None = None
    epsilon_spent_max: float | None = None
    failures: Mapping[str, int] = field(default_factory=dict)
    clamped: tuple[str, ...] = ()  # "accuracy", "loss": estimates whose raw ratio fell outside their range


def _noisy(m: Mapping[str, Any]) -> NoisyReport:
    params = PrivacyParams(sigma=m["dp_sigma"], quantum=m["dp_quantum"], loss_clip=m["dp_loss_clip"])
    return NoisyReport({"correct": m["dp_correct"], "loss": m["dp_loss"], "count": m["dp_count"]}, (), params)


def aggregate_class(name: str, reports: Sequence[Mapping[str, Any]], failures: Sequence[Mapping[str, Any]]) -> ClassAggregate:
    kinds: dict[str, int] = {}
    for f in failures:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    if not reports:
        return ClassAggregate(name, 0, failures=kinds)
    metrics = [r["metrics"] for r in reports]
    est = decode_reports([_noisy(m) for m in metrics])
    native = [m for m in metrics if not m["latency_emulated"]]
    merged = [sum(col) for col in zip(*(m["latency_hist"] for m in native))] if native else []
    pct = {q: percentile_from_histogram(merged, q) if merged else None for q in (50, 90, 99)}
    return ClassAggregate(
        device_class=name,
        devices=len(reports),
        accuracy=est["accuracy"].value, accuracy_se=est["accuracy"].stderr,
        loss=est["loss"].value, loss_se=est["loss"].stderr,
        examples=est["examples"].value,
        latency_p50_ms=pct[50], latency_p90_ms=pct[90], latency_p99_ms=pct[99],
        latency_devices=len(native), emulated_devices=len(metrics) - len(native),
        compile_ms_median=statistics.median(m["compile_ms"] for m in metrics),
        cache_hits=sum(m["cache_hit"] for m in metrics),
        arena_bytes_max=max(m["arena_bytes"] for m in metrics),
        epsilon_spent_max=max(m["dp_epsilon_spent"] for m in metrics),
        failures=kinds,
        clamped=tuple(k for k in ("accuracy", "loss") if est[k].clamped),
    )


def aggregate_round(reports: Sequence[Mapping[str, Any]], failures: Sequence[Mapping[str, Any]],
                    device_class: Mapping[str, str] | None = None) -> dict[str, ClassAggregate]:
    """Per class (keyed by profile) plus ``"all"``. ``device_class`` maps device ids of failures to classes."""
    device_class = dict(device_class or {})
    classes = sorted({r["profile"] for r in reports} | {device_class.get(f["device_id"], "unknown") for f in failures})
    out = {c: aggregate_class(c, [r for r in reports if r["profile"] == c],
                              [f for f in failures if device_class.get(f["device_id"], "unknown") == c]) for c in classes}
    out[OVERALL] = aggregate_class(OVERALL, reports, failures)
    return out


def compare(reports_a: Sequence[Mapping[str, Any]], reports_b: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Paired A/B per class (and overall): accuracy of each on the devices that reported both, and B - A."""
    b_by = {r["device_id"]: r for r in reports_b}
    pairs = [(r, b_by[r["device_id"]]) for r in reports_a if r["device_id"] in b_by]
    out = {}
    for cls in sorted({p[0]["profile"] for p in pairs}) + [OVERALL]:
        sel = [p for p in pairs if cls == OVERALL or p[0]["profile"] == cls]
        aa = aggregate_round([p[0] for p in sel], []).get(OVERALL)
        ab = aggregate_round([p[1] for p in sel], []).get(OVERALL)
        if not sel or aa is None or ab is None or aa.accuracy is None or ab.accuracy is None:
            continue
        out[cls] = {"devices": len(sel), "a": aa.accuracy, "b": ab.accuracy, "diff": ab.accuracy - aa.accuracy,
                    "se": math.hypot(aa.accuracy_se or 0.0, ab.accuracy_se or 0.0)}
    return out
