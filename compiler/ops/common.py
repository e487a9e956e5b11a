"""Helpers shared by the op families: broadcasting, axis normalisation, rule builders."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .registry import Attrs, FlopRule, OpDef, per_output_element, require


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        require(len(dims) <= 1, f"{op}: shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def norm_axis(op: str, axis: int, rank: int) -> int:
    require(-rank <= axis < rank, f"{op}: axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def same_dtype(op: str, types: Sequence[TensorType]) -> DType:
    dtypes = {t.dtype for t in types}
    require(len(dtypes) == 1, f"{op}: operands have mixed dtypes {sorted(d.value for d in dtypes)}")
    return dtypes.pop()


def per_input_element(a: Attrs, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> int:
    """FLOP rule of a reduction: one operation per element of input 0."""
    return math.prod(ins[0].shape)


def times_output(k: int) -> FlopRule:
    """FLOP rule: ``k`` operations per output element."""
    return lambda a, ins, outs: k * per_output_element(a, ins, outs)


def unary(name: str, fn: Callable[[np.ndarray, Attrs], np.ndarray], attrs=None, floats: bool = True, doc: str = "",
          **traits: Any) -> OpDef:
    """An elementwise op of one operand whose output type equals its input type (fusable unless a view)."""

    def infer(ts: Sequence[TensorType], a: Attrs):
        return [ts[0]]

    def ref(xs: Sequence[np.ndarray], a: Attrs):
        return [np.asarray(fn(xs[0], a), dtype=xs[0].dtype)]

    traits = {"elementwise": True, "fusable": not traits.get("view", False), **traits}
    return OpDef(name, infer, ref, attrs=attrs or {}, doc=doc, float_only=floats, **traits)


def binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], result: DType | None = None,
           variadic: bool = False, doc: str = "", **traits: Any) -> OpDef:
    """A broadcasting elementwise op of two (or, variadic, one or more) operands of one dtype."""

    def infer(ts: Sequence[TensorType], a: Attrs):
        dtype = same_dtype(name, ts)
        shape = broadcast_shapes(name, *(t.shape for t in ts))
        return [TensorType(result or dtype, shape)]

    def ref(xs: Sequence[np.ndarray], a: Attrs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        if len(xs) == 1:
            out = out.copy()
        dtype = result.numpy if result else xs[0].dtype
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        return [np.broadcast_to(np.asarray(out, dtype=dtype), shape).copy()]

    return OpDef(name, infer, ref, min_inputs=1 if variadic else 2, max_inputs=None if variadic else 2, doc=doc,
                 elementwise=True, **traits)
