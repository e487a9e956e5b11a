"""Elementwise ops: activations, arithmetic with broadcasting, comparisons, Where, Cast."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..ir.dtypes import E8M0_ROUNDING, SATURABLE, DType
from ..ir.types import TensorType
from .common import binary, broadcast_shapes, same_dtype, unary
from .registry import AttrKind, AttrSpec, OpDef, no_flops, register, require

F = AttrKind.FLOAT


def _numeric(d: OpDef) -> OpDef:
    """Arithmetic rejects bool operands, as ONNX does (NumPy would crash or silently use logic ops)."""

    def infer(ts, a):
        require(all(t.dtype is not DType.BOOL for t in ts), f"{d.name}: bool operands are not supported")
        return d.shape_rule(ts, a)

    return dataclasses.replace(d, shape_rule=infer)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 (math.erf per element; vectorised by frompyfunc), cast back by the caller."""
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)), dtype=np.float64)  # 0-d gives a scalar


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return np.where(x64 >= 0, 1 / (1 + np.exp(-np.abs(x64))), np.exp(-np.abs(x64)) / (1 + np.exp(-np.abs(x64))))


def _gelu(x: np.ndarray, a) -> np.ndarray:
    x64 = x.astype(np.float64)
    if a["approximate"] == "tanh":
        return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    return 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2)))


def _gelu_infer(ts, a):
    require(a["approximate"] in ("none", "tanh"), f"Gelu: approximate must be 'none' or 'tanh', got {a['approximate']!r}")
    return [ts[0]]


def _hard_sigmoid(x, a):
    return np.clip(a["alpha"] * x.astype(np.float64) + a["beta"], 0, 1)


ONNX = {"same_as_onnx": True}

register(
    _numeric(unary("Relu", lambda x, a: np.maximum(x, 0), floats=False, **ONNX)),
    unary("Clip", lambda x, a: np.clip(x, a["min"], a["max"]),
          attrs={"min": AttrSpec(F, -math.inf), "max": AttrSpec(F, math.inf)}, doc="Relu6 is Clip(0, 6)"),
    unary("LeakyRelu", lambda x, a: np.where(x >= 0, x, x.astype(np.float64) * a["alpha"]), attrs={"alpha": AttrSpec(F, 0.01)},
          **ONNX),
    unary("Sigmoid", lambda x, a: _sigmoid(x), **ONNX),
    unary("Tanh", lambda x, a: np.tanh(x), **ONNX),
    OpDef("Gelu", _gelu_infer, lambda xs, a: [np.asarray(_gelu(xs[0], a), dtype=xs[0].dtype)],
          attrs={"approximate": AttrSpec(AttrKind.STRING, "none")}, elementwise=True, fusable=True, float_only=True, **ONNX),
    unary("SiLU", lambda x, a: x.astype(np.float64) * _sigmoid(x)),
    unary("HardSigmoid", _hard_sigmoid, attrs={"alpha": AttrSpec(F, 0.2), "beta": AttrSpec(F, 0.5)}, **ONNX),
    unary("HardSwish", lambda x, a: x.astype(np.float64) * np.clip(x.astype(np.float64) / 6 + 0.5, 0, 1), **ONNX),
    unary("Erf", lambda x, a: _erf(x), **ONNX),
    unary("Sqrt", lambda x, a: np.sqrt(x), **ONNX),
    unary("Exp", lambda x, a: np.exp(x), **ONNX),
    unary("Log", lambda x, a: np.log(x), **ONNX),
    unary("Reciprocal", lambda x, a: np.reciprocal(x), **ONNX),
    _numeric(unary("Neg", lambda x, a: np.negative(x), floats=False, **ONNX)),
    _numeric(unary("Abs", lambda x, a: np.abs(x), floats=False, **ONNX)),
    unary("Identity", lambda x, a: x.copy(), floats=False, view=True, flops=no_flops, **ONNX),
    unary("Dropout", lambda x, a: x.copy(), attrs={"ratio": AttrSpec(F, 0.5)}, floats=False, view=True, flops=no_flops,
          doc="inference only: the identity"),
    *map(_numeric, (
        binary("Add", np.add, fusable=True, **ONNX),
        binary("Sub", np.subtract, fusable=True, **ONNX),
        binary("Mul", np.multiply, fusable=True, **ONNX),
        binary("Div", lambda x, y: np.divide(x, y) if x.dtype.kind == "f" else _int_div(x, y), fusable=True, **ONNX),
        binary("Pow", lambda x, y: _float_pow(x, y) if x.dtype.kind == "f" else _int_pow(x, y), fusable=True),
        binary("Sum", np.add, variadic=True, **ONNX),
        binary("Max", np.maximum, variadic=True, fusable=True, **ONNX),
        binary("Min", np.minimum, variadic=True, fusable=True, **ONNX),
    )),
    binary("Equal", np.equal, result=DType.BOOL, **ONNX),
    binary("Less", np.less, result=DType.BOOL, **ONNX),
    binary("Greater", np.greater, result=DType.BOOL, **ONNX),
)


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero, as ONNX defines it; exact (no float64 detour,
    which loses i64 values above 2**53)."""
    q = np.floor_divide(x, y)
    return (q + ((np.remainder(x, y) != 0) & ((x < 0) != (y < 0)))).astype(x.dtype)


def _float_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """C's pow, as ONNX Runtime: NumPy takes ``x ** 0.5`` as sqrt, which gives -0 for -0 and NaN for -inf."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = np.power(x, y)
    half = y == 0.5
    if np.any(half):
        r = np.where(half & (x == 0), np.zeros_like(r), r)
        r = np.where(half & np.isneginf(x), np.full_like(r, np.inf), r)
    return r


def _int_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer power, wrapping; a negative exponent truncates 1/x**|y| toward zero (NumPy would
    raise), which is 0 unless |x| is 1, when x**y == x**(y & 1)."""
    x, y = np.broadcast_arrays(x, y)
    whole = np.power(x, np.where(y >= 0, y, y & 1))
    return np.where((y >= 0) | (x == 1) | (x == -1), whole, 0).astype(x.dtype)


def _where_infer(ts, a):
    require(ts[0].dtype is DType.BOOL, "Where: condition must be bool")
    dtype = same_dtype("Where", ts[1:])
    return [TensorType(dtype, broadcast_shapes("Where", *(t.shape for t in ts)))]


def _cast_infer(ts, a):
    require(a["round_mode"] in E8M0_ROUNDING, f"Cast: round_mode {a['round_mode']!r} is not one of {E8M0_ROUNDING}")
    return [TensorType(a["to"], ts[0].shape)]


def _to_e8m0(x: np.ndarray, saturate: bool, mode: str) -> np.ndarray:
    """ONNX's float8e8m0: the f32 exponent (sign dropped), rounded up, down or to nearest by the
    mantissa; NaN and infinity become NaN (0xFF); ``saturate`` stops a rounding at the largest."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.uint16)
    if mode == "up":
        inc = (bits & 0x7FFFFF) > 0
    elif mode == "nearest":
        inc = ((bits & 0x400000) > 0) & (((bits & 0x3FFFFF) > 0) | (e > 0))
    else:
        inc = np.zeros(bits.shape, bool)
    if saturate:
        inc &= e != 0xFE
    code = np.where(e == 0xFF, 0xFF, e + inc).astype(np.uint8)
    return code.view(DType.F8E8M0.numpy)


def _cast(xs, a):
    """NumPy's (ml_dtypes') ``astype``; with ``saturate`` (ONNX's default, float8 targets only) values
    beyond the target's largest finite one, infinities included, clamp to it first."""
    x, to = xs[0], a["to"]
    if to is DType.F8E8M0:
        return [_to_e8m0(x, bool(a["saturate"]), a["round_mode"])]
    if a["saturate"] and to in SATURABLE:
        top = float(to.finfo.max)
        x = np.clip(x, -top, top)
    if to is DType.U32 and x.dtype in (np.float32, np.float64):
        return [_float_to_u32(x)]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflow have defined results here
        return [x.astype(to.numpy)]


def _float_to_u32(x: np.ndarray) -> np.ndarray:
    """f32/f64 -> u32 by the rule NumPy's vector loop and ONNX Runtime follow (``codegen/float_int.py``):
    from 2^31 on, trunc(x - 2^31) with the top bit set; below, trunc(x) wrapped; NaN, infinities and
    values out of range take the i32 minimum's bits (so +inf and 2^32 give 0). ``astype`` answered
    otherwise for the last ``len % 4`` elements of an array (NaN 0, -3e9 1294967296): by position."""
    with np.errstate(invalid="ignore"):
        big = x >= 2.0**31
        t = np.trunc(np.where(big, x - 2.0**31, x))
        fits = (t >= -(2.0**31)) & (t < 2.0**31)
    low = np.where(fits, t, -(2.0**31)).astype(np.int64) & 0xFFFFFFFF
    return np.asarray(np.where(big, low ^ 0x80000000, low).astype(np.uint32))


register(
    OpDef("Where", _where_infer, lambda xs, a: [np.where(xs[0], xs[1], xs[2]).astype(xs[1].dtype)],
          min_inputs=3, max_inputs=3, elementwise=True, **ONNX),
    OpDef("Cast", _cast_infer, _cast, attrs={"to": AttrSpec(AttrKind.DTYPE), "saturate": AttrSpec(AttrKind.INT, 1),
                                              "round_mode": AttrSpec(AttrKind.STRING, "up")},
          elementwise=True, flops=no_flops, narrow_ok=True),
)
