"""Activation emitters: the one table behind FusedGemm / FusedConv epilogues and elementwise ops.

A table of small emitters ``fn(builder, x, alpha, beta) -> value`` keyed by the fused-op activation
names of ``compiler/ops/fused.py`` (``"none"``, ``"Relu"``, ``"Clip"`` (alpha=min, beta=max),
``"LeakyRelu"`` (alpha), ``"Sigmoid"``, ``"Tanh"``, ``"SiLU"``, ``"HardSwish"``, ``"HardSigmoid"``
(alpha, beta), ``"Gelu"`` (erf form), ``"GeluTanh"``). ``x`` may be a float or a vector of floats:
the f32 math is polynomial / select only (``mathfns``: no libm calls), so it stays in vector
registers on every target. Accuracy is a few ulp (Cephes expf, Eigen tanh/erf rationals), well
inside rtol 1e-4. The GEMM/Conv micro-kernels apply it in registers (``gemm.py``), the generic fused
kernels per element (``kernels/epilogue.py``); the elementwise op table
(``kernels/elementwise.py``) reuses the same emitters. Add an activation by adding one entry to
:data:`ACTIVATION_EMITTERS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llvmlite import ir

from .mathfns import clamp, erf, fconst, fma, sigmoid, tanh


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


ActEmitter = Callable[[ir.IRBuilder, ir.Value, float, float], ir.Value]

ACTIVATION_EMITTERS: dict[str, ActEmitter] = {
    "none": lambda b, x, a, c: x,
    "Relu": lambda b, x, a, c: relu(b, x),
    "Clip": lambda b, x, a, c: clamp(b, x, a, c),
    "LeakyRelu": lambda b, x, a, c: leaky_relu(b, x, a),
    "Sigmoid": lambda b, x, a, c: sigmoid(b, x),
    "Tanh": lambda b, x, a, c: tanh(b, x),
    "SiLU": lambda b, x, a, c: silu(b, x),
    "HardSwish": lambda b, x, a, c: hard_swish(b, x),
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
