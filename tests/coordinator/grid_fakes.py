"""A fake Flower Grid under the coordinator's real GridTransport: real flwr Messages both ways, each node a
function from the request to its reply (None: no reply). A hostile device is such a function."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from cuvil.coordinator import messages

from .helpers import device_report

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # Flower builds Messages only in a task
Node = Callable[[Message], Message | None]
UPDATE_METRICS = {"dp_count": 100, "dp_count_sigma": 10.0, "dp_epsilon_spent": 0.5, "dp_delta": 1e-6,
                  "bundle_was_cached": 1}


class _NodeInfo:
    public_key = b""

    def __init__(self, node_id: int):
        self.node_id = node_id


class FakeGrid:
    """``push_messages`` hands each message to its node at once; ``pull_messages`` returns the replies."""

    def __init__(self, nodes: Mapping[int, Node]):
        self.nodes, self.out = dict(nodes), {}

    def get_node_ids(self):
        return list(self.nodes)

    def get_nodes(self):
        return [_NodeInfo(n) for n in self.nodes]

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            mid = uuid.uuid4().hex
            m.metadata.__dict__["_message_id"] = mid  # what the SuperLink assigns
            reply = self.nodes[m.metadata.dst_node_id](m)
            if reply is not None:
                self.out[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.out.pop(i) for i in ids if i in self.out]


def info(name: str, **fields) -> dict:
    """The device info an honest x86 device sends (``fields`` replace its values)."""
    return {"device_id": name, "profile": "x86", "arch": "x86_64", "cpu": "haswell", "features": "+avx2",
            "isa": "x86_64/256-bit", "threads": 4, "runtime_version": "t", "emulated": 0, "emulator": "",
            "held_bundles": [], "free_memory_bytes": 1 << 30, "can_train": 0, "train_reason": "", **fields}


def device(name: str, info_fields: Mapping | None = None, evaluate: Node | None = None,
           train: Node | None = None) -> Node:
    """A device answering the inventory with ``info(name, **info_fields)``, evaluate honestly unless
    ``evaluate`` is given, and train only with ``train``."""
    def answer(m: Message) -> Message | None:
        kind = m.metadata.message_type
        if kind == messages.DEVICE_INFO:
            return messages.info_reply(m, info(name, **(info_fields or {})))
        if kind == messages.TRAIN:
            return train(m) if train else None
        return evaluate(m) if evaluate else messages.metrics_reply(m, device_report(len(name), 0.9)[0])
    return answer


def trainer(name: str, weights: Mapping[str, np.ndarray], info_fields: Mapping | None = None, **metrics) -> Node:
    """A device that can train and answers with a small update of ``weights`` (``metrics`` replace the
    honest metrics, ``info_fields`` its info's)."""
    def train(m: Message) -> Message:
        update = {k: np.full(np.shape(v), 1e-4, np.float32) for k, v in weights.items()}
        return messages.update_reply(m, {**UPDATE_METRICS, **metrics}, update)
    return device(name, {"can_train": 1, **(info_fields or {})}, train=train)


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _claiming(shape) -> bytes:
    """A .npy header that claims ``shape`` of float32, and no data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue()


BAD_ARRAYS = {  # (dtype, shape, stype, data) of an Array that survives Flower's transport unchanged
    "empty-data": ("float32", (10,), "numpy.ndarray", b""),
    "torch-stype": ("float32", (10,), "torch.raw", npy(np.zeros(10, np.float32))),
    "not-npy": ("float32", (10,), "numpy.ndarray", b"\x00" * 200),
    "claims-1-TiB": ("float32", (1 << 38,), "numpy.ndarray", _claiming((1 << 38,))),
    "f64-bytes": ("float32", (10,), "numpy.ndarray", npy(np.zeros(10, np.float64))),
    "bytes-past-shape": ("float32", (10,), "numpy.ndarray", npy(np.zeros(10, np.float32)) + b"\x00" * 4),
}
