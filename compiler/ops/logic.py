"""Elementwise logic and bit ops: And/Or/Xor/Not on bools, Bitwise* and BitShift on integers,
GreaterOrEqual/LessOrEqual, IsNaN/IsInf (see docs/ir.md).

Each is elementwise (its element code is shared by every backend through ``codegen/scalar_ops``) and
imports from ONNX as it is (``same_as_onnx``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import binary, unary
from .registry import AttrKind, AttrSpec, OpDef, register, require

ONNX = {"same_as_onnx": True}


def _only(d: OpDef, ok, what: str) -> OpDef:
    """``d`` restricted to operands whose dtype passes ``ok`` (ONNX's type constraint)."""

    def infer(ts, a):
        require(all(ok(t.dtype) for t in ts), f"{d.name}: operands must be {what}, got {sorted({t.dtype.value for t in ts})}")
        return d.shape_rule(ts, a)

    return dataclasses.replace(d, shape_rule=infer)


def _is_bool(dt: DType) -> bool:
    return dt is DType.BOOL


def _is_int(dt: DType) -> bool:
    return not dt.is_float and dt is not DType.BOOL


def _shift(x: np.ndarray, y: np.ndarray, a) -> np.ndarray:
    """Shifts by a negative count or by the operand width or more fill with the sign (right) or 0
    (left); a left shift of a signed value shifts its bits (NumPy's own shifts are undefined there)."""
    bits = x.dtype.itemsize * 8
    x, y = np.broadcast_arrays(x, y)
    out = (y < 0) | (y >= bits)
    count = np.where(out, 0, y)
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    if a["direction"] == "LEFT":
        return np.where(out, 0, np.left_shift(x.view(unsigned), count.astype(unsigned)).view(x.dtype)).astype(x.dtype)
    fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
    return np.where(out, fill, np.right_shift(x, count.astype(x.dtype))).astype(x.dtype)


def _bitshift_infer(ts, a):
    require(a["direction"] in ("LEFT", "RIGHT"), f"BitShift: direction must be LEFT or RIGHT, got {a['direction']!r}")
    return _BITSHIFT_SHAPE(ts, a)


def _bitshift_ref(xs, a):
    return [np.broadcast_to(_shift(xs[0], xs[1], a), np.broadcast_shapes(xs[0].shape, xs[1].shape)).copy()]


def _is_inf(x: np.ndarray, a) -> np.ndarray:
    return (np.isposinf(x) & bool(a["detect_positive"])) | (np.isneginf(x) & bool(a["detect_negative"]))


def _predicate(name: str, fn, attrs=None) -> OpDef:
    """A float -> bool elementwise test."""

    def infer(ts, a):
        return [TensorType(DType.BOOL, ts[0].shape)]

    return OpDef(name, infer, lambda xs, a: [np.asarray(fn(xs[0], a), dtype=bool)], attrs=attrs or {},
                 elementwise=True, float_only=True, **ONNX)


_BITSHIFT_SHAPE = binary("BitShift", np.left_shift).shape_rule

register(
    *(_only(binary(name, fn, **ONNX), _is_bool, "bool") for name, fn in
      (("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor))),
    _only(unary("Not", lambda x, a: np.logical_not(x), floats=False, **ONNX), _is_bool, "bool"),
    *(_only(binary(name, fn, **ONNX), _is_int, "integers") for name, fn in
      (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor))),
    _only(unary("BitwiseNot", lambda x, a: np.invert(x), floats=False, **ONNX), _is_int, "integers"),
    _only(OpDef("BitShift", _bitshift_infer, _bitshift_ref, attrs={"direction": AttrSpec(AttrKind.STRING)},
                min_inputs=2, max_inputs=2, elementwise=True, **ONNX), _is_int, "integers"),
    binary("GreaterOrEqual", np.greater_equal, result=DType.BOOL, **ONNX),
    binary("LessOrEqual", np.less_equal, result=DType.BOOL, **ONNX),
    _predicate("IsNaN", lambda x, a: np.isnan(x)),
    _predicate("IsInf", _is_inf, attrs={"detect_negative": AttrSpec(AttrKind.INT, 1),
                                        "detect_positive": AttrSpec(AttrKind.INT, 1)}),
)
