"""The coordinator's check of a device's report: the shape, then whether an honest device could send it.

A device is not trusted to be honest. Before a report is stored or aggregated it must be an
:class:`~cuvil.edge_runtime.report.EvalReport` whose values lie inside the envelope of an honest
answer to the request the coordinator sent (:class:`ReportBounds`):

- the privacy constants (quantum, loss clip) are the protocol's, so every report decodes alike;
- the declared noise is exactly what was asked (an honest device uses the asked σ or refuses), or,
  when the run asks for each device's own floor (0), at most :data:`MAX_FLOOR_SIGMA` examples;
- each noisy sum lies within ``[0, max_examples]`` examples widened by :data:`MARGIN_SD` standard
  deviations of the declared noise, and ``correct`` and ``loss`` exceed ``count`` by no more than
  the noise of a difference allows (an honest device has correct <= count, loss <= count);
- the latency histogram counts at most the timed runs asked, percentiles are ordered and bounded.

This is the per-device cap of the aggregate (``docs/privacy.md``, "One device's pull on an
estimate"): with the decoder's clamps (:func:`~cuvil.edge_runtime.privacy.mechanism.decode_reports`)
one report moves a class estimate by at most :func:`device_weight` over the class's example count.
An honest device falls outside the envelope with probability about 1e-9 per sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..compiler.codegen.cpu.threads import MAX_THREADS
from ..edge_runtime.privacy.mechanism import DEFAULT_PARAMS
from ..edge_runtime.report import KEYS, EvalReport, ReportError

MARGIN_SD = 6.0  # noise standard deviations an honest sum may stray past its true range
MAX_SIGMA = 100.0  # declared noise (examples) beyond which a report tells nothing: refused
# A run that asks for each device's own floor (dp-sigma 0) accepts floors up to this (twice the default
# floor): the noise margin, and with it a hostile report's weight, stays near an honest one's. A fleet
# provisioned with higher floors asks for its σ explicitly.
MAX_FLOOR_SIGMA = 2 * DEFAULT_PARAMS.sigma
MAX_MS = 86_400_000.0  # a day: no latency or compile time is longer
MAX_ARENA_BYTES = 1 << 48
REPORT_KEYS = KEYS


@dataclass(frozen=True)
class ReportBounds:
    """What the coordinator asked (runs, noise) and the protocol constants every report must carry."""

    latency_runs: int = 50
    sigma: float = 0.0  # noise asked, in examples (0: the device's own floor)
    quantum: int = DEFAULT_PARAMS.quantum
    loss_clip: float = DEFAULT_PARAMS.loss_clip
    max_examples: int = DEFAULT_PARAMS.max_examples


def check_report(metrics: Mapping[str, Any], bounds: ReportBounds = ReportBounds()) -> EvalReport:
    """Parse and check a received report; raise :class:`ReportError` naming the first implausible value."""
    r = EvalReport.from_metrics(metrics)
    _privacy(r, bounds)
    _measurements(r, bounds)
    return r


def device_weight(sigma: float, max_examples: int = DEFAULT_PARAMS.max_examples) -> float:
    """Examples' worth one report can push a ratio by: the most it can add to a sum (``max_examples``
    plus the noise margin) plus the most it can take away (the margin below 0)."""
    return max_examples + 2 * MARGIN_SD * sigma


def sigma_range(asked: float) -> tuple[float, float]:
    """The noise (examples) a report may declare: exactly the σ asked, or up to :data:`MAX_FLOOR_SIGMA`
    when 0 asked for the device's own floor; never more than :data:`MAX_SIGMA`."""
    lo, hi = (asked, asked) if asked > 0 else (0.0, MAX_FLOOR_SIGMA)
    return lo, min(hi, MAX_SIGMA)


def _privacy(r: EvalReport, b: ReportBounds) -> None:
    if r.dp_quantum != b.quantum or r.dp_loss_clip != b.loss_clip:
        raise ReportError(f"privacy constants (quantum {r.dp_quantum}, loss clip {r.dp_loss_clip:g}) are not the "
                          f"protocol's ({b.quantum}, {b.loss_clip:g})")
    lo, hi = sigma_range(b.sigma)
    if not (lo <= r.dp_sigma <= hi and r.dp_sigma > 0):
        raise ReportError(f"declared noise {r.dp_sigma:g} is outside [{lo:g}, {hi:g}] examples "
                          f"({b.sigma:g} asked)")
    if r.dp_epsilon_spent < 0:
        raise ReportError("epsilon spent is negative")
    q, margin = b.quantum, MARGIN_SD * r.dp_sigma
    lo, hi = -margin, b.max_examples + margin
    sums = {"count": r.dp_count / q, "correct": r.dp_correct / q, "loss": r.dp_loss / q}
    for name, value in sums.items():
        if not lo <= value <= hi:
            raise ReportError(f"noisy {name} {value:.1f} examples is outside [{lo:.0f}, {hi:.0f}]")
    for name in ("correct", "loss"):
        if sums[name] - sums["count"] > margin * math.sqrt(2):
            raise ReportError(f"noisy {name} exceeds the noisy count by more than the noise allows")


def _measurements(r: EvalReport, b: ReportBounds) -> None:
    runs = sum(r.latency_hist)
    if min(r.latency_hist) < 0 or not 1 <= runs <= max(b.latency_runs, 1):
        raise ReportError(f"latency histogram holds {runs} runs; 1 to {b.latency_runs} were asked")
    if not 0 <= r.latency_p50_ms <= r.latency_p90_ms <= r.latency_p99_ms <= MAX_MS:
        raise ReportError("latency percentiles are not ordered non-negative times")
    if not 0 <= r.compile_ms <= MAX_MS:
        raise ReportError("compile time is out of range")
    if not 0 <= r.arena_bytes <= MAX_ARENA_BYTES:
        raise ReportError("arena bytes are out of range")
    if not 1 <= r.threads <= MAX_THREADS:
        raise ReportError("thread count is out of range")
