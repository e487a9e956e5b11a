"""The quant family's element arithmetic as LLVM IR, shared by the CPU and NVPTX backends.

Each function does, operation for operation, what ``ops/quant.py``'s NumPy reference does in
float32 (``fdiv``/``fmul`` without fast-math flags, ``llvm.rint`` = round half to even,
``llvm.maxnum``/``llvm.minnum`` = NumPy's ``fmax``/``fmin``), so compiled results equal the
reference bit for bit (``saturate`` on CPUs clamps before it rounds: the same integers, see there).
Values may be scalars or vectors; per-channel constants live in one read-only global array per kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from ..ir.dtypes import DType
from ..ops.quant import clamp_bounds, float_output
from . import irhelpers as h


def splat(t: ir.Type, v: float | int) -> ir.Constant:
    return h.const(t, v)


def splat_value(b: ir.IRBuilder, x: ir.Value, t: ir.VectorType) -> ir.Value:
    """A scalar value in every lane of ``t``."""
    v = b.insert_element(h.undef(t), x, ir.Constant(h.I32, 0))
    return b.shuffle_vector(v, h.undef(t), h.vector(ir.VectorType(h.I32, t.count), None))


def widen(b: ir.IRBuilder, q: ir.Value, dtype: DType) -> ir.Value:
    """i8/u8 (scalar or vector) to i32, signed or not as ``dtype`` says."""
    t = ir.VectorType(h.I32, q.type.count) if isinstance(q.type, ir.VectorType) else h.I32
    return b.sext(q, t) if dtype in h.SIGNED else b.zext(q, t)


def _like(v: ir.Value, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, v.type.count) if isinstance(v.type, ir.VectorType) else elem


def saturate(b: ir.IRBuilder, v: ir.Value, zero_point: ir.Value | float, lo: int, hi: int,
             to: ir.IntType = h.I8) -> ir.Value:
    """``clamp(rint(v) + zero_point)`` of a float32 value, as ``to`` (bits of the signed or unsigned result).
    With a constant zero point on a CPU: ``lrint(clamp(v, lo - zp, hi - zp)) + zp``, the same integer (rint is
    monotone and the bounds are whole; NaN goes to ``lo`` either way) in fewer instructions (x86: one
    ``cvtps2dq`` for the round and the conversion, no float add); NVPTX has no ``lrint``."""
    f = v.type
    if isinstance(zero_point, ir.Value) or b.module.triple.startswith("nvptx"):
        zp = zero_point if isinstance(zero_point, ir.Value) else splat(f, zero_point)
        q = b.fadd(h.call_intrinsic(b, "llvm.rint", v), zp)
        q = h.call_intrinsic(b, "llvm.maxnum", q, splat(f, lo))
        q = h.call_intrinsic(b, "llvm.minnum", q, splat(f, hi))
        return b.trunc(b.fptosi(q, _like(v, h.I32)), _like(v, to))
    zp = int(zero_point)
    q = h.call_intrinsic(b, "llvm.maxnum", v, splat(f, lo - zp))
    q = h.call_intrinsic(b, "llvm.minnum", q, splat(f, hi - zp))
    i32 = _like(v, h.I32)
    lanes = f"v{f.count}" if isinstance(f, ir.VectorType) else ""
    q = h.call_named(b, f"llvm.lrint.{lanes}i32.{lanes}f32", i32, [q])
    return b.trunc(b.add(q, splat(i32, zp)) if zp else q, _like(v, to))


def requantize(b: ir.IRBuilder, acc: ir.Value, m: ir.Value, zero_point: int, lo: int, hi: int) -> ir.Value:
    """An int32 accumulator times the float32 multiplier ``m``, saturated to i8 bits."""
    return saturate(b, b.fmul(b.sitofp(acc, _like(acc, h.F32)), m), float(zero_point), lo, hi)


def finish(b: ir.IRBuilder, acc: ir.Value, m: ir.Value, a) -> ir.Value:
    """A fused op's result from its int32 accumulator and multiplier ``m``, per its attributes ``a``:
    requantized i8 bits, or in the float-output form the float32 ``float32(acc) * m`` itself."""
    if float_output(a):
        return b.fmul(b.sitofp(acc, _like(acc, h.F32)), m)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    return requantize(b, acc, m, a["y_zero_point"], lo, hi)


def dequantize(b: ir.IRBuilder, q: ir.Value, dtype: DType, zero_point: ir.Value, scale: ir.Value) -> ir.Value:
    """``float32(q - zero_point) * scale`` (``zero_point`` an i32, ``scale`` a float32 value)."""
    wide = q if dtype is DType.I32 else widen(b, q, dtype)
    return b.fmul(b.sitofp(b.sub(wide, zero_point), _like(wide, h.F32)), scale)


def table(b: ir.IRBuilder, name: str, values: Sequence[float | int] | np.ndarray, elem: ir.Type) -> ir.Value:
    """A read-only global array of ``values`` (one per channel), as a pointer to its first element."""
    module = b.module
    gname = f"{name}.{len([g for g in module.global_values if g.name.startswith(name + '.')])}"
    vals = np.asarray(values).reshape(-1)
    arr_t = ir.ArrayType(elem, len(vals))
    g = ir.GlobalVariable(module, arr_t, gname)
    conv = float if h.is_float(elem) else int
    g.initializer = ir.Constant(arr_t, [ir.Constant(elem, conv(v)) for v in vals])
    g.global_constant = True
    g.linkage = "internal"
    return b.gep(g, [h.i64(0), h.i64(0)], inbounds=True)


def channel_value(b: ir.IRBuilder, values: Sequence[float | int] | np.ndarray, elem: ir.Type, channel: ir.Value,
                  name: str) -> ir.Value:
    """``values[channel]``: a constant when there is one value, else a load from a :func:`table`."""
    vals = np.asarray(values).reshape(-1)
    if vals.size == 1:
        return ir.Constant(elem, float(vals[0]) if h.is_float(elem) else int(vals[0]))
    return h.load(b, table(b, name, vals, elem), channel)
