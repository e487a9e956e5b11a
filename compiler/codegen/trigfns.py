"""Vectorizable f32 trigonometric and hyperbolic functions as straight-line IR (Cephes sinf/cosf/atanf).

Same rules as ``mathfns``: selects and arithmetic only, so they vectorize on every target and run on
NVPTX; f64 goes through libm; f16 is computed in f32. sin/cos reduce by multiples of pi/2 in three
parts (Cody-Waite), exact enough for |x| up to about 1e4; the inverse and hyperbolic functions build
on atan, exp and an accurate log1p.
"""

from __future__ import annotations

import math

from llvmlite import ir

from .irhelpers import F64, I32, call_intrinsic
from .mathfns import exp, fconst, fma, horner, in_f32_for_half, libm, log

def _is_f64(x: ir.Value) -> bool:
    return x.type == F64


def _int_type(t: ir.Type) -> ir.Type:
    return ir.VectorType(I32, t.count) if isinstance(t, ir.VectorType) else I32


_TWO_OVER_PI = 0.636619772367581343
_PIO2 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)  # pi/2 in three parts
_SIN = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)


def _reduce(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """r = x - n pi/2 with |r| <= pi/4, sin(r), cos(r) and the quadrant n mod 4 (as an int)."""
    n = call_intrinsic(b, "llvm.rint", b.fmul(x, fconst(x, _TWO_OVER_PI)))
    r = x
    for part in _PIO2:
        r = fma(b, n, fconst(x, -part), r)
    z = b.fmul(r, r)
    s = fma(b, b.fmul(horner(b, z, _SIN), z), r, r)
    c = fma(b, b.fmul(z, z), horner(b, z, _COS), fma(b, z, fconst(x, -0.5), fconst(x, 1.0)))
    it = _int_type(x.type)
    q = b.and_(b.fptosi(n, it), ir.Constant(it, 3) if not isinstance(it, ir.VectorType) else
               ir.Constant(it, [ir.Constant(it.element, 3)] * it.count))
    return r, s, c, q


def _quadrant(b: ir.IRBuilder, q: ir.Value, k: int) -> ir.Value:
    t = q.type
    return b.icmp_signed("==", q, ir.Constant(t, k) if not isinstance(t, ir.VectorType) else
                         ir.Constant(t, [ir.Constant(t.element, k)] * t.count))


@in_f32_for_half
def sin(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    if _is_f64(x):
        return libm(b, "sin", x, f32=sin)
    _, s, c, q = _reduce(b, x)
    val = b.select(b.or_(_quadrant(b, q, 1), _quadrant(b, q, 3)), c, s)
    return b.select(b.or_(_quadrant(b, q, 2), _quadrant(b, q, 3)), b.fneg(val), val)


@in_f32_for_half
def cos(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    if _is_f64(x):
        return libm(b, "cos", x, f32=cos)
    _, s, c, q = _reduce(b, x)
    val = b.select(b.or_(_quadrant(b, q, 1), _quadrant(b, q, 3)), s, c)
    return b.select(b.or_(_quadrant(b, q, 1), _quadrant(b, q, 2)), b.fneg(val), val)


@in_f32_for_half
def tan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    if _is_f64(x):
        return libm(b, "tan", x, f32=tan)
    _, s, c, q = _reduce(b, x)
    odd = b.or_(_quadrant(b, q, 1), _quadrant(b, q, 3))
    return b.select(odd, b.fneg(b.fdiv(c, s)), b.fdiv(s, c))


@in_f32_for_half
def atan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Cephes atanf: |x| reduced below tan(pi/8) through pi/2 - atan(1/x) or pi/4 + atan((x-1)/(x+1))."""
    if _is_f64(x):
        return libm(b, "atan", x, f32=atan)
    ax = call_intrinsic(b, "llvm.fabs", x)
    big = b.fcmp_ordered(">", ax, fconst(x, 2.414213562373095))
    mid = b.fcmp_ordered(">", ax, fconst(x, 0.4142135623730950))
    one = fconst(x, 1.0)
    t = b.select(big, b.fdiv(fconst(x, -1.0), ax), b.select(mid, b.fdiv(b.fsub(ax, one), b.fadd(ax, one)), ax))
    base = b.select(big, fconst(x, math.pi / 2), b.select(mid, fconst(x, math.pi / 4), fconst(x, 0.0)))
    z = b.fmul(t, t)
    p = horner(b, z, [8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1])
    y = b.fadd(base, fma(b, b.fmul(p, z), t, t))
    return b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), b.fneg(y), y)  # NaN passes through y


@in_f32_for_half
def asin(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """atan(x / sqrt((1 - x)(1 + x))); NaN outside [-1, 1]."""
    if _is_f64(x):
        return libm(b, "asin", x, f32=asin)
    one = fconst(x, 1.0)
    root = call_intrinsic(b, "llvm.sqrt", b.fmul(b.fsub(one, x), b.fadd(one, x)))
    return atan(b, b.fdiv(x, root))


@in_f32_for_half
def acos(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """2 atan(sqrt((1 - x) / (1 + x))): accurate near 1, where acos is small."""
    if _is_f64(x):
        return libm(b, "acos", x, f32=acos)
    one = fconst(x, 1.0)
    return b.fmul(fconst(x, 2.0), atan(b, call_intrinsic(b, "llvm.sqrt", b.fdiv(b.fsub(one, x), b.fadd(one, x)))))


def log1p(b: ir.IRBuilder, u: ir.Value) -> ir.Value:
    """log(1 + u) accurate for small u (Goldberg: log(w) * u / (w - 1) with w = 1 + u rounded)."""
    one = fconst(u, 1.0)
    w = b.fadd(one, u)
    d = b.fsub(w, one)
    exact = b.fcmp_ordered("==", d, fconst(u, 0.0))
    corrected = b.fmul(log(b, w), b.fdiv(u, b.select(exact, one, d)))
    inf = b.fcmp_ordered("==", w, fconst(u, math.inf))
    return b.select(exact, u, b.select(inf, w, corrected))


@in_f32_for_half
def sinh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """(e^x - e^-x) / 2, and its Taylor series below |x| = 0.5 where that cancels."""
    if _is_f64(x):
        return libm(b, "sinh", x, f32=sinh)
    e = exp(b, x)
    wide = b.fmul(fconst(x, 0.5), b.fsub(e, b.fdiv(fconst(x, 1.0), e)))
    z = b.fmul(x, x)
    series = fma(b, b.fmul(horner(b, z, [1 / 362880, 1 / 5040, 1 / 120, 1 / 6]), z), x, x)
    small = b.fcmp_ordered("<", call_intrinsic(b, "llvm.fabs", x), fconst(x, 0.5))
    return b.select(small, series, wide)


@in_f32_for_half
def cosh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    if _is_f64(x):
        return libm(b, "cosh", x, f32=cosh)
    e = exp(b, call_intrinsic(b, "llvm.fabs", x))
    return b.fmul(fconst(x, 0.5), b.fadd(e, b.fdiv(fconst(x, 1.0), e)))


@in_f32_for_half
def asinh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); log(2|x|) where x^2 would overflow."""
    if _is_f64(x):
        return libm(b, "asinh", x, f32=asinh)
    ax = call_intrinsic(b, "llvm.fabs", x)
    one = fconst(x, 1.0)
    z = b.fmul(ax, ax)
    near = log1p(b, b.fadd(ax, b.fdiv(z, b.fadd(one, call_intrinsic(b, "llvm.sqrt", b.fadd(one, z))))))
    far = b.fadd(log(b, ax), fconst(x, math.log(2.0)))
    y = b.select(b.fcmp_ordered(">", ax, fconst(x, 1e18)), far, near)
    return b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), b.fneg(y), y)


@in_f32_for_half
def acosh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log1p(t + sqrt(t (t + 2))) with t = x - 1; log(2x) where that would overflow; NaN below 1."""
    if _is_f64(x):
        return libm(b, "acosh", x, f32=acosh)
    t = b.fsub(x, fconst(x, 1.0))
    near = log1p(b, b.fadd(t, call_intrinsic(b, "llvm.sqrt", b.fmul(t, b.fadd(t, fconst(x, 2.0))))))
    far = b.fadd(log(b, x), fconst(x, math.log(2.0)))
    return b.select(b.fcmp_ordered(">", x, fconst(x, 1e18)), far, near)


@in_f32_for_half
def atanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 log1p(2x / (1 - x)), odd."""
    if _is_f64(x):
        return libm(b, "atanh", x, f32=atanh)
    ax = call_intrinsic(b, "llvm.fabs", x)
    y = b.fmul(fconst(x, 0.5), log1p(b, b.fdiv(b.fmul(fconst(x, 2.0), ax), b.fsub(fconst(x, 1.0), ax))))
    return b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), b.fneg(y), y)
