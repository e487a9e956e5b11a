"""Elementwise math beyond the activations: rounding, Sign, trigonometric and hyperbolic functions,
Mod and Mean (see docs/ir.md).

References compute in float64 where the op is inexact and cast back, as the rest of the table does.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.dtypes import DType
from .common import binary, unary
from .registry import AttrKind, AttrSpec, OpDef, register, require

ONNX = {"same_as_onnx": True}


def _f64(fn):
    return lambda x, a: fn(x.astype(np.float64))


_FLOAT_UNARY = {
    "Floor": np.floor, "Ceil": np.ceil, "Round": np.rint,  # rint: halves to even, as ONNX's Round
    "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan,
    "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh,
}


def _mod(x: np.ndarray, y: np.ndarray, fmod: int) -> np.ndarray:
    """fmod=1: the sign of the dividend (C fmod); fmod=0: the sign of the divisor (Python's %).
    An integer divisor of 0 gives 0 (ONNX leaves it undefined; NumPy warns and gives 0 too)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(x, y) if fmod else np.mod(x, y)


def _mod_infer(ts, a):
    require(a["fmod"] in (0, 1), f"Mod: fmod must be 0 or 1, got {a['fmod']}")
    require(ts[0].dtype is not DType.BOOL, "Mod: bool operands are not supported")
    return _MOD_SHAPE(ts, a)


def _mod_ref(xs, a):
    x, y = np.broadcast_arrays(xs[0], xs[1])
    return [np.asarray(_mod(x, y, a["fmod"]), dtype=xs[0].dtype).copy()]


def _mean_ref(xs, a):
    total = sum(x.astype(np.float64) for x in xs)
    return [np.asarray(total / len(xs), dtype=xs[0].dtype)]


def _sign_infer(ts, a):
    require(ts[0].dtype is not DType.BOOL, "Sign: bool operands are not supported")
    return [ts[0]]


_MOD_SHAPE = binary("Mod", np.fmod).shape_rule
_MEAN = binary("Mean", np.add, variadic=True, fusable=True, **ONNX)

register(
    *(unary(name, _f64(fn), fusable=True, **ONNX) for name, fn in _FLOAT_UNARY.items()),
    dataclasses.replace(unary("Sign", lambda x, a: np.sign(x), floats=False, **ONNX), shape_rule=_sign_infer),
    OpDef("Mod", _mod_infer, _mod_ref, attrs={"fmod": AttrSpec(AttrKind.INT, 0)}, min_inputs=2, max_inputs=2,
          elementwise=True, **ONNX),
    dataclasses.replace(_MEAN, reference=_mean_ref, float_only=True),
)
