"""Activation epilogues for GEMM / Conv accumulators, applied in registers before the store.

A table of small emitters ``fn(builder, x, alpha, beta) -> value`` keyed by the fused-op activation
names of ``compiler/ops/fused.py`` (``"none"``, ``"Relu"``, ``"Clip"`` (alpha=min, beta=max),
``"LeakyRelu"`` (alpha), ``"Sigmoid"``, ``"Tanh"``, ``"SiLU"``, ``"HardSwish"``, ``"HardSigmoid"``
(alpha, beta), ``"Gelu"`` (erf form), ``"GeluTanh"``). ``x`` may be a float or a vector of floats:
the math is polynomial / select only (no libm calls), so it stays in vector registers on every
target. Accuracy is a few ulp (Cephes expf, Eigen tanh/erf rationals), well inside rtol 1e-4.
Add an activation by adding one entry to :data:`ACTIVATION_EMITTERS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)


def _suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    return {"float": "f32", "double": "f64", "i32": "i32"}[str(t)]


def intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """Call the overloaded same-type intrinsic ``name`` (``llvm.fma``...) on scalars or vectors."""
    t = args[0].type
    full = f"{name}.{_suffix(t)}"
    m = b.module
    fn = m.globals.get(full) or ir.Function(m, ir.FunctionType(t, [a.type for a in args]), full)
    return b.call(fn, list(args))


def splat(t: ir.Type, v: float | int) -> ir.Constant:
    """Constant ``v`` of type ``t`` (every lane when ``t`` is a vector)."""
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [splat(t.element, v)] * t.count)
    return ir.Constant(t, float(v) if isinstance(t, (ir.FloatType, ir.DoubleType)) else int(v))


def _int_type(t: ir.Type) -> ir.Type:
    return ir.VectorType(I32, t.count) if isinstance(t, ir.VectorType) else I32


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    return intrinsic(b, "llvm.fma", x, y, z)


def horner(b: ir.IRBuilder, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
    acc = splat(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = fma(b, acc, x, splat(x.type, c))
    return acc


def clamp(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """NaN passes through (it compares false), as np.clip does."""
    x = b.select(b.fcmp_ordered("<", x, splat(x.type, lo)), splat(x.type, lo), x)
    return b.select(b.fcmp_ordered(">", x, splat(x.type, hi)), splat(x.type, hi), x)


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Cephes expf: 2^n * p(r), n = rint(x*log2 e); 0 below -87.3, inf above 88.4."""
    t = x.type
    lo, hi = -87.3365447504019, 88.3762626647949
    xc = clamp(b, x, lo, hi)
    fx = intrinsic(b, "llvm.rint", b.fmul(xc, splat(t, 1.44269504088896341)))
    r = fma(b, fx, splat(t, -0.693359375), xc)
    r = fma(b, fx, splat(t, 2.12194440e-4), r)
    p = horner(b, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1])
    y = b.fadd(fma(b, p, b.fmul(r, r), r), splat(t, 1.0))
    it = _int_type(t)
    n = b.fptosi(fx, it)
    scale = b.bitcast(b.shl(b.add(n, splat(it, 127)), splat(it, 23)), t)
    res = b.fmul(y, scale)
    res = b.select(b.fcmp_ordered("<", x, splat(t, lo)), splat(t, 0.0), res)
    return b.select(b.fcmp_ordered(">", x, splat(t, hi)), splat(t, math.inf), res)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Eigen's rational tanh on [-7.9, 7.9]; x itself for |x| < 4e-4."""
    t = x.type
    xc = clamp(b, x, -7.90531110763549805, 7.90531110763549805)
    x2 = b.fmul(xc, xc)
    p = b.fmul(horner(b, x2, [-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                              5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                              4.89352455891786e-03]), xc)
    q = horner(b, x2, [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03])
    tiny = b.fcmp_ordered("<", intrinsic(b, "llvm.fabs", x), splat(t, 0.0004))
    return b.select(tiny, x, b.fdiv(p, q))


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Eigen's float erf rational on [-4, 4] (|erf| rounds to 1 outside)."""
    xc = clamp(b, x, -4.0, 4.0)
    x2 = b.fmul(xc, xc)
    p = b.fmul(horner(b, x2, [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                              -1.60960333262415e-02]), xc)
    q = horner(b, x2, [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                       -7.37332916720468e-03, -1.42647390514189e-02])
    return b.fdiv(p, q)


def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    one = splat(x.type, 1.0)
    return b.fdiv(one, b.fadd(one, exp(b, b.fneg(x))))


def relu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, splat(x.type, 0.0)), splat(x.type, 0.0), x)


def leaky_relu(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, splat(x.type, 0.0)), b.fmul(x, splat(x.type, alpha)), x)


def gelu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + erf(x / sqrt 2))."""
    e = erf(b, b.fmul(x, splat(x.type, math.sqrt(0.5))))
    return b.fmul(b.fmul(x, splat(x.type, 0.5)), b.fadd(splat(x.type, 1.0), e))


def gelu_tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    inner = fma(b, b.fmul(b.fmul(x, x), x), splat(x.type, 0.044715), x)
    th = tanh(b, b.fmul(inner, splat(x.type, math.sqrt(2 / math.pi))))
    return b.fmul(b.fmul(x, splat(x.type, 0.5)), b.fadd(splat(x.type, 1.0), th))


def hard_sigmoid(b: ir.IRBuilder, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    return clamp(b, fma(b, x, splat(x.type, alpha), splat(x.type, beta)), 0.0, 1.0)


ActEmitter = Callable[[ir.IRBuilder, ir.Value, float, float], ir.Value]

ACTIVATION_EMITTERS: dict[str, ActEmitter] = {
    "none": lambda b, x, a, c: x,
    "Relu": lambda b, x, a, c: relu(b, x),
    "Clip": lambda b, x, a, c: clamp(b, x, a, c),
    "LeakyRelu": lambda b, x, a, c: leaky_relu(b, x, a),
    "Sigmoid": lambda b, x, a, c: sigmoid(b, x),
    "Tanh": lambda b, x, a, c: tanh(b, x),
    "SiLU": lambda b, x, a, c: b.fmul(x, sigmoid(b, x)),
    "HardSwish": lambda b, x, a, c: b.fmul(x, hard_sigmoid(b, x, 1 / 6, 0.5)),
    "HardSigmoid": lambda b, x, a, c: hard_sigmoid(b, x, a, c),
    "Gelu": lambda b, x, a, c: gelu(b, x),
    "GeluTanh": lambda b, x, a, c: gelu_tanh(b, x),
}


def apply_activation(b: ir.IRBuilder, x: ir.Value, name: str, alpha: float = 0.0, beta: float = 0.0) -> ir.Value:
    try:
        fn = ACTIVATION_EMITTERS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r} (known: {', '.join(ACTIVATION_EMITTERS)})") from None
    return fn(b, x, alpha, beta)
