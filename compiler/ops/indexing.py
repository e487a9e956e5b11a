"""Op family: indexing — Trilu, GatherElements, CumSum, CumProd: ops whose output element reads input elements
found from its own position (see docs/ir.md). Each imports from ONNX with its constant inputs as
attributes."""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import norm_axis
from .registry import AttrKind, AttrSpec, OpDef, no_flops, register, require

I = AttrKind.INT
INDICES = (DType.I32, DType.I64)


def _trilu_infer(ts, a):
    require(ts[0].rank >= 2, f"Trilu: X {ts[0]} needs rank >= 2")
    require(a["upper"] in (0, 1), f"Trilu: upper must be 0 or 1, got {a['upper']}")
    return [ts[0]]


def _trilu(xs, a):
    x = xs[0]
    return [(np.triu if a["upper"] else np.tril)(x, a["k"]).astype(x.dtype)]


def _gather_elements_infer(ts, a):
    data, idx = ts
    require(idx.dtype in INDICES, f"GatherElements: indices must be i32 or i64, got {idx.dtype.value}")
    require(data.rank == idx.rank and data.rank >= 1, f"GatherElements: data {data} and indices {idx} need one rank >= 1")
    axis = norm_axis("GatherElements", a["axis"], data.rank)
    require(all(i <= d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != axis),
            f"GatherElements: indices {idx} larger than data {data} off the axis")
    return [TensorType(data.dtype, idx.shape)]


def _gather_elements(xs, a):
    data, idx = xs
    axis = norm_axis("GatherElements", a["axis"], data.ndim)
    n = data.shape[axis]
    require(bool(np.all((idx >= -n) & (idx < n))), f"GatherElements: an index is outside [-{n}, {n})")
    # indices may be smaller than data off the axis (ONNX); take_along_axis would broadcast them instead
    data = data[tuple(slice(None) if k == axis else slice(0, m) for k, m in enumerate(idx.shape))]
    return [np.take_along_axis(data, np.where(idx < 0, idx + n, idx).astype(np.int64), axis=axis)]


def _scan_infer(op: str):
    def infer(ts, a):
        x = ts[0]
        require(x.dtype not in (DType.BOOL,), f"{op}: bool operands are not supported")
        require(a["exclusive"] in (0, 1) and a["reverse"] in (0, 1), f"{op}: exclusive and reverse are 0 or 1")
        norm_axis(op, a["axis"], max(x.rank, 1))
        return [x]

    return infer


def _scan(op: str, fn, identity: int):
    """CumSum / CumProd: floats accumulate in f64, ints in i64, rounded once to the input dtype."""

    def ref(xs, a):
        x = xs[0]
        axis = norm_axis(op, a["axis"], x.ndim)
        y = np.flip(x, axis) if a["reverse"] else x
        if a["exclusive"]:  # the elements before: the identity shifted in, nothing undone (inf - inf is NaN)
            widths = [(1, 0) if k == axis else (0, 0) for k in range(y.ndim)]
            y = np.pad(y, widths, constant_values=identity)
            y = y[tuple(slice(0, -1) if k == axis else slice(None) for k in range(y.ndim))]
        acc = fn(y.astype(np.float64 if x.dtype.kind == "f" else np.int64), axis=axis)
        return [(np.flip(acc, axis) if a["reverse"] else acc).astype(x.dtype)]

    return ref


_SCAN_ATTRS = {"axis": AttrSpec(I), "exclusive": AttrSpec(I, 0), "reverse": AttrSpec(I, 0)}


register(
    OpDef("Trilu", _trilu_infer, _trilu, attrs={"upper": AttrSpec(I, 1), "k": AttrSpec(I, 0)}, flops=no_flops,
          doc="the upper (or lower) triangle of the last two dims from diagonal k; the rest 0"),
    OpDef("GatherElements", _gather_elements_infer, _gather_elements, attrs={"axis": AttrSpec(I, 0)},
          min_inputs=2, max_inputs=2, flops=no_flops, same_as_onnx=True, run_time_check=True),
    OpDef("CumSum", _scan_infer("CumSum"), _scan("CumSum", np.cumsum, 0), attrs=_SCAN_ATTRS),
    OpDef("CumProd", _scan_infer("CumProd"), _scan("CumProd", np.cumprod, 1), attrs=_SCAN_ATTRS),
)
