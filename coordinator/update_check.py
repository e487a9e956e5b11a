"""What a training reply must be before the coordinator stores it: the fixed keys, and an update that
fits the model it was computed from (every array a float32 weight of that name and shape, finite, its
total L2 norm within the round's update clip). A device is hostile until its reply checks out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..compiler.ir.graph import Graph
from .device_train import config_key

UPDATE_CLIP_KEY = config_key("update_clip")  # the request config key of the round's update clip
UPDATE_KEYS: dict[str, type] = {"dp_count": int, "dp_count_sigma": float, "dp_epsilon_spent": float,
                                "dp_delta": float, "bundle_was_cached": int}


def check_update(metrics: Mapping[str, Any], arrays: Mapping[str, Any], graph: Graph,
                 bound: float) -> dict[str, Any]:
    """The reply's metrics, typed; ValueError naming what is wrong (nothing private is in the message)."""
    if set(metrics) != set(UPDATE_KEYS):
        raise ValueError(f"update keys differ from the schema: got {sorted(metrics)[:8]}")
    out = {k: kind(metrics[k]) for k, kind in UPDATE_KEYS.items()}
    if not all(math.isfinite(v) for v in out.values()) or out["dp_epsilon_spent"] < 0:
        raise ValueError("update metrics must be finite (and ε not negative)")
    if not arrays:
        raise ValueError("the reply carries no update")
    total = 0.0
    for name, value in arrays.items():
        ref = graph.constants.get(name)
        arr = np.asarray(value)
        if ref is None or ref.dtype != np.float32 or arr.dtype != np.float32 or arr.shape != ref.shape:
            raise ValueError(f"update array {str(name)[:64]!r} is not a float32 weight of the model of that shape")
        total += float(np.sum(np.square(arr, dtype=np.float64)))
    if not math.isfinite(total) or math.sqrt(total) > bound * (1 + 1e-5):
        raise ValueError(f"the update is not finite or longer than the round's clip {bound:g}")
    return out
