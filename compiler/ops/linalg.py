"""Op family: linalg — Gemm and MatMul (see docs/ir.md).

References compute floats in float64 and cast back; integer MatMul accumulates in int64 and wraps
back to the input width, which is what a native integer kernel of that width computes.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import broadcast_shapes, same_dtype
from .registry import AttrKind, AttrSpec, OpDef, register, require

_MATMUL_DTYPES = {DType.F16, DType.F32, DType.F64, DType.I32, DType.U32, DType.I64, DType.U64}


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype.kind == "f" else np.int64)


def _gemm_infer(ts, a):
    """Y = alpha * A' @ B' + beta * C, with A', B' 2-D and C broadcast one way to (M, N)."""
    ta, tb = ts[0], ts[1]
    same_dtype("Gemm", ts)
    require(a["transA"] in (0, 1) and a["transB"] in (0, 1), "Gemm: transA and transB must be 0 or 1")
    require(ta.rank == 2 and tb.rank == 2, f"Gemm: A {ta} and B {tb} must be 2-D")
    m, ka = ta.shape[::-1] if a["transA"] else ta.shape
    kb, n = tb.shape[::-1] if a["transB"] else tb.shape
    require(ka == kb, f"Gemm: inner dimensions differ: A' is [{m},{ka}], B' is [{kb},{n}]")
    if len(ts) == 3:
        c = ts[2]
        require(c.rank <= 2 and broadcast_shapes("Gemm", (m, n), c.shape) == (m, n),
                f"Gemm: C {c} does not broadcast to [{m},{n}]")
    return [TensorType(ta.dtype, (m, n))]


def _gemm(xs, a):
    a_, b_ = (x.astype(np.float64) for x in xs[:2])
    y = a["alpha"] * ((a_.T if a["transA"] else a_) @ (b_.T if a["transB"] else b_))
    if len(xs) == 3:
        y = y + a["beta"] * xs[2].astype(np.float64)
    return [y.astype(xs[0].dtype)]


def _matmul_infer(ts, a):
    """numpy matmul: a 1-D A is a row, a 1-D B a column (both dropped after); batch dims broadcast."""
    ta, tb = ts
    dtype = same_dtype("MatMul", ts)
    require(dtype in _MATMUL_DTYPES, f"MatMul: dtype {dtype.value} not supported")
    require(ta.rank >= 1 and tb.rank >= 1, f"MatMul: operands must have rank >= 1, got {ta} and {tb}")
    sa = (1,) + tuple(ta.shape) if ta.rank == 1 else tuple(ta.shape)
    sb = tuple(tb.shape) + (1,) if tb.rank == 1 else tuple(tb.shape)
    require(sa[-1] == sb[-2], f"MatMul: inner dimensions differ: A {ta}, B {tb}")
    batch = broadcast_shapes("MatMul", sa[:-2], sb[:-2])
    rows = sa[-2:-1] if ta.rank > 1 else ()
    cols = sb[-1:] if tb.rank > 1 else ()
    return [TensorType(dtype, batch + rows + cols)]


def _matmul(xs, a):
    return [np.matmul(_wide(xs[0]), _wide(xs[1])).astype(xs[0].dtype)]


def gemm_flops(a, ins, outs) -> int:
    """2 * M * N * K: every output element takes K multiply-adds."""
    k = ins[0].shape[0] if a.get("transA", 0) else ins[0].shape[1]
    return 2 * math.prod(outs[0].shape) * k


def _gemm_flops(a, ins, outs) -> int:
    return gemm_flops(a, ins, outs) + (math.prod(outs[0].shape) if len(ins) > 2 else 0)


def _matmul_flops(a, ins, outs) -> int:
    shape = ins[0].shape
    return 2 * math.prod(outs[0].shape) * (shape[-1] if shape else 1)


register(
    OpDef("Gemm", _gemm_infer, _gemm, min_inputs=2, max_inputs=3,
          attrs={"alpha": AttrSpec(AttrKind.FLOAT, 1.0), "beta": AttrSpec(AttrKind.FLOAT, 1.0),
                 "transA": AttrSpec(AttrKind.INT, 0), "transB": AttrSpec(AttrKind.INT, 0)},
          float_only=True, flops=_gemm_flops, same_as_onnx=True),
    OpDef("MatMul", _matmul_infer, _matmul, min_inputs=2, max_inputs=2, flops=_matmul_flops, same_as_onnx=True),
)
