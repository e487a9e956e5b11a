"""Op family: quant — quantized tensors and the integer ops that compute on them (see docs/ir.md).

A quantized tensor is an ``i8``/``u8`` value ``q`` standing for the real ``(q - zero_point) * scale``;
scale and zero point are per tensor (one each) or per channel (one per index of ``axis``). As every
constant operand of Cuvil IR, they are static attributes of the ops that produce and consume the
tensor (:class:`QuantParams` reads them back as one typed record).

The arithmetic is ONNX Runtime's, in float32, so that a compiled kernel can reproduce it bit for bit:

* quantize: ``clamp(rint(x / scale) + zero_point)`` — round half to even, saturation to the dtype
  (or a narrower ``clamp``: a fused ReLU/Clip), NaN to the lowest value;
* dequantize: ``float32(q - zero_point) * scale``;
* requantize an int32 accumulator: ``clamp(rint(float32(acc) * m) + y_zero_point)`` with the
  per-channel multiplier ``m = x_scale * w_scale / y_scale`` computed once in float32
  (:func:`multiplier`).

Integer conv / matmul accumulate ``(x - x_zero_point) * w`` exactly in int32 (weights are symmetric:
zero point 0, as every int8 weight Cuvil makes or fuses), plus an int32 bias whose scale is
``x_scale * w_scale``.

QMatMul has a float-output form (``to=f32``, ``y_scale=1``, ``y_zero_point=0``, no ``clamp``): the
accumulator is dequantized instead of requantized, ``float32(acc) * m`` with the same multiplier
(``x_scale * w_scale / 1``, exactly ``x_scale * w_scale``), one float32 multiply and no rounding. It
is how a model's last layer keeps its logits unsaturated (as ONNX Runtime's and PyTorch's int8
models do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import broadcast_shapes, norm_axis
from .registry import AttrKind, AttrSpec, OpDef, get_op, register, require

F, I, FS, IS, DT = AttrKind.FLOAT, AttrKind.INT, AttrKind.FLOATS, AttrKind.INTS, AttrKind.DTYPE
QUANT_DTYPES = (DType.I8, DType.U8)
QUANTIZE_TO = QUANT_DTYPES + (DType.I16, DType.U16)  # QuantizeLinear alone; the fused ops stay 8-bit
DEQUANT_DTYPES = QUANTIZE_TO + (DType.I32,)
_CONV = ("strides", "pads", "dilations", "group")


def dtype_range(dtype: DType) -> tuple[int, int]:
    info = np.iinfo(dtype.numpy)
    return int(info.min), int(info.max)


def clamp_bounds(dtype: DType, clamp: Sequence[int]) -> tuple[int, int]:
    """The saturation range: the dtype's, narrowed by a fused activation's ``clamp`` (lo, hi)."""
    lo, hi = dtype_range(dtype)
    if clamp:
        lo, hi = max(lo, clamp[0]), min(hi, clamp[1])
    return lo, hi


def multiplier(x_scale: float, w_scale: Sequence[float] | float, y_scale: float) -> np.ndarray:
    """float32 ``x_scale * w_scale / y_scale``, left to right (as ONNX Runtime's QLinearConv)."""
    w = np.atleast_1d(np.asarray(w_scale, dtype=np.float32))
    return (np.float32(x_scale) * w) / np.float32(y_scale)


def saturate(v: np.ndarray, zero_point: int | np.ndarray, dtype: DType, clamp: Sequence[int] = ()) -> np.ndarray:
    """``clamp(rint(v) + zero_point)`` in float32 (fmax/fmin: NaN goes to the low bound), to ``dtype``."""
    lo, hi = clamp_bounds(dtype, clamp)
    q = np.rint(v.astype(np.float32)) + np.asarray(zero_point, dtype=np.float32)
    return np.fmin(np.fmax(q, np.float32(lo)), np.float32(hi)).astype(dtype.numpy)


def requantize(acc: np.ndarray, m: np.ndarray, channel_axis: int, zero_point: int, dtype: DType,
               clamp: Sequence[int] = ()) -> np.ndarray:
    """An int32 accumulator to ``dtype`` by the per-channel float32 multiplier ``m``; for f32 (the
    float-output form) the float32 product itself."""
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    v = acc.astype(np.int32).astype(np.float32) * m.reshape(shape if m.size > 1 else [1] * acc.ndim)
    return v if dtype is DType.F32 else saturate(v, zero_point, dtype, clamp)


@dataclass(frozen=True)
class QuantParams:
    """How an i8/u8 tensor maps to reals: per tensor (one scale) or per channel along ``axis``."""

    dtype: DType
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 1

    @property
    def per_tensor(self) -> bool:
        return len(self.scale) == 1

    def broadcast(self, values: Sequence, rank: int, dtype) -> np.ndarray:
        arr = np.asarray(values, dtype=dtype)
        if self.per_tensor:
            return arr.reshape(())
        shape = [1] * rank
        shape[norm_axis("quant", self.axis, rank)] = -1
        return arr.reshape(shape)


def _check_params(op: str, t: TensorType, scale: Sequence[float], zero_point: Sequence[int], axis: int,
                  dtype: DType) -> None:
    require(len(scale) >= 1 and len(scale) == len(zero_point),
            f"{op}: needs one zero point per scale, got {len(scale)} scales and {len(zero_point)} zero points")
    require(all(math.isfinite(s) and s > 0 for s in scale), f"{op}: scales must be finite and > 0")
    lo, hi = dtype_range(dtype)
    require(all(lo <= z <= hi for z in zero_point), f"{op}: zero points must lie in {dtype.value}'s range")
    if len(scale) > 1:
        ax = norm_axis(op, axis, t.rank)
        require(t.shape[ax] == len(scale), f"{op}: {len(scale)} scales for axis {axis} of {t}")


def _scale_checks(op: str, a, *keys: str) -> None:
    for k in keys:
        vals = a[k] if isinstance(a[k], tuple) else (a[k],)
        require(len(vals) >= 1 and all(math.isfinite(s) and s > 0 for s in vals), f"{op}: {k} must be finite and > 0")


def _zp_check(op: str, zp: int, dtype: DType, what: str) -> None:
    lo, hi = dtype_range(dtype)
    require(lo <= zp <= hi, f"{op}: {what} {zp} outside {dtype.value}'s range")


def _clamp_check(op: str, a, float_out: bool = False) -> None:
    c = a["clamp"]
    require(len(c) in (0, 2) and (not c or c[0] <= c[1]), f"{op}: clamp must be empty or (lo, hi) with lo <= hi")
    if float_out and a["to"] is DType.F32:
        require(a["y_scale"] == 1.0 and a["y_zero_point"] == 0 and not c,
                f"{op}: the float-output form (to=f32) takes y_scale=1, y_zero_point=0 and no clamp")
        return
    allowed = "i8, u8 or f32" if float_out else "i8 or u8"
    require(a["to"] in QUANT_DTYPES, f"{op}: result dtype must be {allowed}, got {a['to'].value}")
    _zp_check(op, a["y_zero_point"], a["to"], "y_zero_point")


def float_output(a) -> bool:
    """Is this fused op the float-output form (the accumulator dequantized, not requantized)?"""
    return a["to"] is DType.F32


# --- QuantizeLinear / DequantizeLinear ---------------------------------------------------------
_QDQ_ATTRS = {"scale": AttrSpec(FS), "zero_point": AttrSpec(IS), "axis": AttrSpec(I, 1)}


def _quantize_infer(ts, a):
    x = ts[0]
    require(x.dtype is DType.F32, f"QuantizeLinear: needs a float32 operand (cast it first), got {x.dtype.value}")
    require(a["to"] in QUANTIZE_TO, f"QuantizeLinear: result dtype must be i8, u8, i16 or u16, got {a['to'].value}")
    _check_params("QuantizeLinear", x, a["scale"], a["zero_point"], a["axis"], a["to"])
    return [TensorType(a["to"], x.shape)]


def _quantize(xs, a):
    x = xs[0]
    p = QuantParams(a["to"], a["scale"], a["zero_point"], a["axis"])
    v = x.astype(np.float32) / p.broadcast(p.scale, x.ndim, np.float32)
    return [saturate(v, p.broadcast(p.zero_point, x.ndim, np.float32), a["to"])]


def _dequantize_infer(ts, a):
    x = ts[0]
    require(x.dtype in DEQUANT_DTYPES, f"DequantizeLinear: operand must be i8, u8, i16, u16 or i32, got {x.dtype.value}")
    _check_params("DequantizeLinear", x, a["scale"], a["zero_point"], a["axis"], x.dtype)
    return [TensorType(DType.F32, x.shape)]


def _dequantize(xs, a):
    x = xs[0]
    p = QuantParams(DType.from_numpy(x.dtype), a["scale"], a["zero_point"], a["axis"])
    centred = (x.astype(np.int64) - p.broadcast(p.zero_point, x.ndim, np.int64)).astype(np.float32)
    return [centred * p.broadcast(p.scale, x.ndim, np.float32)]


# --- QConv ---------------------------------------------------------------------------------------
def _requant_attrs(prefix: str) -> dict[str, AttrSpec]:
    return {f"{prefix}_scale": AttrSpec(F), f"{prefix}_zero_point": AttrSpec(I, 0)}


_OUT_ATTRS = {"y_scale": AttrSpec(F), "y_zero_point": AttrSpec(I, 0), "to": AttrSpec(DT, DType.U8),
              "clamp": AttrSpec(IS, ())}


def _int_inputs(op: str, ts, weight_rank: int | None = None) -> None:
    require(ts[0].dtype in QUANT_DTYPES, f"{op}: X must be i8 or u8, got {ts[0].dtype.value}")
    require(ts[1].dtype is DType.I8, f"{op}: weights must be i8, got {ts[1].dtype.value}")
    require(len(ts) < 3 or ts[2].dtype is DType.I32, f"{op}: bias must be i32, got {ts[-1].dtype.value}")


def _qconv_infer(ts, a):
    _int_inputs("QConv", ts)
    require(ts[0].rank == 4, f"QConv: X must be (N, C, H, W): 2-D convolutions only, got {ts[0]}")
    _clamp_check("QConv", a)
    _scale_checks("QConv", a, "x_scale", "w_scale", "y_scale")
    _zp_check("QConv", a["x_zero_point"], ts[0].dtype, "x_zero_point")
    m = ts[1].shape[0]
    require(len(a["w_scale"]) in (1, m), f"QConv: w_scale needs 1 or {m} values, got {len(a['w_scale'])}")
    conv = get_op("Conv").shape_rule([TensorType(DType.F32, t.shape) for t in ts], {k: a[k] for k in _CONV})
    return [TensorType(a["to"], conv[0].shape)]


def _qconv(xs, a):
    """The int32 accumulator is exact in float64 (|terms| < 2^15, far fewer than 2^38 of them)."""
    x = xs[0].astype(np.float64) - a["x_zero_point"]
    acc = get_op("Conv").reference([x, xs[1].astype(np.float64)], {k: a[k] for k in _CONV})[0]
    if len(xs) == 3:
        acc = acc + xs[2].astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    m = multiplier(a["x_scale"], a["w_scale"], a["y_scale"])
    return [requantize(acc.astype(np.int64), m, 1, a["y_zero_point"], a["to"], a["clamp"])]


def qconv_flops(a, ins, outs) -> int:
    w = ins[1].shape
    return 2 * math.prod(outs[0].shape) * math.prod(w[1:])


# --- QMatMul -----------------------------------------------------------------------------------
def _qmatmul_infer(ts, a):
    _int_inputs("QMatMul", ts)
    _clamp_check("QMatMul", a, float_out=True)
    _scale_checks("QMatMul", a, "a_scale", "b_scale", "y_scale")
    _zp_check("QMatMul", a["a_zero_point"], ts[0].dtype, "a_zero_point")
    x, w = ts[0], ts[1]
    require(x.rank >= 1 and w.rank == 2 and x.shape[-1] == w.shape[0],
            f"QMatMul: A {x} [..., K] and B {w} [K, N] do not fit")
    n = w.shape[1]
    require(len(a["b_scale"]) in (1, n), f"QMatMul: b_scale needs 1 or {n} values, got {len(a['b_scale'])}")
    require(len(ts) < 3 or ts[2].shape == (n,), f"QMatMul: bias must be [{n}], got {ts[-1]}")
    return [TensorType(a["to"], tuple(x.shape[:-1]) + (n,))]


def _qmatmul(xs, a):
    acc = (xs[0].astype(np.float64) - a["a_zero_point"]) @ xs[1].astype(np.float64)
    if len(xs) == 3:
        acc = acc + xs[2].astype(np.float64)
    m = multiplier(a["a_scale"], a["b_scale"], a["y_scale"])
    return [requantize(acc.astype(np.int64), m, acc.ndim - 1, a["y_zero_point"], a["to"], a["clamp"])]


def _qmatmul_flops(a, ins, outs) -> int:
    return 2 * math.prod(outs[0].shape) * ins[1].shape[0]


# --- QAdd --------------------------------------------------------------------------------------
def _qadd_infer(ts, a):
    require(all(t.dtype in QUANT_DTYPES for t in ts), f"QAdd: operands must be i8 or u8, got {[str(t) for t in ts]}")
    _clamp_check("QAdd", a)
    _scale_checks("QAdd", a, "a_scale", "b_scale", "y_scale")
    _zp_check("QAdd", a["a_zero_point"], ts[0].dtype, "a_zero_point")
    _zp_check("QAdd", a["b_zero_point"], ts[1].dtype, "b_zero_point")
    return [TensorType(a["to"], broadcast_shapes("QAdd", ts[0].shape, ts[1].shape))]


def add_multipliers(a) -> tuple[np.float32, np.float32]:
    """float32 ``a_scale / y_scale`` and ``b_scale / y_scale``."""
    y = np.float32(a["y_scale"])
    return np.float32(a["a_scale"]) / y, np.float32(a["b_scale"]) / y


def _qadd(xs, a):
    ma, mb = add_multipliers(a)
    fa = (xs[0].astype(np.int32) - a["a_zero_point"]).astype(np.float32) * ma
    fb = (xs[1].astype(np.int32) - a["b_zero_point"]).astype(np.float32) * mb
    return [saturate(fa + fb, a["y_zero_point"], a["to"], a["clamp"])]


register(
    OpDef("QuantizeLinear", _quantize_infer, _quantize, attrs={**_QDQ_ATTRS, "to": AttrSpec(DT, DType.U8)},
          doc="f32 -> i8/u8: clamp(rint(x / scale) + zero_point)"),
    OpDef("DequantizeLinear", _dequantize_infer, _dequantize, attrs=dict(_QDQ_ATTRS), foldable=False,
          doc="i8/u8/i32 -> f32: (q - zero_point) * scale; never folded into float weights"),
    OpDef("QConv", _qconv_infer, _qconv, min_inputs=2, max_inputs=3, flops=qconv_flops,
          attrs={"strides": AttrSpec(IS), "pads": AttrSpec(IS), "dilations": AttrSpec(IS), "group": AttrSpec(I, 1),
                 **_requant_attrs("x"), "w_scale": AttrSpec(FS), **_OUT_ATTRS}),
    OpDef("QMatMul", _qmatmul_infer, _qmatmul, min_inputs=2, max_inputs=3, flops=_qmatmul_flops,
          attrs={**_requant_attrs("a"), "b_scale": AttrSpec(FS), **_OUT_ATTRS}),
    OpDef("QAdd", _qadd_infer, _qadd, min_inputs=2, max_inputs=2,
          attrs={**_requant_attrs("a"), **_requant_attrs("b"), **_OUT_ATTRS}),
)
