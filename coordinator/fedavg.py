"""A training round's updates averaged by Flower's FedAvg, and the signed version that results.

The averaging is Flower's message-API ``FedAvg.aggregate_train`` over the devices' replies (each an
``ArrayRecord`` of the clipped update and a ``MetricRecord`` with its noisy example count), weighted
by those noisy counts: no hand-written averaging. The new weights are the round's weights plus the
average update; :func:`mint_version` signs them, with their lineage, under the coordinator's key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.bundle import Lineage, bundle_bytes, load_private_key
from ..compiler.errors import CuvilError
from ..compiler.ir.graph import Graph
from .rounds import BundleRef

class FineTuningError(CuvilError):
    """A training round cannot become a new version (no usable update, a key that cannot sign, ...)."""


WEIGHT_KEY = "dp-count"  # the MetricRecord key FedAvg weights by: the device's noisy example count


def fedavg(number: int, updates: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Flower's FedAvg over ``updates`` (``arrays``, ``dp_count``, ``node_id``); a noisy count below 1 weighs 1."""
    from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg

    if not updates:
        raise FineTuningError(f"training round {number} has no update to average")
    replies = [Message(RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v, np.float32))
                                                          for k, v in u["arrays"].items()}),
                                   "metrics": MetricRecord({WEIGHT_KEY: max(1, int(u["dp_count"]))})}),
                       dst_node_id=int(u.get("node_id", 0)), message_type=MessageType.TRAIN) for u in updates]
    arrays, _ = FedAvg(weighted_by_key=WEIGHT_KEY).aggregate_train(number, replies)
    if arrays is None:
        raise FineTuningError(f"training round {number}: FedAvg returned nothing")
    return {k: arrays[k].numpy() for k in arrays.keys()}


def apply_update(graph: Graph, average: Mapping[str, np.ndarray]) -> Graph:
    """``graph`` with each updated weight moved by the average update (shapes and dtype unchanged)."""
    consts = dict(graph.constants)
    for name, delta in average.items():
        if name not in consts or consts[name].shape != np.shape(delta) or consts[name].dtype != np.float32:
            raise FineTuningError(f"the average update names weight {name!r}, which the model does not hold as f32 "
                               f"of that shape")
        consts[name] = (consts[name] + np.asarray(delta, np.float32)).astype(np.float32)
    return graph.replace(constants=consts)


def next_version(version: str) -> str:
    """'1' -> '2', 'v1.9' -> 'v1.10', '2024-05' -> '2024-06'; no trailing number: '.1' appended."""
    m = re.fullmatch(r"(.*?)(\d+)", version)
    return f"{m.group(1)}{int(m.group(2)) + 1:0{len(m.group(2))}d}" if m else f"{version}.1"


def mint_version(graph: Graph, name: str, version: str, lineage: Lineage, key_path: str | Path) -> BundleRef:
    """Sign ``graph`` as ``name@version`` with its lineage under the coordinator's key."""
    data = bundle_bytes(graph, load_private_key(Path(key_path).expanduser()), name=name, version=version,
                        producer="cuvil coordinator (federated fine-tuning)", lineage=lineage)
    return BundleRef.from_bytes(data)
