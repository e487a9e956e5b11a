"""Conversions to and from 16-bit floats without library calls.

LLVM turns a conversion that a target has no instruction for into a call to a compiler-rt routine
(``__truncdfhf2`` for double -> half on x86 even with F16C), which a JIT cannot resolve. Here
double -> half goes through float with *round to odd*, which then rounds to half exactly as one
direct rounding would (float keeps 13 more mantissa bits than half needs, and odd rounding keeps
the sticky information), so the result is NumPy's ``astype(float16)``.
"""

from __future__ import annotations

from llvmlite import ir

from . import irhelpers as h

I32 = h.I32


def f64_to_f32_odd(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``x`` rounded to float *toward odd*: exact values stay, inexact ones get an odd last bit."""
    t = b.fptrunc(x, h.F32)
    back = b.fpext(t, h.F64)
    exact = b.fcmp_unordered("==", back, x)  # NaN counts as exact: it converts as it is
    bits = b.bitcast(t, I32)
    away = b.fcmp_ordered(">", h.call_intrinsic(b, "llvm.fabs", back), h.call_intrinsic(b, "llvm.fabs", x))
    toward_zero = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    odd = b.or_(toward_zero, ir.Constant(I32, 1))
    return b.bitcast(b.select(exact, bits, odd), h.F32)


def f64_to_f16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fptrunc(f64_to_f32_odd(b, x), h.F16)


def f16_to_f64(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fpext(b.fpext(x, h.F32), h.F64)  # both steps exact


def float_convert(b: ir.IRBuilder, x: ir.Value, to: ir.Type) -> ir.Value:
    """Between half, float and double, rounding to nearest even, with no library call."""
    src = x.type
    if src == to:
        return x
    if src == h.F64 and to == h.F16:
        return f64_to_f16(b, x)
    if src == h.F16 and to == h.F64:
        return f16_to_f64(b, x)
    widths = {h.F16: 16, h.F32: 32, h.F64: 64}
    return b.fpext(x, to) if widths[src] < widths[to] else b.fptrunc(x, to)


def half_round(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """An f32 value rounded to half and back: one f16 op's result, kept in f32 for the next."""
    return b.fpext(b.fptrunc(x, h.F16), h.F32)
