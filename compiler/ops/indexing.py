"""Op family: indexing — Trilu, GatherElements, CumSum, CumProd, GatherND, ScatterElements, ScatterND:
ops whose output element reads input elements found from its own position (see docs/ir.md). Each
imports from ONNX with its constant inputs as attributes."""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import norm_axis
from .registry import AttrKind, AttrSpec, OpDef, no_flops, register, require

I, S = AttrKind.INT, AttrKind.STRING
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


# --- ScatterElements, ScatterND --------------------------------------------------------------------
REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_check(op: str, data: TensorType, idx: TensorType, upd: TensorType, a) -> None:
    require(idx.dtype in INDICES, f"{op}: indices must be i32 or i64, got {idx.dtype.value}")
    require(upd.dtype == data.dtype, f"{op}: updates ({upd.dtype.value}) must have data's dtype ({data.dtype.value})")
    require(a["reduction"] in REDUCTIONS, f"{op}: reduction must be one of {', '.join(REDUCTIONS)}, got {a['reduction']!r}")
    require(a["reduction"] == "none" or data.dtype is not DType.BOOL, f"{op}: bool data takes no reduction")
    require(math.prod(data.shape) > 0 or math.prod(idx.shape) == 0,  # no element would check its indices
            f"{op}: data {data} has no elements to scatter indices {idx} into")


def _scatter_elements_infer(ts, a):
    data, idx, upd = ts
    _scatter_check("ScatterElements", data, idx, upd, a)
    require(data.rank >= 1 and idx.rank == data.rank and upd.shape == idx.shape,
            f"ScatterElements: data {data}, indices {idx} and updates {upd} need one rank, indices' shape updates'")
    axis = norm_axis("ScatterElements", a["axis"], data.rank)
    require(all(i <= d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != axis),
            f"ScatterElements: indices {idx} larger than data {data} off the axis")
    return [data]


def _apply(out: np.ndarray, where: tuple, upd: np.ndarray, reduction: str) -> None:
    """Updates applied in order, as ONNX's reference does (a repeated index: the last wins, or all
    reduce)."""
    if REDUCTIONS[reduction] is None:
        for k in range(upd.shape[0]):
            out[tuple(w[k] for w in where)] = upd[k]
    else:
        REDUCTIONS[reduction].at(out, where, upd)


def _in_range(op: str, idx: np.ndarray, n) -> np.ndarray:
    require(bool(np.all((idx >= -n) & (idx < n))), f"{op}: an index is outside the axis it selects")
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


def _scatter_elements(xs, a):
    data, idx, upd = xs
    axis = norm_axis("ScatterElements", a["axis"], data.ndim)
    idx = _in_range("ScatterElements", idx, data.shape[axis])
    where = [np.broadcast_to(np.arange(m).reshape([-1 if d == k else 1 for d in range(idx.ndim)]), idx.shape)
             for k, m in enumerate(idx.shape)]
    where[axis] = idx
    out = data.copy()
    _apply(out, tuple(w.reshape(-1) for w in where), upd.reshape(-1), a["reduction"])
    return [out]


def _scatter_nd_infer(ts, a):
    data, idx, upd = ts
    _scatter_check("ScatterND", data, idx, upd, a)
    k = idx.shape[-1] if idx.rank else 0
    require(idx.rank >= 1 and 1 <= k <= data.rank and upd.shape == idx.shape[:-1] + data.shape[k:],
            f"ScatterND: updates {upd} must be indices {idx} without its last axis, then data {data} from axis {k}")
    return [data]


def _scatter_nd(xs, a):
    data, idx, upd = xs
    k = idx.shape[-1]
    idx = _in_range("ScatterND", idx.reshape(-1, k), np.array(data.shape[:k]))
    out = data.copy()
    _apply(out, tuple(idx.T), upd.reshape((-1,) + data.shape[k:]), a["reduction"])
    return [out]


# --- GatherND --------------------------------------------------------------------------------------
def _gather_nd_infer(ts, a):
    data, idx = ts
    b = a["batch_dims"]
    require(idx.dtype in INDICES, f"GatherND: indices must be i32 or i64, got {idx.dtype.value}")
    k = idx.shape[-1] if idx.rank else 0
    require(idx.rank >= 1 and 0 <= b < min(data.rank, idx.rank) and 1 <= k <= data.rank - b
            and idx.shape[:b] == data.shape[:b],
            f"GatherND: indices {idx} and data {data} disagree (batch_dims {b}, tuples of {k})")
    require(math.prod(data.shape) > 0 or math.prod(idx.shape) == 0, f"GatherND: data {data} has no elements to index")
    return [TensorType(data.dtype, idx.shape[:-1] + data.shape[b + k:])]


def _gather_nd(xs, a):
    data, idx = xs
    b, k = a["batch_dims"], idx.shape[-1]
    idx = _in_range("GatherND", idx, np.array(data.shape[b:b + k]))
    batch = math.prod(data.shape[:b])
    d = data.reshape((batch,) + data.shape[b:])
    i = idx.reshape(batch, -1, k)
    rows = np.arange(batch)[:, None]
    out = d[(rows, *(i[..., j] for j in range(k)))]
    return [out.reshape(idx.shape[:-1] + data.shape[b + k:])]


register(
    OpDef("Trilu", _trilu_infer, _trilu, attrs={"upper": AttrSpec(I, 1), "k": AttrSpec(I, 0)}, flops=no_flops,
          doc="the upper (or lower) triangle of the last two dims from diagonal k; the rest 0"),
    OpDef("GatherElements", _gather_elements_infer, _gather_elements, attrs={"axis": AttrSpec(I, 0)},
          min_inputs=2, max_inputs=2, flops=no_flops, same_as_onnx=True, run_time_check=True),
    OpDef("CumSum", _scan_infer("CumSum"), _scan("CumSum", np.cumsum, 0), attrs=_SCAN_ATTRS),
    OpDef("CumProd", _scan_infer("CumProd"), _scan("CumProd", np.cumprod, 1), attrs=_SCAN_ATTRS),
    OpDef("ScatterElements", _scatter_elements_infer, _scatter_elements,
          attrs={"axis": AttrSpec(I, 0), "reduction": AttrSpec(S, "none")}, min_inputs=3, max_inputs=3,
          flops=no_flops, same_as_onnx=True, run_time_check=True,
          doc="data with updates[p] put (or reduced) at p with its axis coordinate replaced by indices[p]"),
    OpDef("GatherND", _gather_nd_infer, _gather_nd, attrs={"batch_dims": AttrSpec(I, 0)}, min_inputs=2, max_inputs=2,
          flops=no_flops, same_as_onnx=True, run_time_check=True,
          doc="the slices of data that each index tuple (the last axis of indices) addresses, per batch"),
    OpDef("ScatterND", _scatter_nd_infer, _scatter_nd, attrs={"reduction": AttrSpec(S, "none")},
          min_inputs=3, max_inputs=3, flops=no_flops, same_as_onnx=True, run_time_check=True,
          doc="data with updates[m] put (or reduced) at the slice indices[m] addresses"),
)
