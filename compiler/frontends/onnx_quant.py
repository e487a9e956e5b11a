"""ONNX's quantization ops -> Cuvil's quant family (registered into ``onnx_ops.TABLE``).

QDQ models (``onnxruntime.quantization.quantize_static``, PyTorch's export of quantized models) are
QuantizeLinear / DequantizeLinear pairs around float ops; they import as they are and
``passes/fuse_qdq.py`` later turns each pattern into one integer op. ``QLinearConv`` and
``QLinearMatMul`` with symmetric constant weights import straight into ``QConv`` / ``QMatMul``; with
other weights they become the equivalent DequantizeLinear -> float op -> QuantizeLinear chain.
``MatMulInteger`` is exact int32 arithmetic: Cast, Sub of the zero points, int32 MatMul.
Scales and zero points are constants, which become attributes, except the per-tensor ones
DynamicQuantizeLinear computes at run time (``onnxruntime.quantization.quantize_dynamic``): those
quantize by ONNX's float definition and MatMulInteger subtracts them as they come.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from ..ops.quant import QUANT_DTYPES, QUANTIZE_TO, dtype_range
from ..ops.registry import get_op
from .builder import Unsupported
from .onnx_node import NodeCtx, OnnxImportError, onnx_dtype
from .onnx_ops import conv_window, translates


def _floats(ctx: NodeCtx, i: int) -> list[float]:
    return [float(v) for v in ctx.const(i).astype(np.float64).reshape(-1)]


def _ints(ctx: NodeCtx, i: int, n: int) -> list[int]:
    return [int(v) for v in ctx.const(i).reshape(-1)] if ctx.has(i) else [0] * n


def _check_precision(ctx: NodeCtx) -> None:
    if ctx.attr("precision", 0):
        raise Unsupported("a computation precision other than the scale's")


def _composed(ctx: NodeCtx, dtype: DType) -> bool:
    """Imported as float ops around a Cast: the storage-only types, and blocked scales (``block_size``)."""
    return (dtype.is_narrow and dtype is not DType.BF16) or bool(ctx.attr("block_size", 0))


INT_RANGES = {DType.I4: (-8, 7), DType.U4: (0, 15), DType.I2: (-2, 1), DType.U2: (0, 3),
              **{d: dtype_range(d) for d in QUANTIZE_TO}}
_QDQ_VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)  # 13: per-axis; 19: float8; 21: blocks; 23+: types, precision


@translates(QuantizeLinear=_QDQ_VERSIONS)
def _quantize(ctx: NodeCtx) -> list:
    _check_precision(ctx)
    if ctx.has(2):
        to = ctx.type(2).dtype
    else:
        code = ctx.attr("output_dtype", 0)
        to = onnx_dtype(code) if code else DType.U8
    computed = any(ctx.has(i) and ctx.b.value_of(ctx.x(i)) is None for i in (1, 2))
    whole = all(ctx.type(i).numel() == 1 for i in (1, 2) if ctx.has(i))
    if computed and whole and to in INT_RANGES:  # DynamicQuantizeLinear's body: a scale found at run time
        return [_quantize_computed(ctx, to)]
    if _composed(ctx, to) and (to in INT_RANGES or to.is_narrow):
        return [_quantize_narrow(ctx, to)]
    if to not in QUANTIZE_TO:
        raise Unsupported(f"quantization to {to.value}")
    scale = _floats(ctx, 1)
    x = ctx.x(0)
    if ctx.type(0).dtype in (DType.F16, DType.BF16):  # the op takes f32, as ONNX Runtime computes these
        x = ctx.tmp("Cast", [x], "f32", to=DType.F32)
    return [ctx.emit("QuantizeLinear", [x], scale=scale, zero_point=_ints(ctx, 2, len(scale)),
                     axis=ctx.attr("axis", 1), to=to)]


def _quantize_computed(ctx: NodeCtx, to: DType) -> str:
    """ONNX's definition with a per-tensor scale (and zero point) computed at run time:
    ``clip(rint(x / scale) + zero_point)`` in float32, then cast. (Per-axis ones must be constants.)"""
    wide = [ctx.x(0), ctx.x(1)] + ([ctx.x(2)] if ctx.has(2) else [])
    wide = [v if ctx.b.type_of(v).dtype is DType.F32 else ctx.tmp("Cast", [v], f"f32_{i}", to=DType.F32)
            for i, v in enumerate(wide)]
    y = ctx.tmp("Round", [ctx.tmp("Div", wide[:2], "scaled")], "rounded")
    if len(wide) > 2:
        y = ctx.tmp("Add", [y, wide[2]], "shifted")
    lo, hi = INT_RANGES[to]
    return ctx.emit("Cast", [ctx.tmp("Clip", [y], "clipped", min=float(lo), max=float(hi))], to=to)


@translates(DequantizeLinear=_QDQ_VERSIONS)
def _dequantize(ctx: NodeCtx) -> list:
    _check_precision(ctx)
    if _composed(ctx, ctx.type(0).dtype):
        return [_dequantize_narrow(ctx)]
    if ctx.attr("output_dtype", 0) not in (0, 1):  # 1: FLOAT
        raise Unsupported("a dequantized result other than float32")
    scale = _floats(ctx, 1)
    attrs = dict(scale=scale, zero_point=_ints(ctx, 2, len(scale)), axis=ctx.attr("axis", 1))
    value = ctx.b.value_of(ctx.x(0))
    if value is not None and value.size == 1:  # a quantized scalar (Pad's value): ops need it constant
        return [ctx.b.constant(get_op("DequantizeLinear").reference([value], attrs)[0], "dequantized")]
    return [ctx.emit("DequantizeLinear", [ctx.x(0)], **attrs)]


# --- the storage-only types (float8, float4, int4, int2): float ops around a Cast, as ONNX defines them
def _per_axis(ctx: NodeCtx, i: int, dtype: DType) -> str:
    """Constant input ``i`` (a scale or zero point) as a ``dtype`` constant that broadcasts along ``axis``."""
    value, x = ctx.const(i).astype(dtype.numpy), ctx.type(0)
    axis, block = ctx.attr("axis", 1) % max(x.rank, 1), ctx.attr("block_size", 0)
    if block:  # one value per block of ``block`` along the axis, the rank of x
        if value.ndim != x.rank or block < 0 or value.shape[axis] * block < x.shape[axis]:
            raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): input {i} does not cover blocks of {block}")
        value = np.repeat(value, block, axis=axis).take(range(x.shape[axis]), axis=axis)
    elif value.ndim == 1 and value.size > 1:
        value = value.reshape([-1] + [1] * (x.rank - axis - 1))
    return ctx.constant(value, f"{ctx.name}/{i}")


def _quantize_narrow(ctx: NodeCtx, to: DType) -> str:
    """ONNX's definition: integers ``clip(rint(x / scale) + zero_point)``, float8 ``x / scale`` cast
    with ``saturate``, float4 ``x / scale + zero_point`` cast."""
    dtype = ctx.type(0).dtype
    y = ctx.tmp("Div", [ctx.x(0), _per_axis(ctx, 1, dtype)], "scaled")
    if to in INT_RANGES:
        y = ctx.tmp("Round", [y], "rounded")
        if ctx.has(2):
            y = ctx.tmp("Add", [y, _per_axis(ctx, 2, dtype)], "shifted")
        lo, hi = INT_RANGES[to]
        y = ctx.tmp("Clip", [y], "clipped", min=float(lo), max=float(hi))
    elif to is DType.F4E2M1 and ctx.has(2):
        y = ctx.tmp("Add", [y, _per_axis(ctx, 2, dtype)], "shifted")
    return ctx.emit("Cast", [y], to=to, saturate=ctx.attr("saturate", 1))


def _dequantize_narrow(ctx: NodeCtx) -> str:
    """``(float32(x) - zero_point) * scale`` in float32 (float8 and float4 have no zero point), then
    the scale's dtype (or ``output_dtype``)."""
    src = ctx.type(0).dtype
    code = ctx.attr("output_dtype", 0)
    out = onnx_dtype(code) if code else ctx.type(1).dtype
    y = ctx.tmp("Cast", [ctx.x(0)], "wide", to=DType.F32)
    if ctx.has(2) and (src in INT_RANGES or src is DType.I32):
        y = ctx.tmp("Sub", [y, _per_axis(ctx, 2, DType.F32)], "centred")
    elif ctx.has(2) and ctx.const(2).astype(np.float32).any():
        raise Unsupported(f"a non-zero zero point for {src.value}")
    if out is DType.F32:
        return ctx.emit("Mul", [y, _per_axis(ctx, 1, DType.F32)])
    y = ctx.tmp("Mul", [y, _per_axis(ctx, 1, DType.F32)], "scaled")
    return ctx.emit("Cast", [y], to=out)


def _one(ctx: NodeCtx, i: int) -> float | int:
    return ctx.scalar(i, 0)


def _dequantized(ctx: NodeCtx, x: str, scale: list[float], zero_point: list[int], axis: int, hint: str) -> str:
    return ctx.tmp("DequantizeLinear", [x], hint, scale=scale, zero_point=zero_point, axis=axis)


@translates(QLinearConv=(10,))
def _qlinear_conv(ctx: NodeCtx) -> list:
    w_scale, m = _floats(ctx, 4), ctx.type(3).shape[0]
    w_zp = _ints(ctx, 5, len(w_scale))
    attrs = conv_window(ctx, ctx.type(3).shape[2:])
    x_scale, x_zp, y_scale, y_zp = _one(ctx, 1), _one(ctx, 2), _one(ctx, 6), _one(ctx, 7)
    to = ctx.type(7).dtype
    inputs = [ctx.x(0), ctx.x(3)] + ([ctx.x(8)] if ctx.has(8) else [])
    if ctx.type(3).dtype is DType.I8 and not any(w_zp):
        return [ctx.emit("QConv", inputs, x_scale=x_scale, x_zero_point=x_zp, w_scale=w_scale, y_scale=y_scale,
                         y_zero_point=y_zp, to=to, **attrs)]
    x = _dequantized(ctx, ctx.x(0), [x_scale], [x_zp], 1, "x")
    w = _dequantized(ctx, ctx.x(3), w_scale, w_zp, 0, "w")
    conv = [x, w]
    if ctx.has(8):
        bias_scale = [float(v) for v in np.float32(x_scale) * np.asarray(w_scale, np.float32)]
        conv.append(_dequantized(ctx, ctx.x(8), bias_scale * (m if len(bias_scale) == 1 else 1), [0] * m, 0, "b"))
    y = ctx.tmp("Conv", conv, "conv", **attrs)
    return [ctx.emit("QuantizeLinear", [y], scale=[y_scale], zero_point=[y_zp], to=to)]


@translates(QLinearMatMul=(10, 21))
def _qlinear_matmul(ctx: NodeCtx) -> list:
    b_scale, bt = _floats(ctx, 4), ctx.type(3)
    b_zp = _ints(ctx, 5, len(b_scale))
    a_scale, a_zp, y_scale, y_zp = _one(ctx, 1), _one(ctx, 2), _one(ctx, 6), _one(ctx, 7)
    to = ctx.type(7).dtype
    constant_b = ctx.b.value_of(ctx.x(3)) is not None
    if constant_b and bt.rank == 2 and bt.dtype is DType.I8 and not any(b_zp):
        return [ctx.emit("QMatMul", [ctx.x(0), ctx.x(3)], a_scale=a_scale, a_zero_point=a_zp, b_scale=b_scale,
                         y_scale=y_scale, y_zero_point=y_zp, to=to)]
    if len(b_scale) > 1:
        raise Unsupported("per-column scales on a non-constant or batched B")
    a = _dequantized(ctx, ctx.x(0), [a_scale], [a_zp], 1, "a")
    b = _dequantized(ctx, ctx.x(3), b_scale, b_zp, 1, "b")
    y = ctx.tmp("MatMul", [a, b], "matmul")
    return [ctx.emit("QuantizeLinear", [y], scale=[y_scale], zero_point=[y_zp], to=to)]


@translates(MatMulInteger=(10,))
def _matmul_integer(ctx: NodeCtx) -> list:
    ta, tb = ctx.type(0), ctx.type(1)
    if ta.dtype not in QUANT_DTYPES or tb.dtype not in QUANT_DTYPES:
        raise Unsupported(f"operands {ta.dtype.value} x {tb.dtype.value}")
    sides = []
    for i, t, zp_index, column in ((0, ta, 2, False), (1, tb, 3, True)):
        wide = ctx.tmp("Cast", [ctx.x(i)], f"wide{i}", to=DType.I32)
        if ctx.has(zp_index) and ctx.b.value_of(ctx.x(zp_index)) is None:  # DynamicQuantizeLinear's
            if ctx.type(zp_index).numel() != 1:
                raise Unsupported(f"zero points of input {i} computed at run time for more than the whole tensor")
            zp_i32 = ctx.tmp("Cast", [ctx.x(zp_index)], f"zp{i}", to=DType.I32)
            wide = ctx.tmp("Sub", [wide, zp_i32], f"centred{i}")
        elif ctx.has(zp_index):
            zp = ctx.const(zp_index).astype(np.int32)
            if zp.size > 1 and not column:
                zp = zp.reshape(-1, 1)  # A's per-row zero points
            wide = ctx.tmp("Sub", [wide, ctx.constant(zp, f"{ctx.name}/zp{i}")], f"centred{i}")
        sides.append(wide)
    return [ctx.emit("MatMul", sides)]
