"""Fused activations: the ``activation`` of FusedConv / FusedGemm, emitted by its op's element emitter.

``ops.fused.ACTIVATIONS`` says which elementwise op (and attributes, from ``act_alpha``/``act_beta``)
each activation name is; the code is that op's entry in ``scalar_ops.ELEMENT_EMITTERS``, so a fused
activation and the standalone op compute alike. ``x`` may be a float or a vector of floats: the f32
math is polynomial / select only (``mathfns``: no libm calls), so it stays in vector registers on
every target. The GEMM/Conv micro-kernels apply it in registers (``cpu/gemm.py``, ``cpu/conv/rows.py``,
``cpu/conv/winograd.py``), the generic fused kernels per element (``cpu/kernels/epilogue.py``), the GPU kernels per
thread (``nvptx/common.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llvmlite import ir

from ..ir.dtypes import DType
from ..ops import get_op
from ..ops.fused import ACTIVATIONS
from .scalar_ops import scalar_fn

_FLOAT_DTYPES = {"float": DType.F32, "double": DType.F64, "half": DType.F16}

Activation = Callable[[ir.IRBuilder, ir.Value], ir.Value]


def activation(name: str, alpha: float, beta: float, dtype: DType) -> Activation:
    """``fn(builder, x)`` applying the activation ``name`` (``"none"``: x itself) to ``dtype`` values."""
    if name == "none":
        return lambda b, x: x
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r} (known: none, {', '.join(ACTIVATIONS)})")
    act = ACTIVATIONS[name]
    fn = scalar_fn(act.op, get_op(act.op).normalize_attrs(act.op_attrs(alpha, beta)), dtype)
    return lambda b, x: fn(b, [x])


def fused_activation(attrs: Mapping, dtype: DType) -> Activation:
    """The activation of a FusedConv / FusedGemm node's attributes."""
    return activation(attrs.get("activation", "none"), attrs.get("act_alpha", 0.0), attrs.get("act_beta", 0.0), dtype)


def apply_activation(b: ir.IRBuilder, x: ir.Value, name: str, alpha: float = 0.0, beta: float = 0.0) -> ir.Value:
    """The activation ``name`` of a float or float vector ``x``."""
    element = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    return activation(name, alpha, beta, _FLOAT_DTYPES[str(element)])(b, x)
