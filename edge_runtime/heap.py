"""Freed heap pages given back to the system (glibc's ``malloc_trim``), where a cold compile frees much.

Why: glibc keeps the pages of freed small allocations (a bundle's weights read segment by segment,
the tuner's candidates, kernel texts) for the process to reuse, and a cold compile's next large
needs come from mappings of their own (the packed weights' block, the session's arena), which
reuse none of them: each added its size to the peak on top of what was freed. Given back as the
lowering frees each weight and before the arena is made, LSTM KWS's cold peak went 66 -> 61.5 MiB
and ASPP's 75.5 -> 70 (2026-12-05, 2 threads, docs/performance-log.md). Each call takes 0.03-0.5 ms.
"""

from __future__ import annotations

import ctypes

_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only; elsewhere a no-op


def release() -> None:
    """Give every whole free page of the C heap back to the system; the process's data is untouched."""
    if _TRIM is not None:
        _TRIM(0)
