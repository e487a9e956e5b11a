"""RecordDict encoding of the coordinator's messages, and the typed error codes devices answer with.

- ``query.device_info``: empty request; reply ``ConfigRecord "info"``.
- ``evaluate``: ``ConfigRecord "config"`` (round config) and, only for devices that do not hold it,
  ``ArrayRecord "bundle"`` with the bundle as one uint8 array (ArrayRecords are chunked and
  content-addressed; ConfigRecord bytes are not), or instead ``ArrayRecord "delta"``: a signed delta
  from a version the device holds (:mod:`cuvil.compiler.bundle.delta`). Reply: ``MetricRecord "metrics"`` in the fixed
  report schema, or an error with one of :class:`Code`.
- ``train``: as ``evaluate`` (the bundle is the weights to start from) with the round's DP-SGD
  parameters in the config. Reply: ``ArrayRecord "update"`` (the clipped update) and ``MetricRecord
  "metrics"`` (``dp_count``, ``dp_count_sigma``, ``dp_epsilon_spent``).
- ``query.activate``: as ``evaluate`` (the bundle to make active) with ``action`` (``activate`` or
  ``revert``), ``model`` and ``base-hash`` in the config. Reply: ``ConfigRecord "info"`` with the
  ``active`` and ``previous`` content hashes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode, SType

from ..compiler.bundle.format import MAX_ELEMENTS, MAX_RANK
from ..compiler.errors import BundleError, DeltaError
from ..compiler.npy_header import read_header
from .device_text import excerpt

DEVICE_INFO = "query.device_info"
EVALUATE = "evaluate"
TRAIN = "train"
ACTIVATE = "query.activate"


class Code:
    """Error codes of typed device replies (Flower's own codes are below 100)."""

    BUDGET_EXHAUSTED = 4001
    PARAMS_REJECTED = 4002
    LEDGER_UNAVAILABLE = 4003
    SIGNATURE_REJECTED = 4010
    BUNDLE_MISSING = 4011
    DEVICE_ERROR = 4020
    DELTA_PARENT_MISSING = 4012  # the device lacks the version a delta applies to: send the full bundle
    DELTA_REJECTED = 4013  # a delta did not verify, was for another parent or version, or was replayed
    CANNOT_TRAIN = 4021

    NAMES = {4001: "DP_BUDGET_EXHAUSTED", 4002: "DP_PARAMS_REJECTED", 4003: "DP_LEDGER_UNAVAILABLE",
             4010: "SIGNATURE_REJECTED", 4011: "BUNDLE_MISSING", 4012: "DELTA_PARENT_MISSING",
             4013: "DELTA_REJECTED", 4020: "DEVICE_ERROR", 4021: "CANNOT_TRAIN"}
    DELTA_FALLBACK = (4012, 4013)  # codes after which the coordinator sends the full bundle instead


FAILURE_KIND = {  # error code -> the store's failure kind; any other code is a "failure"
    Code.BUDGET_EXHAUSTED: "budget_exhausted",
    **dict.fromkeys((Code.PARAMS_REJECTED, Code.LEDGER_UNAVAILABLE, Code.SIGNATURE_REJECTED, Code.CANNOT_TRAIN,
                     Code.DELTA_REJECTED), "refused"),
    # Flower's own answer for a message (or its reply) that expired unanswered: the device was too slow
    **dict.fromkeys((ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE), "timeout"),
}


def classify(code: int) -> str:
    """The store's failure kind for an error code."""
    return FAILURE_KIND.get(code, "failure")


# requests -----------------------------------------------------------------------------------------
def device_info_request() -> RecordDict:
    return RecordDict({"config": ConfigRecord({})})


def evaluate_request(config: Mapping[str, Any], bundle: bytes | None, delta: bytes | None = None) -> RecordDict:
    content = RecordDict({"config": ConfigRecord(dict(config))})
    for key, data in (("bundle", bundle), ("delta", delta)):
        if data is not None:
            content[key] = ArrayRecord({key: Array(np.frombuffer(data, dtype=np.uint8))})
    return content


def train_request(config: Mapping[str, Any], bundle: bytes | None, delta: bytes | None = None) -> RecordDict:
    return evaluate_request(config, bundle, delta)


def request_config(msg: Message) -> dict[str, Any]:
    return dict(msg.content.config_records.get("config", ConfigRecord({})))


PAYLOAD_DTYPE = np.dtype("u1")  # a pushed bundle or delta travels as its bytes: one 1-D uint8 array
PAYLOAD_ERRORS = {"bundle": BundleError, "delta": DeltaError}  # what a malformed one raises: its typed refusal
UPDATE_DTYPE = np.dtype("<f4")  # a training reply's arrays are float32 (the model's weights moved)
MAX_UPDATE_BYTES = 1 << 30  # a training reply's arrays in all, at most: far above the small models devices fine-tune


def checked_npy(what: str, a: Array, dtype: np.dtype, max_rank: int, max_dim: int,
                error: type[Exception]) -> tuple[bytes, int, tuple[int, ...], bool]:
    """A Flower Array from the other side, checked before anything is decoded or allocated: its
    serialization, dtype and declared shape (rank and each dimension bounded), and its bytes exactly a
    .npy of that dtype and shape. (bytes, offset of the data in them, shape, Fortran order), or ``error``
    naming ``what`` and quoting only bounded excerpts of what the array says of itself."""
    shape = a.shape
    if a.stype != SType.NUMPY or a.dtype != dtype.name:
        raise error(f"{what} is not a .npy of {dtype.name} (stype {excerpt(a.stype)}, dtype {excerpt(a.dtype)})")
    if not isinstance(shape, tuple | list) or len(shape) > max_rank or \
            not all(type(d) is int and 0 <= d <= max_dim for d in shape):
        raise error(f"{what} has no valid shape of rank at most {max_rank} ({excerpt(shape)})")
    raw = bytes(a.data)
    stream = io.BytesIO(raw)
    try:
        npy_shape, fortran, got = read_header(stream, len(raw), what)
    except ValueError as e:
        raise error(str(e)) from None
    if got != dtype or npy_shape != tuple(shape):
        raise error(f"{what}'s bytes are not a .npy of its declared {dtype.name} shape {list(shape)[:8]}")
    return raw, stream.tell(), tuple(shape), fortran


def request_bundle(msg: Message, key: str = "bundle", *, max_bytes: int) -> bytes | None:
    """The pushed bundle (``key="delta"``: the pushed delta), or None.

    The Array is the coordinator's input: its serialization, dtype, 1-D shape of at most ``max_bytes``
    (the device's own limit) and .npy bytes of exactly that shape are checked before a byte is decoded
    or allocated. Anything else raises :data:`PAYLOAD_ERRORS` ``[key]``, which the device answers with
    the code of a bundle (or delta) that does not verify, never with the exception's text."""
    rec = msg.content.array_records.get(key)
    if rec is None or key not in rec:
        return None
    raw, start, _, _ = checked_npy(f"the {key}", rec[key], PAYLOAD_DTYPE, 1, max_bytes, PAYLOAD_ERRORS[key])
    return raw[start:]


# replies ------------------------------------------------------------------------------------------
def info_reply(msg: Message, info: Mapping[str, Any]) -> Message:
    return Message(RecordDict({"info": ConfigRecord(dict(info))}), reply_to=msg)


def metrics_reply(msg: Message, metrics: Mapping[str, Any]) -> Message:
    return Message(RecordDict({"metrics": MetricRecord(dict(metrics))}), reply_to=msg)


def update_reply(msg: Message, metrics: Mapping[str, Any], update: Mapping[str, np.ndarray]) -> Message:
    return Message(RecordDict({"metrics": MetricRecord(dict(metrics)),
                               "update": ArrayRecord({k: Array(np.asarray(v)) for k, v in update.items()})}),
                   reply_to=msg)


def error_reply(msg: Message, code: int, reason: str) -> Message:
    """An error reply whose reason starts with the code's name, once (a refusal's text may carry it)."""
    name = str(Code.NAMES.get(code, code))
    text = reason if reason.startswith(f"{name}: ") else f"{name}: {reason}"
    return Message(Error(code=code, reason=text[:2000]), reply_to=msg)


def reply_payload(reply: Message) -> dict[str, Any]:
    """The info or metrics a successful reply carries, as plain Python values."""
    c = reply.content
    if "metrics" in c.metric_records:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in c.metric_records["metrics"].items()}
    if "info" in c.config_records:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in c.config_records["info"].items()}
    return {}


def reply_arrays(reply: Message) -> dict[str, np.ndarray]:
    """The update a training reply carries (empty if it carries none). A device's arrays are input: each
    is checked (serialization, dtype, shape, its bytes exactly a .npy of that shape) before anything is
    decoded or allocated; ValueError names the first that is not, quoting only a bounded excerpt."""
    rec = reply.content.array_records.get("update")
    if rec is None:
        return {}
    arrays = {k: rec[k] for k in rec.keys()}
    if sum(len(a.data) for a in arrays.values()) > MAX_UPDATE_BYTES:
        raise ValueError(f"the update's arrays are larger than {MAX_UPDATE_BYTES} bytes")
    return {k: _update_array(f"update array {excerpt(k)}", a) for k, a in arrays.items()}


def _update_array(what: str, a: Array) -> np.ndarray:
    """One Array of an update as a float32 ndarray, read from its .npy bytes only once they are checked."""
    raw, start, shape, fortran = checked_npy(what, a, UPDATE_DTYPE, MAX_RANK, MAX_ELEMENTS, ValueError)
    flat = np.frombuffer(raw, UPDATE_DTYPE, math.prod(shape), start)
    return np.ascontiguousarray(flat.reshape(shape, order="F" if fortran else "C"))
