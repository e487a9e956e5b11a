"""Op family: reduce — ReduceMean, ReduceSum, ReduceMax (see docs/ir.md).

``axes`` is a static attribute (ONNX passes it as an input from opset 18); empty means every axis,
negative axes count from the end. Float sums and means accumulate in float64; integer sums in int64,
wrapped back to the input width as a native kernel of that width would.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import norm_axis, per_input_element
from .registry import AttrKind, AttrSpec, OpDef, register, require

FLOATS = frozenset({DType.F16, DType.F32, DType.F64})
WIDE_INTS = frozenset({DType.I32, DType.U32, DType.I64, DType.U64})  # ONNX's sums and products
INTS = frozenset(d for d in DType if not d.is_float and d is not DType.BOOL)


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else False if dtype.kind == "b" else np.iinfo(dtype).min


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return x.astype(np.float64 if x.dtype.kind == "f" else np.int64).sum(axis=axes, keepdims=True)


def _mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod([x.shape[i] for i in axes]))
    with np.errstate(invalid="ignore"):  # an empty reduction is NaN, as in ONNX Runtime
        return _sum(x, axes) / count


def _highest(dtype: np.dtype):
    return np.inf if dtype.kind == "f" else True if dtype.kind == "b" else np.iinfo(dtype).max


def _min(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Exact in the input dtype; an empty reduction gives inf (ints: the dtype's maximum), as ONNX."""
    return x.min(axis=axes, keepdims=True, initial=_highest(x.dtype))


def _prod(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return x.astype(np.float64 if x.dtype.kind == "f" else np.int64).prod(axis=axes, keepdims=True)


def _max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Exact in the input dtype; an empty reduction gives -inf (ints: the dtype's minimum), as ONNX."""
    return x.max(axis=axes, keepdims=True, initial=_lowest(x.dtype))


@dataclass(frozen=True)
class Reduction:
    name: str
    fn: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
    dtypes: frozenset[DType]


REDUCTIONS = (
    Reduction("ReduceMean", _mean, FLOATS),
    Reduction("ReduceSum", _sum, FLOATS | WIDE_INTS),
    Reduction("ReduceMax", _max, FLOATS | INTS | {DType.BOOL}),
    Reduction("ReduceMin", _min, FLOATS | INTS | {DType.BOOL}),
    Reduction("ReduceProd", _prod, FLOATS | WIDE_INTS),
)


def _axes(op: str, axes: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """Normalised, sorted axes; empty means all of them."""
    norm = tuple(sorted(norm_axis(op, ax, rank) for ax in axes)) if axes else tuple(range(rank))
    require(len(set(norm)) == len(norm), f"{op}: axes {list(axes)} repeat an axis")
    return norm


_ATTRS = {"axes": AttrSpec(AttrKind.INTS, ()), "keepdims": AttrSpec(AttrKind.INT, 1)}


def _reduction(r: Reduction) -> OpDef:
    def infer(ts, a):
        x = ts[0]
        require(x.dtype in r.dtypes, f"{r.name}: dtype {x.dtype.value} not supported")
        require(a["keepdims"] in (0, 1), f"{r.name}: keepdims must be 0 or 1, got {a['keepdims']}")
        axes = _axes(r.name, a["axes"], x.rank)
        kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
        shape = kept if a["keepdims"] else [d for i, d in enumerate(x.shape) if i not in axes]
        return [TensorType(x.dtype, tuple(shape))]

    def ref(xs, a):
        x = xs[0]
        axes = _axes(r.name, a["axes"], x.ndim)
        y = r.fn(x, axes)
        if not a["keepdims"]:
            y = y.reshape([d for i, d in enumerate(x.shape) if i not in axes])
        return [np.asarray(y).astype(x.dtype)]

    return OpDef(r.name, infer, ref, attrs=_ATTRS, float_only=r.dtypes <= FLOATS, flops=per_input_element)


register(*(_reduction(r) for r in REDUCTIONS))


def _arg_infer(op: str):
    def infer(ts, a):
        x = ts[0]
        require(x.dtype is not DType.BOOL, f"{op}: bool operands are not supported")
        axis = norm_axis(op, a["axis"], x.rank)
        require(x.shape[axis] > 0, f"{op}: axis {axis} of {x} is empty")
        require(a["keepdims"] in (0, 1) and a["select_last_index"] in (0, 1), f"{op}: keepdims and select_last_index are 0 or 1")
        shape = [1 if i == axis else d for i, d in enumerate(x.shape)] if a["keepdims"] else \
            [d for i, d in enumerate(x.shape) if i != axis]
        return [TensorType(DType.I64, tuple(shape))]

    return infer


def _arg(fn):
    """The first (select_last_index: the last) position of the extreme value along the axis."""

    def ref(xs, a):
        x = xs[0]
        axis = norm_axis("ArgMax", a["axis"], x.ndim)
        if a["select_last_index"]:
            i = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            i = fn(x, axis=axis)
        return [np.asarray(np.expand_dims(i, axis) if a["keepdims"] else i, dtype=np.int64)]

    return ref


_ARG_ATTRS = {"axis": AttrSpec(AttrKind.INT, 0), "keepdims": AttrSpec(AttrKind.INT, 1),
              "select_last_index": AttrSpec(AttrKind.INT, 0)}
register(
    OpDef("ArgMax", _arg_infer("ArgMax"), _arg(np.argmax), attrs=_ARG_ATTRS, flops=per_input_element, same_as_onnx=True),
    OpDef("ArgMin", _arg_infer("ArgMin"), _arg(np.argmin), attrs=_ARG_ATTRS, flops=per_input_element, same_as_onnx=True),
)


def _top_k_infer(ts, a):
    x = ts[0]
    require(x.dtype is not DType.BOOL, "TopKIndices: bool operands are not supported")
    axis = norm_axis("TopKIndices", a["axis"], x.rank)
    require(isinstance(x.shape[axis], int) and 0 <= a["k"] <= x.shape[axis],
            f"TopKIndices: k={a['k']} outside [0, {x.shape[axis]}] along axis {axis} of {x}")
    require(a["largest"] in (0, 1), "TopKIndices: largest is 0 or 1")
    return [TensorType(DType.I64, tuple(a["k"] if i == axis else d for i, d in enumerate(x.shape)))]


def _top_k(xs, a):
    """Stable: equal values keep index order; NaN ranks above every number (first when largest, last
    otherwise), as NumPy sorts and ONNX Runtime selects. ``~x`` orders integers descending without the
    overflow of ``-x`` at the type's minimum."""
    x = xs[0]
    axis = norm_axis("TopKIndices", a["axis"], x.ndim)
    line = np.moveaxis(x, axis, -1)
    if x.dtype.kind == "f":
        nan = np.isnan(line)
        value = np.where(nan, 0, line)
        keys = (-value, ~nan) if a["largest"] else (value, nan)
    else:
        keys = (~line if a["largest"] else line,)
    order = np.lexsort(keys, axis=-1)[..., :a["k"]]
    return [np.ascontiguousarray(np.moveaxis(order, -1, axis)).astype(np.int64)]


def _top_k_flops(a, ins, outs) -> int:
    return math.prod(ins[0].shape) * max(a["k"], 1)


_TOP_K_ATTRS = {"axis": AttrSpec(AttrKind.INT, -1), "k": AttrSpec(AttrKind.INT), "largest": AttrSpec(AttrKind.INT, 1)}
register(OpDef("TopKIndices", _top_k_infer, _top_k, attrs=_TOP_K_ATTRS,
               flops=_top_k_flops,
               doc="X -> i64: the indices of the k largest (smallest) elements along the axis, best first; equal "
                   "values in index order, NaN above every number (ONNX TopK's Indices; its Values are a "
                   "GatherElements of them)"))
