"""The op fuzzer's cases for the quantized ops (QuantizeLinear, DequantizeLinear and the fused integer
ops): random scales, zero points and per-axis parameters around the shared value helpers."""

from __future__ import annotations

import numpy as np

from cuvil.compiler import DType
from tests.compiler.op_fuzz_cases import FLOATS, Case, Rng, broadcastable, conv, dim, operand, pick, shape, x


def _scale(rng: Rng) -> float:
    return float(pick(rng, [0.02, 0.1, 0.5, 1.0, 3.0]))


def _qdtype(rng: Rng) -> DType:
    return pick(rng, [DType.I8, DType.U8])


def _zp(rng: Rng, dt: DType) -> int:
    return int(rng.integers(-5, 6)) + (128 if dt is DType.U8 else 0)


def _out_attrs(rng: Rng) -> dict:
    to = _qdtype(rng)
    lo, hi = (-128, 127) if to is DType.I8 else (0, 255)
    clamp = () if rng.random() < 0.7 else (int(rng.integers(lo, 0 if lo else 100)), hi)
    return {"y_scale": _scale(rng), "y_zero_point": _zp(rng, to), "to": to, "clamp": clamp}


def _qvalues(rng: Rng, shp, dt: DType) -> np.ndarray:
    lo, hi = (-128, 128) if dt is DType.I8 else (0, 256)
    return rng.integers(lo, hi, shp).astype(dt.numpy)


def _per(rng: Rng, t_shape, axis_ok=True) -> tuple[tuple[float, ...], tuple[int, ...], int, DType]:
    dt = _qdtype(rng)
    if axis_ok and t_shape and rng.random() < 0.4:
        axis = int(rng.integers(-len(t_shape), len(t_shape)))
        n = t_shape[axis]
        return tuple(_scale(rng) for _ in range(n)), tuple(_zp(rng, dt) for _ in range(n)), axis, dt
    return (_scale(rng),), (_zp(rng, dt),), 1, dt


def quantize(rng: Rng) -> Case:
    xin = x(rng, FLOATS)
    scale, zp, axis, dt = _per(rng, xin[1].shape)
    return Case("QuantizeLinear", [xin], {"scale": scale, "zero_point": zp, "axis": axis, "to": dt})


def dequantize(rng: Rng) -> Case:
    shp = shape(rng)
    scale, zp, axis, dt = _per(rng, shp)
    return Case("DequantizeLinear", [("x", _qvalues(rng, shp, dt), False)], {"scale": scale, "zero_point": zp, "axis": axis})


def qadd(rng: Rng) -> Case:
    out = shape(rng)
    a_dt, b_dt = _qdtype(rng), _qdtype(rng)
    return Case("QAdd", [operand(_qvalues(rng, broadcastable(rng, out), a_dt), rng, 0.1),
                         operand(_qvalues(rng, broadcastable(rng, out), b_dt), rng, 0.2)],
                {"a_scale": _scale(rng), "a_zero_point": _zp(rng, a_dt), "b_scale": _scale(rng),
                 "b_zero_point": _zp(rng, b_dt), **_out_attrs(rng)})


def qmatmul(rng: Rng) -> Case:
    m, k, n = dim(rng, 6), dim(rng, 9), dim(rng, 6)
    a_dt = _qdtype(rng)
    ops = [("a", _qvalues(rng, shape(rng, 0, 2, 3) + (m, k), a_dt), False), operand(_qvalues(rng, (k, n), DType.I8), rng, 0.8)]
    if rng.random() < 0.5:
        ops.append(operand(rng.integers(-500, 500, (n,)).astype(np.int32), rng, 0.8))
    b_scale = (_scale(rng),) if rng.random() < 0.5 or not n else tuple(_scale(rng) for _ in range(n))
    return Case("QMatMul", ops, {"a_scale": _scale(rng), "a_zero_point": _zp(rng, a_dt), "b_scale": b_scale,
                                 **_out_attrs(rng)})


def qconv(rng: Rng) -> Case:
    base = conv(rng)
    xv, wv = base.operands[0][1], base.operands[1][1]
    x_dt = _qdtype(rng)
    ops = [("x", _qvalues(rng, xv.shape, x_dt), False), (base.operands[1][0], _qvalues(rng, wv.shape, DType.I8),
                                                         base.operands[1][2])]
    m = wv.shape[0]
    if len(base.operands) == 3:
        ops.append(operand(rng.integers(-500, 500, (m,)).astype(np.int32), rng, 0.8))
    w_scale = (_scale(rng),) if rng.random() < 0.5 else tuple(_scale(rng) for _ in range(m))
    return Case("QConv", ops, {**base.attrs, "x_scale": _scale(rng), "x_zero_point": _zp(rng, x_dt),
                               "w_scale": w_scale, **_out_attrs(rng)})


QUANT_GENERATORS = {
    "QuantizeLinear": quantize, "DequantizeLinear": dequantize, "QAdd": qadd, "QMatMul": qmatmul, "QConv": qconv,
}
