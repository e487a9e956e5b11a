"""The fixed metric schema every device sends, whatever its class (Flower aborts on mismatched keys).

Accuracy and loss never leave a device in the clear: only the noisy integer sums of the privacy
mechanism (``dp_*``). Latency measured on synthetic inputs carries no private information.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..edge_runtime.latency import BUCKET_EDGES_MS

REPORT_KEYS: dict[str, type] = {
    "dp_correct": int,
    "dp_loss": int,
    "dp_count": int,
    "dp_sigma": float,
    "dp_quantum": int,
    "dp_loss_clip": float,
    "dp_epsilon_spent": float,
    "latency_hist": list,
    "latency_p50_ms": float,
    "latency_p90_ms": float,
    "latency_p99_ms": float,
    "latency_emulated": int,
    "compile_ms": float,
    "cache_hit": int,
    "arena_bytes": int,
    "bundle_was_cached": int,
}


def check_report(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a device's metrics against the schema; raise ValueError naming what is wrong."""
    missing = sorted(set(REPORT_KEYS) - set(metrics))
    extra = sorted(set(metrics) - set(REPORT_KEYS))
    if missing or extra:
        raise ValueError(f"report keys differ from the schema: missing {missing}, unexpected {extra}")
    out: dict[str, Any] = {}
    for key, kind in REPORT_KEYS.items():
        value = metrics[key]
        if kind is list:
            if len(value) != len(BUCKET_EDGES_MS) or any(int(v) != v or v < 0 for v in value):
                raise ValueError(f"{key} must be {len(BUCKET_EDGES_MS)} non-negative counts")
            out[key] = [int(v) for v in value]
        else:
            out[key] = kind(value)
    return out
