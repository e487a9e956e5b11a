"""Vectorizable f32 math (exp, log, tanh, erf, sigmoid, pow, the activations) as straight-line IR.

``llvm.exp`` and friends lower to one libm call per element and block vectorization; these
polynomial forms (Cephes expf/logf, Eigen's rational tanh and erf) are a few ulp from libm, use
only selects and arithmetic, and so vectorize on every target (x86, NEON, SVE, NVPTX alike).
``x`` may be an f32 scalar or an f32 vector (the GEMM/Conv epilogues pass ``<VL x float>``);
f64 scalars go through libm; f16 values are computed in f32 (widened, then rounded back once).
The one home of this math: the element emitters of ``scalar_ops.py`` (and through them the fused
epilogues of ``activations.py``) build on it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from llvmlite import ir

from .irhelpers import F16, F32, I32, call_intrinsic, const, intrinsic

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4


def _is_f64(x: ir.Value) -> bool:
    return str(x.type) == "double"


def libm(b: ir.IRBuilder, name: str, *args: ir.Value, f32: Callable[..., ir.Value]) -> ir.Value:
    """f64 math through the C library (the JIT resolves it in-process): exact, not vectorized.
    NVPTX has no C library to link: there the f32 form ``f32`` computes it (rounded to f32 once)."""
    t = args[0].type
    if b.module.triple.startswith("nvptx"):
        return b.fpext(f32(b, *(b.fptrunc(a, F32) for a in args)), t)
    return b.call(intrinsic(b.module, name, t, [t] * len(args)), list(args))


def fconst(x: ir.Value, v: float) -> ir.Constant:
    return const(x.type, v)


def _is_half(t: ir.Type) -> bool:
    return t == F16 or (isinstance(t, ir.VectorType) and t.element == F16)


def _widened(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    if isinstance(v, ir.Constant) and v.type == F16:
        return ir.Constant(F32, v.constant)  # stays a constant: pow_ keys its fast paths on them
    wide = ir.VectorType(F32, v.type.count) if isinstance(v.type, ir.VectorType) else F32
    return b.fpext(v, wide)


def in_f32_for_half(fn: Callable[..., ir.Value]) -> Callable[..., ir.Value]:
    """Half-precision operands are widened to f32, the result rounded back to half once."""

    @functools.wraps(fn)
    def wrapper(b: ir.IRBuilder, x: ir.Value, *rest, **kw) -> ir.Value:
        if not _is_half(x.type):
            return fn(b, x, *rest, **kw)
        args = [_widened(b, v) if isinstance(v, ir.Value) else v for v in (x, *rest)]
        return b.fptrunc(fn(b, *args, **kw), x.type)

    return wrapper


def _int_type(t: ir.Type) -> ir.Type:
    """i32, or <n x i32> for an <n x float>: the bit pattern type of ``t``."""
    return ir.VectorType(I32, t.count) if isinstance(t, ir.VectorType) else I32


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    return call_intrinsic(b, "llvm.fma", x, y, z)


def horner(b: ir.IRBuilder, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
    """``c0*x^(n-1) + ... + c(n-1)``, highest power first, with fused multiply-adds."""
    acc = fconst(x, coeffs[0])
    for c in coeffs[1:]:
        acc = fma(b, acc, x, fconst(x, c))
    return acc


def select_lt(b: ir.IRBuilder, x: ir.Value, bound: float, then: ir.Value, other: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, fconst(x, bound)), then, other)


def clamp(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """NaN-preserving clamp (a NaN compares false and passes through)."""
    x = b.select(b.fcmp_ordered("<", x, fconst(x, lo)), fconst(x, lo), x)
    return b.select(b.fcmp_ordered(">", x, fconst(x, hi)), fconst(x, hi), x)


@in_f32_for_half
def exp(b: ir.IRBuilder, x: ir.Value, full_range: bool = True) -> ir.Value:
    """Cephes expf: ``2**n * p(r)``, ``n = rint(x log2 e)``. Full range: subnormal results down to
    x = -103.97 and finite ones up to 88.72 (2**n applied in two halves). ``full_range=False``
    applies 2**n in one step (three fewer ops per element): 0 below -87.34, inf above 88.38."""
    if _is_f64(x):
        return libm(b, "exp", x, f32=exp)
    lo, hi = (-103.9720840454, 88.72283172607422) if full_range else (-87.3365447504019, 88.3762626647949)
    xc = clamp(b, x, lo, hi)
    fx = call_intrinsic(b, "llvm.rint", b.fmul(xc, fconst(x, _LOG2E)))
    r = fma(b, fx, fconst(x, -_LN2_HI), xc)
    r = fma(b, fx, fconst(x, -_LN2_LO), r)
    p = horner(b, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1])
    y = b.fadd(fma(b, p, b.fmul(r, r), r), fconst(x, 1.0))
    it = _int_type(x.type)
    n = b.fptosi(fx, it)
    if full_range:  # n from -150 (subnormal results) to 128 (near FLT_MAX) stays exact
        n1 = b.ashr(n, const(it, 1))
        res = b.fmul(b.fmul(y, _pow2(b, n1, x.type)), _pow2(b, b.sub(n, n1), x.type))
    else:  # n from -126 to 127
        res = b.fmul(y, _pow2(b, n, x.type))
    res = select_lt(b, x, lo, fconst(x, 0.0), res)
    return b.select(b.fcmp_ordered(">", x, fconst(x, hi)), fconst(x, float("inf")), res)


def _pow2(b: ir.IRBuilder, n: ir.Value, ty: ir.Type) -> ir.Value:
    return b.bitcast(b.shl(b.add(n, const(n.type, 127)), const(n.type, 23)), ty)


@in_f32_for_half
def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    if _is_f64(x):
        return libm(b, "log", x, f32=log)
    it = _int_type(x.type)
    tiny = b.fcmp_ordered("<", x, fconst(x, 2.0**-126))  # subnormal: scaled by 2^23 so the exponent is exact
    bits = b.bitcast(b.select(tiny, b.fmul(x, fconst(x, 2.0**23)), x), it)
    e = b.sitofp(b.sub(b.lshr(bits, const(it, 23)), const(it, 126)), x.type)
    m = b.bitcast(b.or_(b.and_(bits, const(it, 0x807FFFFF)), const(it, 0x3F000000)), x.type)
    small = b.fcmp_ordered("<", m, fconst(x, 0.707106781186547524))
    e = b.fsub(e, b.fadd(b.select(small, fconst(x, 1.0), fconst(x, 0.0)), b.select(tiny, fconst(x, 23.0), fconst(x, 0.0))))
    m = b.fadd(b.fsub(m, fconst(x, 1.0)), b.select(small, m, fconst(x, 0.0)))
    z = b.fmul(m, m)
    y = horner(b, m, [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
                      -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1])
    y = b.fmul(b.fmul(y, m), z)
    y = fma(b, e, fconst(x, _LN2_LO), y)
    y = fma(b, z, fconst(x, -0.5), y)
    res = fma(b, e, fconst(x, _LN2_HI), b.fadd(m, y))
    res = b.select(b.fcmp_ordered("==", x, fconst(x, float("inf"))), x, res)
    res = b.select(b.fcmp_ordered("==", x, fconst(x, 0.0)), fconst(x, float("-inf")), res)
    return b.select(b.fcmp_unordered("<", x, fconst(x, 0.0)), fconst(x, float("nan")), res)


def _odd_rational(b: ir.IRBuilder, x: ir.Value, bound: float, p: Sequence[float], q: Sequence[float]) -> ir.Value:
    """``x' P(x'^2) / Q(x'^2)`` with ``x' = clamp(x, -bound, bound)``: Eigen's odd rational form."""
    xc = clamp(b, x, -bound, bound)
    x2 = b.fmul(xc, xc)
    return b.fdiv(b.fmul(horner(b, x2, p), xc), horner(b, x2, q))


@in_f32_for_half
def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Eigen's rational approximation on [-7.9, 7.9]; ``x`` itself for |x| < 4e-4; exactly +-1 from
    |x| >= 9 (the f32 tanh of every |x| > 8.7), where the clamped approximation stays at 1 - 2^-22
    and Gelu's x (1 + tanh) gave -1.2e-3 for 0 at x = -1e4."""
    if _is_f64(x):
        return libm(b, "tanh", x, f32=tanh)
    res = _odd_rational(b, x, 7.90531110763549805,
                        [-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
                         1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03],
                        [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03])
    ax = call_intrinsic(b, "llvm.fabs", x)
    res = b.select(b.fcmp_ordered(">=", ax, fconst(x, 9.0)), call_intrinsic(b, "llvm.copysign", fconst(x, 1.0), x), res)
    return b.select(b.fcmp_ordered("<", ax, fconst(x, 0.0004)), x, res)


@in_f32_for_half
def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Rational approximation on [-4, 4] (TensorFlow/Eigen float erf)."""
    if _is_f64(x):
        return libm(b, "erf", x, f32=erf)
    return _odd_rational(b, x, 4.0,
                         [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02],
                         [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                          -7.37332916720468e-03, -1.42647390514189e-02])


@in_f32_for_half
def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1 / (1 + exp(-x)). The short-range exp suffices: where it differs from the full one
    (x in (-88.72, -88.38)) sigmoid is below 4.2e-39 either way."""
    one = fconst(x, 1.0)
    return b.fdiv(one, b.fadd(one, exp(b, b.fneg(x), full_range=False)))


@in_f32_for_half
def pow_(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """x**y with NumPy's special cases; small constant exponents become multiplies."""
    if isinstance(y, ir.Constant):
        v = float(y.constant)
        if v == 2.0:
            return b.fmul(x, x)
        if v == 1.0:
            return x
        if v == 0.5:  # C's pow, not sqrt, at the edges (as ONNX Runtime): (-0) ** 0.5 is +0, (-inf) ** 0.5 +inf
            root = call_intrinsic(b, "llvm.sqrt", x)
            root = b.select(b.fcmp_ordered("==", x, fconst(x, 0.0)), fconst(x, 0.0), root)
            return b.select(b.fcmp_ordered("==", x, fconst(x, float("-inf"))), fconst(x, float("inf")), root)
        if v == 3.0:
            return b.fmul(b.fmul(x, x), x)
        if v == -1.0:
            return b.fdiv(fconst(x, 1.0), x)
    if _is_f64(x):
        return libm(b, "pow", x, y, f32=pow_)
    ax = call_intrinsic(b, "llvm.fabs", x)
    mag = exp(b, b.fmul(y, log(b, ax)))
    is_int = b.fcmp_ordered("==", call_intrinsic(b, "llvm.rint", y), y)
    half = b.fmul(y, fconst(x, 0.5))
    odd = b.and_(is_int, b.fcmp_unordered("!=", call_intrinsic(b, "llvm.rint", half), half))
    minus_inf = b.fcmp_ordered("==", x, fconst(x, float("-inf")))
    neg_val = b.select(is_int, b.select(odd, b.fneg(mag), mag), b.select(minus_inf, mag, fconst(x, float("nan"))))
    res = b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), neg_val, mag)
    res = b.select(b.and_(odd, b.fcmp_ordered("==", x, fconst(x, 0.0))), call_intrinsic(b, "llvm.copysign", mag, x),
                   res)  # an odd power keeps zero's sign: (-0) ** -3 is -inf
    # C's pow: 1 ** y == 1 for every y (NaN too), (-1) ** ±inf == 1; y * log|x| is NaN there
    unit = b.or_(b.fcmp_ordered("==", x, fconst(x, 1.0)),
                 b.and_(b.fcmp_ordered("==", x, fconst(x, -1.0)),
                        b.fcmp_ordered("==", call_intrinsic(b, "llvm.fabs", y), fconst(x, float("inf")))))
    return b.select(b.or_(unit, b.fcmp_ordered("==", y, fconst(x, 0.0))), fconst(x, 1.0), res)


# --- activations (Relu's integer forms are in scalar_ops) -----------------------------------------
def relu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), fconst(x, 0.0), x)


def leaky_relu(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, fconst(x, 0.0)), b.fmul(x, fconst(x, alpha)), x)


def silu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fmul(x, sigmoid(b, x))


def hard_sigmoid(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    return clamp(b, fma(b, x, fconst(x, alpha), fconst(x, beta)), 0.0, 1.0)


def hard_swish(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fmul(x, hard_sigmoid(b, x, 1.0 / 6.0, 0.5))


def gelu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + erf(x / sqrt 2))."""
    e = erf(b, b.fmul(x, fconst(x, math.sqrt(0.5))))
    return b.fmul(b.fmul(x, fconst(x, 0.5)), b.fadd(e, fconst(x, 1.0)))


def gelu_tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))."""
    inner = b.fmul(fma(b, b.fmul(x, x), fconst(x, 0.044715), fconst(x, 1.0)), x)
    th = tanh(b, b.fmul(inner, fconst(x, math.sqrt(2 / math.pi))))
    return b.fmul(b.fmul(x, fconst(x, 0.5)), b.fadd(th, fconst(x, 1.0)))
