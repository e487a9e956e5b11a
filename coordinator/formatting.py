"""How results read: durations with units that fit, timestamps, estimates with their error, reasons.

One place for these rules, so ``cuvil results``, the HTML report and the dashboard say the same
thing the same way (a 1.2 µs latency is ``1.20 µs`` everywhere, never ``0.001 ms``).
"""

from __future__ import annotations

import math
import re
import time

from ..edge_runtime.latency import BUCKET_EDGES_MS

# (upper bound in ms, unit, ms per unit): the first whose bound exceeds the value is used
_DURATION_UNITS = ((1e-3, "ns", 1e-6), (1.0, "µs", 1e-3), (1e3, "ms", 1.0), (math.inf, "s", 1e3))


def missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def duration_unit(ms: float) -> tuple[str, float]:
    """(unit, ms per unit) that shows ``ms`` with one to three digits before the point."""
    for bound, unit, scale in _DURATION_UNITS:
        if abs(ms) < bound:
            return unit, scale
    return "s", 1e3


def duration_ms(ms: float | None) -> str:
    """``0.0012`` -> ``1.20 µs``; ``250`` -> ``250 ms``: three significant digits."""
    if missing(ms):
        return "-"
    unit, scale = duration_unit(ms)
    v = ms / scale
    return f"{v:.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f} {unit}"


def histogram_ms(ms: float | None) -> str:
    """A percentile read from the latency histogram (a bucket's upper edge): at the first edge it is
    ``≤ 1.00 µs``, since the first bucket holds every faster run too (the histogram's floor)."""
    if not missing(ms) and ms <= BUCKET_EDGES_MS[0]:
        return f"≤ {duration_ms(BUCKET_EDGES_MS[0])}"
    return duration_ms(ms)


def seconds(s: float | None) -> str:
    """A wall-clock span: ``0.4 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if missing(s):
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def timestamp(t: float | None) -> str:
    """Local time to the second (the machine's own clock, as the coordinator recorded it)."""
    if missing(t):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def iso_utc(t: float | None) -> str | None:
    if missing(t):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def estimate(value: float | None, se: float | None = None, digits: int = 3) -> str:
    """A private estimate and its standard error, as the aggregate gives them (within the range)."""
    if missing(value):
        return "-"
    text = f"{value:.{digits}f}"
    return text if missing(se) else f"{text} ± {se:.{digits}f}"


def number(value: float | None, digits: int = 2) -> str:
    return "-" if missing(value) else f"{value:.{digits}f}"


def byte_count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


_PREFIX = re.compile(r"^([A-Z][A-Z0-9_]+): (?=\1: )")


def reason(text: str) -> str:
    """A failure reason with a repeated code prefix said once (``X: X: why`` -> ``X: why``)."""
    text = str(text)
    while True:
        shorter = _PREFIX.sub("", text, count=1)
        if shorter == text:
            return text
        text = shorter


# feature flag -> vector ISA name, most capable first
_ISA_BY_FEATURE = (("+sve2", "SVE2"), ("+sve", "SVE"), ("+avx512f", "AVX-512"), ("+avx2", "AVX2"),
                   ("+neon", "NEON"), ("+sse4.2", "SSE4.2"))


def vector_isa(features: str) -> str:
    """The widest vector ISA a device's feature list enables (``-`` when it names none)."""
    have = {f.strip() for f in str(features).split(",")}
    return next((name for flag, name in _ISA_BY_FEATURE if flag in have), "-")
