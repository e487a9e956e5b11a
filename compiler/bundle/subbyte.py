"""Sub-byte weights (int4, uint4, float4, int2, uint2) in a bundle: packed as ONNX packs them.

In memory each element has a byte of its own (as ml_dtypes holds them); in a bundle they are packed,
the first element in the lowest bits of the first byte, the unused high bits of the last byte zero.
An int4 model's weights are then half the bytes of int8 ones, the point of int4.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DType


def packed_nbytes(dtype: DType, count: int) -> int:
    """Bytes of ``count`` elements in a bundle."""
    return (count * dtype.bits + 7) // 8


def pack(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """The elements' bits packed into a flat uint8 array."""
    per, bits = 8 // dtype.bits, dtype.bits
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8) & np.uint8((1 << bits) - 1)
    raw = np.concatenate([raw, np.zeros(-raw.size % per, np.uint8)]).reshape(-1, per)
    return np.bitwise_or.reduce(raw << (np.arange(per, dtype=np.uint8) * bits), axis=1).astype(np.uint8)


def unpack(packed: np.ndarray, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    """A new array of ``dtype`` and ``shape`` from packed bytes (its length already checked)."""
    per, bits = 8 // dtype.bits, dtype.bits
    parts = (packed[:, None] >> (np.arange(per, dtype=np.uint8) * bits)) & np.uint8((1 << bits) - 1)
    return parts.reshape(-1)[:math.prod(shape)].astype(np.uint8).view(dtype.numpy).reshape(shape)
