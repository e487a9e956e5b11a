"""What a training reply must be before the coordinator stores it: the fixed keys, an update that fits
the model it was computed from (exactly the weights the round trains, :func:`trained_weights`, each a
float32 array of that weight's shape, finite, their total L2 norm within the round's update clip), a
noisy count an honest device could have sent, and privacy it could have spent: ε within the budget the
round asked (:data:`MAX_EPSILON` where it asked for the device's own), δ at most the protocol's
:data:`MAX_DELTA`. A device is hostile until its reply checks out; a reply that passes can be averaged
with the others and recorded in a version's lineage.

The count is FedAvg's weight, so it is the lever of a device that wants to outweigh the rest: it must
lie within ``[0, max_examples]`` (the round's cap on the examples a device trains on) widened by
:data:`~.schema.MARGIN_SD` standard deviations of the noise the device declares, and that noise is its
own floor (a device adds its floor's noise to the count), so it must lie where an evaluation report's
may when the run asks for each device's floor (:func:`~.schema.sigma_range` of 0: at most
:data:`~.schema.MAX_FLOOR_SIGMA`; up to 100 let one device claim 1,112 examples' weight, now 632). An
honest device falls outside with probability about 1e-9.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compiler.ir.graph import Graph
from ..edge_runtime.privacy.mechanism import DEFAULT_PARAMS
from ..edge_runtime.privacy.request import MAX_EPSILON
from ..edge_runtime.training import DpSgdConfig
from ..edge_runtime.training.layers import trained_weights
from .device_text import excerpt
from .device_train import config_key
from .schema import MARGIN_SD, sigma_range

UPDATE_KEYS: dict[str, type] = {"dp_count": int, "dp_count_sigma": float, "dp_epsilon_spent": float,
                                "dp_delta": float, "bundle_was_cached": int}
MAX_DELTA = DEFAULT_PARAMS.delta  # the protocol's δ (docs/privacy.md): no device is provisioned looser


@dataclass(frozen=True)
class UpdateBounds:
    """What the round asked: the update clip, the cap on the examples a device trains on, the layers it
    trains and the privacy budget (ε: a device refuses a charge past it)."""

    clip: float = DpSgdConfig.update_clip
    max_examples: int = DpSgdConfig.max_examples
    train_layers: int = DpSgdConfig.train_layers
    epsilon: float = MAX_EPSILON

    @classmethod
    def of_request(cls, config: Mapping[str, Any]) -> UpdateBounds:
        """The bounds of a train request's config (its ``dp-sgd-*`` keys and ``dp-epsilon``, 0 asking for
        the device's own budget; defaults where absent)."""
        return cls(float(config.get(config_key("update_clip"), cls.clip)),
                   int(config.get(config_key("max_examples"), cls.max_examples)),
                   int(config.get(config_key("train_layers"), cls.train_layers)),
                   min(float(config.get("dp-epsilon", 0.0)) or MAX_EPSILON, MAX_EPSILON))


def check_update(metrics: Mapping[str, Any], arrays: Mapping[str, Any], graph: Graph,
                 bounds: UpdateBounds) -> dict[str, Any]:
    """The reply's metrics, typed; ValueError naming what is wrong (nothing private is in the message)."""
    if set(metrics) != set(UPDATE_KEYS):
        raise ValueError(f"update keys differ from the schema: got {sorted(metrics)[:8]}")
    try:
        out = {k: kind(metrics[k]) for k, kind in UPDATE_KEYS.items()}
    except (TypeError, ValueError, OverflowError):
        raise ValueError("update metrics must be finite numbers") from None
    if not all(math.isfinite(v) for v in out.values() if isinstance(v, float)):  # ints are finite (and may pass 1e308)
        raise ValueError("update metrics must be finite")
    if not 0 <= out["dp_epsilon_spent"] <= bounds.epsilon:
        raise ValueError(f"ε spent {out['dp_epsilon_spent']:g} is outside [0, {bounds.epsilon:g}], "
                         f"the round's budget")
    if not 0 < out["dp_delta"] <= MAX_DELTA or out["bundle_was_cached"] not in (0, 1):
        raise ValueError(f"δ must be in (0, {MAX_DELTA:g}] and bundle_was_cached 0 or 1")
    sigma, (lo, hi) = out["dp_count_sigma"], sigma_range(0.0)  # the device's own floor
    if not (lo < sigma <= hi):
        raise ValueError(f"declared count noise {sigma:g} is outside ({lo:g}, {hi:g}]")
    margin = MARGIN_SD * sigma
    if not -margin <= out["dp_count"] <= bounds.max_examples + margin:
        raise ValueError(f"noisy count {out['dp_count']} is outside [{-margin:.0f}, {bounds.max_examples + margin:.0f}]")
    check_arrays(arrays, graph, bounds)
    return out


def check_arrays(arrays: Mapping[str, Any], graph: Graph, bounds: UpdateBounds) -> None:
    """ValueError unless ``arrays`` are exactly the round's trained f32 weights, in their shapes, within the
    clip: what Flower's FedAvg and the next version need of every update it averages."""
    if not arrays:
        raise ValueError("the reply carries no update")
    trained = trained_weights(graph, bounds.train_layers)
    if set(arrays) != trained:
        raise ValueError(f"the update does not name the round's {len(trained)} trained weights: "
                         f"{len(trained - set(arrays))} missing, {len(set(arrays) - trained)} not trained")
    total = 0.0
    for name, value in arrays.items():
        ref = graph.constants.get(name)
        arr = np.asarray(value)
        if ref is None or ref.dtype != np.float32 or arr.dtype != np.float32 or arr.shape != ref.shape:
            raise ValueError(f"update array {excerpt(name)} is not a float32 weight of the model of that shape")
        total += float(np.sum(np.square(arr, dtype=np.float64)))
    if not math.isfinite(total) or math.sqrt(total) > bounds.clip * (1 + 1e-5):
        raise ValueError(f"the update is not finite or longer than the round's clip {bounds.clip:g}")
