"""The evaluation report: what a device sends after evaluating a bundle, and nothing more.

A device builds an :class:`EvalReport` from its private release (noisy integer sums, never a raw
accuracy or loss) and its measurements on synthetic inputs; it travels as a Flower ``MetricRecord``
(:meth:`EvalReport.as_metrics`), and the coordinator reads it back with :meth:`EvalReport.from_metrics`,
which refuses any record that is not exactly this shape. Whether the values are *plausible* is the
coordinator's check (``cuvil.coordinator.schema``); this module only fixes the shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..compiler.errors import CuvilError
from .latency import BUCKET_EDGES_MS, LatencyReport
from .privacy.mechanism import NoisyReport


class ReportError(CuvilError):
    """A report is not of the report's shape, or (coordinator side) not plausible."""


@dataclass(frozen=True)
class EvalReport:
    """One device's answer to one evaluation request (the fields are the wire keys)."""

    dp_correct: int  # noisy sum: examples correct x quantum + noise
    dp_loss: int  # noisy sum: clipped loss in units of loss_clip / quantum + noise
    dp_count: int  # noisy sum: examples x quantum + noise
    dp_sigma: float  # noise standard deviation, in examples
    dp_quantum: int
    dp_loss_clip: float
    dp_epsilon_spent: float  # on the device's dataset, after this release
    latency_hist: tuple[int, ...]  # counts per bucket of ``BUCKET_EDGES_MS`` (synthetic inputs)
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_emulated: bool  # emulated wall time, never device latency
    compile_ms: float
    cache_hit: bool
    arena_bytes: int
    bundle_was_cached: bool
    threads: int = 1  # threads one inference ran on: the latency is for this count

    @classmethod
    def build(cls, noisy: NoisyReport, epsilon_spent: float, latency: LatencyReport, *, emulated: bool,
              compile_ms: float, cache_hit: bool, arena_bytes: int, bundle_was_cached: bool,
              threads: int = 1) -> EvalReport:
        """The report of a private release plus the device's measurements."""
        p = noisy.params
        return cls(int(noisy.sums["correct"]), int(noisy.sums["loss"]), int(noisy.sums["count"]), float(p.sigma),
                   int(p.quantum), float(p.loss_clip), float(epsilon_spent), tuple(int(v) for v in latency.histogram),
                   float(latency.p50_ms), float(latency.p90_ms), float(latency.p99_ms), bool(emulated),
                   float(compile_ms), bool(cache_hit), int(arena_bytes), bool(bundle_was_cached), int(threads))

    def as_metrics(self) -> dict[str, int | float | list[int]]:
        """The ``MetricRecord`` values (flags as 0/1, the histogram as a list)."""
        return {f.name: _wire(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> EvalReport:
        """Read a received record: exactly the report's keys, each of its type, numbers finite."""
        missing = sorted(set(KEYS) - set(metrics))
        extra = sorted(set(metrics) - set(KEYS))
        if missing or extra:
            raise ReportError(f"report keys differ from the schema: missing {missing}, unexpected "
                              f"{[k[:40] for k in extra[:8]]}")
        return cls(**{f.name: _read(f.name, str(f.type), metrics[f.name]) for f in dataclasses.fields(cls)})


KEYS = tuple(f.name for f in dataclasses.fields(EvalReport))


def _wire(value: Any) -> int | float | list[int]:
    if isinstance(value, bool):
        return int(value)
    return list(value) if isinstance(value, tuple) else value


def _read(key: str, kind: str, value: Any) -> Any:
    if kind == "tuple[int, ...]":
        if (not isinstance(value, (list, tuple)) or len(value) != len(BUCKET_EDGES_MS)
                or not all(_is_int(v) for v in value)):
            raise ReportError(f"{key} must be {len(BUCKET_EDGES_MS)} integer counts")
        return tuple(int(v) for v in value)
    if kind == "bool":
        if not _is_int(value) or value not in (0, 1):
            raise ReportError(f"{key} must be 0 or 1")
        return bool(value)
    if kind == "int":
        if not _is_int(value):
            raise ReportError(f"{key} must be an integer")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(f"{key} must be a finite number")
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
