"""Instance and group normalization as Cuvil ops, shared by the ONNX and PyTorch frontends, which
define them alike: LayerNormalization with scale 1 over each sample's channel plane (instance) or
group of channels (group), then a per-channel scale and bias.

A frontend passes ``emit(op, inputs, suffix, **attrs)`` for intermediate values, ``final`` (same, no
suffix) for the value the source node produces, and ``const(array, suffix)`` for constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..ir.dtypes import DType

Emit = Callable[..., str]
Const = Callable[[np.ndarray, str], str]


def normalize(emit: Emit, const: Const, x: str, axis: int, dtype: DType, eps: float) -> str:
    """(x - mean) / sqrt(var + eps) over the axes from ``axis`` on (biased variance)."""
    one = const(np.ones(1, dtype.numpy), "unit")
    return emit("LayerNormalization", [x, one], "normalized", axis=axis, epsilon=eps)


def channel_affine(emit: Emit, final: Emit, y: str, scale: str | None, bias: str | None, rank: int,
                   channels: int) -> str:
    """y * scale + bias with both laid along axis 1; a missing one (torch's affine=False) is skipped."""
    shape = [channels] + [1] * (rank - 2)
    steps = [(op, v, name) for op, v, name in (("Mul", scale, "scale"), ("Add", bias, "bias")) if v is not None]
    if not steps:
        return y
    for i, (op, v, name) in enumerate(steps):
        operand = emit("Reshape", [v], name, shape=shape)
        y = final(op, [y, operand]) if i == len(steps) - 1 else emit(op, [y, operand], "scaled")
    return y


def instance_norm(emit: Emit, final: Emit, const: Const, x: str, scale: str | None, bias: str | None,
                  shape: Sequence[int], dtype: DType, eps: float) -> str:
    """``shape``: x's (N, C, *spatial), N possibly unknown."""
    y = normalize(emit, const, x, 2, dtype, eps)
    return channel_affine(emit, final, y, scale, bias, len(shape), shape[1])


def grouped_normalize(emit: Emit, const: Const, x: str, batch: int, groups: int, shape: Sequence[int],
                      dtype: DType, eps: float) -> str:
    """x (``batch`` (-1: unknown), *``shape``) normalized per group, laid out (batch, groups, rest)."""
    grouped = emit("Reshape", [x], "grouped", shape=[batch, groups, math.prod(shape) // groups])
    return normalize(emit, const, grouped, 2, dtype, eps)


def group_norm(emit: Emit, final: Emit, const: Const, x: str, scale: str | None, bias: str | None,
               batch: int, groups: int, shape: Sequence[int], dtype: DType, eps: float) -> str:
    """Per-channel scale and bias (ONNX GroupNormalization 21, torch's group_norm); ``shape``: (C, *spatial)."""
    y = grouped_normalize(emit, const, x, batch, groups, shape, dtype, eps)
    y = emit("Reshape", [y], "ungrouped", shape=[batch, *shape])
    return channel_affine(emit, final, y, scale, bias, len(shape) + 1, shape[0])
